"""A very-small-object variant of the shapes data set: same classes, colours and clutter as ``shapes`` but
160 px images by default, 6-24 px objects and 4-10 of them per image, so most boxes fall in the "very tiny"
(< 8 px) and "tiny" (8-16 px) bands where a stride-4 head should matter. Command line:
data/scripts/make_tiny_shapes.py.
"""

from pathlib import Path

import numpy as np

from utils.dataset.synthetic import shapes
from utils.dataset.synthetic.build import build_yolo_set

IMG_SIZE = 160
MIN_SIDE, MAX_SIDE = 6, 24
OBJECTS_PER_IMAGE = (4, 10)
NAMES = shapes.NAMES
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "tiny-shapes"


def make_tiny_image(rng, size=IMG_SIZE):
    """One image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``.

    Object sides are drawn log-uniformly in [MIN_SIDE, MAX_SIDE] so each size band gets a
    similar share of boxes.
    """
    im = shapes.background(rng, size)
    n_objects = rng.integers(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1] + 1)
    labels = shapes.place_shapes(im, rng, size, n_objects,
                                lambda r: float(np.exp(r.uniform(np.log(MIN_SIDE), np.log(MAX_SIDE)))))
    im += rng.normal(0.0, rng.uniform(4, 12), im.shape).astype(np.float32)
    return np.clip(im, 0, 255).astype(np.uint8), labels


def make_tiny_shapes(root=DEFAULT_ROOT, n_train=128, n_val=64, seed=0, size=IMG_SIZE) -> Path:
    """Generate the data set of ``size``-px images into ``root`` (must not exist or be empty) and write
    ``<root>.yaml``; returns the data YAML path. Built in a temporary sibling folder, then renamed into place."""
    return build_yolo_set(root, NAMES, make_tiny_image, (6,), n_train, n_val, seed, size=size)  # 6: own streams
