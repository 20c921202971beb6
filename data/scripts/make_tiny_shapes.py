"""Generate a very-small-object variant of the shapes data set, offline and deterministic by seed.

Same classes, colours and clutter as ``make_shapes.py`` but smaller images (160 px by default),
smaller objects (6-24 px) and more of them per image (4-10), so most boxes fall in the
"very tiny" (< 8 px) and "tiny" (8-16 px) bands where a stride-4 head should matter.

    python data/scripts/make_tiny_shapes.py --root datasets/tiny-shapes --n-train 128 --n-val 64 --seed 0
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_shapes  # noqa: E402  (sibling generator: backgrounds, colours, shapes)

IMG_SIZE = 160
MIN_SIDE, MAX_SIDE = 6, 24
OBJECTS_PER_IMAGE = (4, 10)
NAMES = make_shapes.NAMES
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "datasets" / "tiny-shapes"


def make_tiny_image(rng, size=IMG_SIZE):
    """One image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``.

    Object sides are drawn log-uniformly in [MIN_SIDE, MAX_SIDE] so each size band gets a
    similar share of boxes.
    """
    im = make_shapes._background(rng, size)
    n_objects = rng.integers(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1] + 1)
    labels = make_shapes.place_shapes(im, rng, size, n_objects,
                                      lambda r: float(np.exp(r.uniform(np.log(MIN_SIDE), np.log(MAX_SIDE)))))
    im += rng.normal(0.0, rng.uniform(4, 12), im.shape).astype(np.float32)
    return np.clip(im, 0, 255).astype(np.uint8), labels


def make_tiny_shapes(root=DEFAULT_ROOT, n_train=128, n_val=64, seed=0, size=IMG_SIZE) -> Path:
    """Generate the data set of ``size``-px images into ``root`` (must not exist or be empty) and write
    ``<root>.yaml``; returns the data YAML path. Built in a temporary sibling folder, then renamed into place."""
    return make_shapes.build_yolo_set(root, NAMES, make_tiny_image, (6,), n_train, n_val, seed, size=size)  # 6: own streams


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    make_shapes.add_split_arguments(parser, DEFAULT_ROOT, 128, 64)
    args = parser.parse_args(argv)
    return make_shapes.build_and_report(lambda: make_tiny_shapes(args.root, args.n_train, args.n_val, args.seed), args)


if __name__ == "__main__":
    sys.exit(main())
