"""Convert an upstream YOLOv5 (v6/v7) or FFCA-YOLO pickled checkpoint into this project's plain checkpoint.

    python convert_checkpoint.py yolov5s.pt converted.pt
    python convert_checkpoint.py authors.pt fixed.pt --fixed-ffm   # then fine-tune: train.py --weights fixed.pt

No code from the source file runs (see utils/foreign_checkpoint.py); the model is rebuilt from the
model YAML stored in it, every tensor must be used, and the result loads with weights_only=True.
FFM layers of a checkpoint trained with FFCA-YOLO's own code keep the authors' FFM arithmetic;
one log line says which arithmetic each FFM layer kept (docs/export.md). ``--fixed-ffm`` writes this
project's FFM arithmetic instead, a starting point for fine-tuning rather than a copy of the authors' model.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from models.yolo import Model  # noqa: E402
from utils.foreign_checkpoint import convert  # noqa: E402
from utils.errors import exit_on_user_error  # noqa: E402
from utils.options import OneLineErrorParser  # noqa: E402
from utils.version import add_version_flag  # noqa: E402


def parse_opt(argv=None):
    parser = OneLineErrorParser(prog="python convert_checkpoint.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", help="upstream YOLOv5 v6/v7 or FFCA-YOLO checkpoint (.pt)")
    parser.add_argument("dst", help="plain checkpoint to write (.pt)")
    parser.add_argument("--fixed-ffm", action="store_true", help="write every FFM layer in this project's fixed "
                                                                  "arithmetic, to fine-tune (docs/export.md)")
    add_version_flag(parser)
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None):
    opt = parse_opt(argv)
    convert(opt.src, opt.dst, Model, fixed_ffm=opt.fixed_ffm)


if __name__ == "__main__":
    main()
