"""Generate the embedded very-tiny benchmark set: dozens of 2-12 px objects on large cluttered images.

The generator is utils/dataset/synthetic/very_tiny.py; this is its command line. Offline and
deterministic by seed; YOLO layout plus ``<root>.yaml``.

    python data/scripts/make_very_tiny.py --root datasets/very-tiny --n-train 64 --n-val 16 --seed 0
    python data/scripts/make_very_tiny.py --root datasets/very-tiny-256 --img-size 256   # the suite's size
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.dataset.synthetic.cli import add_split_arguments, build_and_report  # noqa: E402
from utils.dataset.synthetic.very_tiny import DEFAULT_ROOT, IMG_SIZE, OBJECTS_PER_IMAGE, make_very_tiny  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_arguments(parser, DEFAULT_ROOT, 64, 16)
    parser.add_argument("--img-size", type=int, default=IMG_SIZE, help="image side in pixels (at least 32)")
    parser.add_argument("--objects", type=int, nargs=2, default=OBJECTS_PER_IMAGE, metavar=("MIN", "MAX"),
                        help="objects per image")
    args = parser.parse_args(argv)
    if args.img_size < 32 or not 0 <= args.objects[0] <= args.objects[1]:
        print(f"ERROR: --img-size {args.img_size} / --objects {args.objects}: need img-size >= 32 (room to place "
              "objects) and 0 <= MIN <= MAX", file=sys.stderr)
        return 2
    return build_and_report(lambda: make_very_tiny(args.root, args.n_train, args.n_val, args.seed,
                                                   size=args.img_size, objects=tuple(args.objects)), args)


if __name__ == "__main__":
    sys.exit(main())
