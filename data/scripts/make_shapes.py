"""Generate the embedded synthetic small-object data set ("shapes"), offline and deterministic by seed.

The generator is utils/dataset/synthetic/shapes.py; this is its command line. Layout:
``<root>/images/{train,val}/*.jpg`` and ``<root>/labels/{train,val}/*.txt``.

    python data/scripts/make_shapes.py --root datasets/shapes --n-train 400 --n-val 100 --seed 0

Large images with tiny objects (for sliced inference and sliced training data, docs/small-objects.md):

    python data/scripts/make_shapes.py --root datasets/shapes_large --n-train 24 --n-val 8 \
        --img-size 1024 --min-side 6 --max-side 16 --objects 30 60
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.dataset.synthetic.cli import add_size_arguments, add_split_arguments, build_and_report  # noqa: E402
from utils.dataset.synthetic.shapes import (DEFAULT_ROOT, IMG_SIZE, MAX_SIDE, MIN_SIDE, OBJECTS_PER_IMAGE,  # noqa: E402
                                            make_shapes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_arguments(parser, DEFAULT_ROOT, 400, 100)
    add_size_arguments(parser, IMG_SIZE, MIN_SIDE, MAX_SIDE)
    parser.add_argument("--objects", type=int, nargs=2, default=OBJECTS_PER_IMAGE, metavar=("MIN", "MAX"),
                        help="objects per image")
    args = parser.parse_args(argv)
    if not (0 < args.min_side <= args.max_side < args.img_size / 2 and 0 <= args.objects[0] <= args.objects[1]):
        print(f"ERROR: --min-side {args.min_side} / --max-side {args.max_side} / --objects {args.objects}: need "
              "0 < min-side <= max-side < img-size / 2 and 0 <= MIN <= MAX", file=sys.stderr)
        return 2
    return build_and_report(lambda: make_shapes(args.root, args.n_train, args.n_val, args.seed, size=args.img_size,
                                                sides=(args.min_side, args.max_side), objects=tuple(args.objects)),
                            args, written="to")


if __name__ == "__main__":
    sys.exit(main())
