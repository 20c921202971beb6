"""Generate the embedded "glyphs" small-object data set: textured stroke objects on textured clutter.

The generator is utils/dataset/synthetic/glyphs.py; this is its command line. Offline and
deterministic by seed.

    python data/scripts/make_glyphs.py --root datasets/glyphs --n-train 256 --n-val 64 --img-size 256 \
        --min-side 8 --max-side 20
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.dataset.synthetic.cli import add_size_arguments, add_split_arguments, build_and_report  # noqa: E402
from utils.dataset.synthetic.glyphs import DEFAULT_ROOT, IMG_SIZE, MAX_SIDE, MIN_SIDE, make_glyphs  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_arguments(parser, DEFAULT_ROOT, 256, 64)
    add_size_arguments(parser, IMG_SIZE, MIN_SIDE, MAX_SIDE, "glyph")
    args = parser.parse_args(argv)
    if not 4 <= args.min_side <= args.max_side < args.img_size / 3:
        print(f"ERROR: --min-side {args.min_side} / --max-side {args.max_side}: need 4 <= min-side <= max-side "
              f"< img-size / 3 ({args.img_size / 3:.0f})", file=sys.stderr)
        return 2
    return build_and_report(lambda: make_glyphs(args.root, args.n_train, args.n_val, args.seed, size=args.img_size,
                                                sides=(args.min_side, args.max_side)), args)


if __name__ == "__main__":
    sys.exit(main())
