"""The very-tiny benchmark set: dozens of 2-12 px objects on large cluttered images.

The shapes set's classes and colours at AI-TOD's scale: 512-px images by default, each with 32-64
objects whose box side (sqrt of the box area) lies in 2-12 px, about four in five under 8 px (AI-TOD's
"very tiny" band). Besides the shapes set's gradient, blobs and lines, every image carries unlabelled
grey specks of the objects' own sizes and extra faint lines, in proportion to its area, so that a
detector has to tell objects from clutter by colour and form and not by "anything small". Command
line: data/scripts/make_very_tiny.py.
"""

import math
from pathlib import Path

import cv2
import numpy as np

from utils.dataset.synthetic import shapes
from utils.dataset.synthetic.build import build_yolo_set

IMG_SIZE = 512
# Drawn shape sides (px). A shape's box side sqrt(w * h) is 0.94-1.23x its drawn side (cross at
# 45 degrees, square tilted 15 degrees; see shapes.polygon), so these keep every box in 2-12 px.
MIN_SIDE, MAX_SIDE = 2.2, 9.7
OBJECTS_PER_IMAGE = (32, 64)  # at any image size (fewer when a small image has no room left)
SPECKS_PER_IMAGE = 64  # unlabelled grey clutter at IMG_SIZE; scaled with the image area
NAMES = shapes.NAMES
STREAM = (27,)  # this generator's own random streams (the shapes sets use none, 6 and 7)
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "very-tiny"


def per_area(count: float, size: int) -> int:
    """``count`` per IMG_SIZE-square image rescaled to a ``size``-px square image (at least 1)."""
    return max(1, round(count * (size / IMG_SIZE) ** 2))


def log_side(rng, sides=(MIN_SIDE, MAX_SIDE)) -> float:
    """A side drawn log-uniformly in ``sides``: small objects outnumber larger ones."""
    return float(np.exp(rng.uniform(math.log(sides[0]), math.log(sides[1]))))


def add_clutter(im: np.ndarray, rng, size: int) -> None:
    """Draw unlabelled grey specks (object-sized circles and polygons) and faint lines into ``im`` in place."""
    for _ in range(per_area(SPECKS_PER_IMAGE, size)):
        grey = float(rng.uniform(30, 230))
        cx, cy = rng.uniform(0, size, 2)
        side = log_side(rng, (MIN_SIDE, 12.0))
        shape = int(rng.integers(0, len(NAMES)))
        if shape == 0:
            cv2.circle(im, (int(round(cx * 16)), int(round(cy * 16))), int(round(side * 8)), (grey,) * 3, -1,
                       cv2.LINE_AA, shift=4)
        else:
            pts = shapes.polygon(shape, cx, cy, side, rng.uniform(0, math.pi))
            cv2.fillPoly(im, [np.round(pts * 16).astype(np.int32)], (grey,) * 3, cv2.LINE_AA, shift=4)
    for _ in range(per_area(SPECKS_PER_IMAGE // 3, size)):
        p1 = tuple(int(v) for v in rng.integers(0, size, 2))
        p2 = tuple(int(v) for v in (np.array(p1) + rng.integers(-60, 61, 2)))
        cv2.line(im, p1, p2, tuple(float(v) for v in rng.uniform(60, 200, 3)), 1, cv2.LINE_AA)


def make_very_tiny_image(rng, size=IMG_SIZE, objects=OBJECTS_PER_IMAGE):
    """One image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``.

    ``objects`` (min, max) is the number of objects tried; one that finds no free place in 20 draws
    is left out. Objects never overlap each other (2 px apart at least) and never touch the border,
    so every label is a whole object.
    """
    im = shapes.background(rng, size)
    add_clutter(im, rng, size)
    labels = shapes.place_shapes(im, rng, size, rng.integers(objects[0], objects[1] + 1), log_side)
    im += rng.normal(0.0, rng.uniform(3, 8), im.shape).astype(np.float32)  # milder noise: 2-px objects survive
    return np.clip(im, 0, 255).astype(np.uint8), labels


def make_very_tiny(root=DEFAULT_ROOT, n_train=64, n_val=16, seed=0, **image_options) -> Path:
    """Generate the set into ``root`` (must not exist or be empty) and write ``<root>.yaml``; returns it.

    ``image_options``: ``size``, ``objects`` of :func:`make_very_tiny_image`. Built in a temporary
    sibling folder, then renamed into place.
    """
    return build_yolo_set(root, NAMES, make_very_tiny_image, STREAM, n_train, n_val, seed, **image_options)
