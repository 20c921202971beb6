"""Generate a very-small-object variant of the shapes data set, offline and deterministic by seed.

The generator is utils/dataset/synthetic/tiny_shapes.py (160 px images, 6-24 px objects, 4-10 per
image); this is its command line.

    python data/scripts/make_tiny_shapes.py --root datasets/tiny-shapes --n-train 128 --n-val 64 --seed 0
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.dataset.synthetic.cli import add_split_arguments, build_and_report  # noqa: E402
from utils.dataset.synthetic.tiny_shapes import DEFAULT_ROOT, make_tiny_shapes  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_arguments(parser, DEFAULT_ROOT, 128, 64)
    args = parser.parse_args(argv)
    return build_and_report(lambda: make_tiny_shapes(args.root, args.n_train, args.n_val, args.seed), args)


if __name__ == "__main__":
    sys.exit(main())
