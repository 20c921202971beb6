"""The embedded "shapes" data set: a few small filled shapes (circle, square, triangle, cross; 8-32 px) per
256 x 256 JPEG on a cluttered background (colour gradient, sensor noise, faint lines and grey blobs that are
not objects). Every class has its own hue with random variation in hue, saturation, brightness, size and
rotation. The drawing helpers (``background``, ``polygon``, ``place_shapes``) serve the sibling generators.
Command line: data/scripts/make_shapes.py.
"""

import math
from pathlib import Path

import cv2
import numpy as np

from utils.dataset.synthetic.build import build_atomically, write_split

IMG_SIZE = 256
NAMES = ("circle", "square", "triangle", "cross")
CLASS_HUES = (0, 60, 115, 28)  # OpenCV hue (0-180): red, green, blue, yellow
MIN_SIDE, MAX_SIDE = 8, 32
OBJECTS_PER_IMAGE = (2, 7)
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "shapes"


def background(rng, size):
    """(size, size, 3) float32 BGR: a low-saturation gradient with faint lines and grey blobs."""
    c1, c2 = rng.uniform(40, 200, 3), rng.uniform(40, 200, 3)
    c2 = c1 + (c2 - c1) * 0.6  # keep the two ends of the gradient close in colour
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    t = (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None] + 1.5) / 3.0
    im = (c1.astype(np.float32) * (1 - t[..., None]) + c2.astype(np.float32) * t[..., None])
    for _ in range(rng.integers(3, 9)):  # grey blobs: object-sized clutter with no class colour
        grey = float(rng.uniform(30, 220))
        centre = tuple(int(v) for v in rng.integers(0, size, 2))
        axes = tuple(int(v) for v in rng.integers(4, 40, 2))
        cv2.ellipse(im, centre, axes, float(rng.uniform(0, 180)), 0, 360, (grey, grey, grey), -1, cv2.LINE_AA)
    for _ in range(rng.integers(5, 15)):  # faint thin lines
        p1 = tuple(int(v) for v in rng.integers(0, size, 2))
        p2 = tuple(int(v) for v in rng.integers(0, size, 2))
        shade = tuple(float(v) for v in rng.uniform(60, 200, 3))
        cv2.line(im, p1, p2, shade, int(rng.integers(1, 3)), cv2.LINE_AA)
    return im


def _class_colour(rng, cls):
    """BGR colour for class ``cls``: its hue +-7, saturation and value varied."""
    hsv = np.array([[[(CLASS_HUES[cls] + rng.integers(-7, 8)) % 180,
                      rng.integers(140, 256), rng.integers(150, 256)]]], dtype=np.uint8)
    return tuple(float(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])


def polygon(cls, cx, cy, side, angle):
    """Vertices (k, 2) float of a square/triangle/cross of size ``side`` centred on (cx, cy), rotated."""
    h = side / 2
    if cls == 1:
        pts = np.array([[-h, -h], [h, -h], [h, h], [-h, h]])
    elif cls == 2:
        pts = np.array([[0, -h], [h, h * 0.8], [-h, h * 0.8]])
    else:
        a = h / 3  # arm half-width
        pts = np.array([[-a, -h], [a, -h], [a, -a], [h, -a], [h, a], [a, a], [a, h], [-a, h], [-a, a],
                        [-h, a], [-h, -a], [-a, -a]])
    c, s = math.cos(angle), math.sin(angle)
    return pts @ np.array([[c, s], [-s, c]]) + (cx, cy)


def _draw_object(im, rng, cls, cx, cy, side):
    """Draw one filled object; returns its tight box (x1, y1, x2, y2) in pixels."""
    colour = _class_colour(rng, cls)
    if cls == 0:
        r = side / 2
        cv2.circle(im, (int(round(cx * 16)), int(round(cy * 16))), int(round(r * 16)), colour, -1, cv2.LINE_AA,
                   shift=4)
        return cx - r, cy - r, cx + r, cy + r
    max_tilt = math.pi / 12 if cls == 1 else math.pi  # squares stay near axis-aligned
    pts = polygon(cls, cx, cy, side, rng.uniform(-max_tilt, max_tilt))
    cv2.fillPoly(im, [np.round(pts * 16).astype(np.int32)], colour, cv2.LINE_AA, shift=4)
    return pts[:, 0].min(), pts[:, 1].min(), pts[:, 0].max(), pts[:, 1].max()


def overlaps(box, boxes, margin=3):
    """Whether ``box`` (x1, y1, x2, y2) comes within ``margin`` px of any of ``boxes``."""
    return any(box[0] < b[2] + margin and b[0] < box[2] + margin and box[1] < b[3] + margin and
               b[1] < box[3] + margin for b in boxes)


def place_shapes(im, rng, size, n_objects, sample_side, margin=2) -> np.ndarray:
    """Draw up to ``n_objects`` shapes into ``im`` in place, ``margin`` px apart; ``(n, 5)`` YOLO labels.

    ``sample_side(rng)`` gives each object's side in pixels. An object with no free spot after 20
    tries is left out, so the count can be lower.
    """
    boxes, labels = [], []
    for _ in range(n_objects):
        cls = int(rng.integers(0, len(NAMES)))
        side = sample_side(rng)
        reach = side * 0.75  # room for a rotated shape's corners
        for _attempt in range(20):  # rejection sampling keeps objects apart
            cx, cy = rng.uniform(reach + 1, size - reach - 1, 2)
            if not overlaps((cx - reach, cy - reach, cx + reach, cy + reach), boxes, margin=margin):
                break
        else:
            continue
        x1, y1, x2, y2 = np.clip(_draw_object(im, rng, cls, cx, cy, side), 0, size)
        boxes.append((cx - reach, cy - reach, cx + reach, cy + reach))
        labels.append((cls, (x1 + x2) / 2 / size, (y1 + y2) / 2 / size, (x2 - x1) / size, (y2 - y1) / size))
    return np.array(labels, dtype=np.float64).reshape(-1, 5)


def make_image(rng, size=IMG_SIZE, sides=(MIN_SIDE, MAX_SIDE), objects=OBJECTS_PER_IMAGE):
    """One synthetic image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``.

    ``sides`` (min, max) is the object size range in pixels, ``objects`` (min, max) the count per image.
    """
    im = background(rng, size)
    n_objects = rng.integers(objects[0], objects[1] + 1)
    labels = place_shapes(im, rng, size, n_objects, lambda r: float(r.uniform(sides[0], sides[1])), margin=3)
    im += rng.normal(0.0, rng.uniform(4, 14), im.shape).astype(np.float32)  # sensor noise over everything
    return np.clip(im, 0, 255).astype(np.uint8), np.array(labels, dtype=np.float64).reshape(-1, 5)


def make_shapes(root=DEFAULT_ROOT, n_train=400, n_val=100, seed=0, **image_options) -> Path:
    """Generate the data set into ``root`` (must not exist or be empty); returns ``root``.

    ``image_options``: ``size``, ``sides``, ``objects`` of :func:`make_image` (defaults: the embedded set).
    """
    root = Path(root).resolve()
    build_atomically(root, lambda tmp: (write_split(tmp, "train", n_train, seed, 0, make_image, **image_options),
                                        write_split(tmp, "val", n_val, seed, 1, make_image, **image_options)))
    return root
