"""Training tiles cut on the fly from large images (``train.py --train-tiles N``, data YAML ``train_tiles: N``).

Each time a training image is drawn (as the main image of a sample or as a mosaic partner), an
N x N window of the *original* image is chosen and used in its place; nothing is written to disk.

- **Where.** With probability :data:`OBJECT_BIAS` (and when the image has labels) one labelled box
  is picked at random and the window is drawn uniformly among the positions that contain the whole
  box (a box larger than the window gets the window centred on it); otherwise the window is drawn
  uniformly over the image. Windows never leave the image.
- **Clipped boxes.** A box is kept, clipped to the window, when at least :data:`MIN_VISIBILITY`
  (60 %) of its area lies inside the window, else it is dropped: the rule and value of
  ``data/scripts/slice_dataset.py --min-visibility``.
- **Scale.** Every window is scaled by ``img_size / N`` (1 when N equals ``--imgsz``), so objects have
  one size in training whatever the image size. An image smaller than N along a side is used whole
  along that side, at the same scale, and the mosaic or letterbox pads the rest.
- **Randomness.** All draws come from the ``rng`` the data set seeds per sample from
  ``(seed, epoch, index, draw)``, so tiles do not depend on worker count and a resumed epoch cuts
  the same tiles.
"""

import math

import cv2
import numpy as np

from utils.augmentations import letterbox
from utils.errors import UserError

OBJECT_BIAS = 0.5  # probability that a window is placed around a labelled box rather than anywhere
MIN_VISIBILITY = 0.6  # fraction of a box's area that must lie in the window for the box to be kept


def _start(rng, lo, hi, limit):
    """A random integer window start in ``[lo, hi]`` after both are clamped to ``[0, limit]``."""
    lo, hi = (min(max(v, 0), limit) for v in (lo, hi))
    return int(rng.integers(lo, hi + 1))


def _box_window_start(rng, a, b, side, limit):
    """Start of a ``side``-long window containing the interval [a, b] (centred on it when it is longer)."""
    lo, hi = math.ceil(b - side), math.floor(a)
    if lo > hi:
        lo = hi = round((a + b - side) / 2)
    return _start(rng, lo, hi, limit)


def tile_window(w0, h0, size, boxes, rng, object_bias=OBJECT_BIAS):
    """Choose a window of a w0 x h0 image -> ``(x1, y1, x2, y2)`` ints, at most ``size`` on each side.

    ``boxes`` (n, 4) xyxy pixels of the image. An image that fits in the window costs no draws.
    """
    tw, th = min(size, w0), min(size, h0)
    if (tw, th) == (w0, h0):
        return 0, 0, w0, h0
    if len(boxes) and rng.random() < object_bias:
        x1, y1, x2, y2 = boxes[int(rng.integers(len(boxes)))].tolist()
        x0 = _box_window_start(rng, x1, x2, tw, w0 - tw)
        y0 = _box_window_start(rng, y1, y2, th, h0 - th)
    else:
        x0 = _start(rng, 0, w0 - tw, w0 - tw)
        y0 = _start(rng, 0, h0 - th, h0 - th)
    return x0, y0, x0 + tw, y0 + th


def crop_labels(labels, window, min_visibility=MIN_VISIBILITY):
    """Labels (n, 5) ``[cls, x1, y1, x2, y2]`` in image pixels -> (m, 5) clipped to ``window``, in its pixels.

    A box is kept when at least ``min_visibility`` of its area lies inside the window.
    """
    x1, y1, x2, y2 = window
    clipped = labels.astype(np.float64, copy=True)
    clipped[:, [1, 3]] = clipped[:, [1, 3]].clip(x1, x2)
    clipped[:, [2, 4]] = clipped[:, [2, 4]].clip(y1, y2)
    area = (labels[:, 3] - labels[:, 1]) * (labels[:, 4] - labels[:, 2])
    inside = (clipped[:, 3] - clipped[:, 1]) * (clipped[:, 4] - clipped[:, 2])
    kept = clipped[(area > 0) & (inside >= min_visibility * area - 1e-9)]
    kept[:, [1, 3]] -= x1
    kept[:, [2, 4]] -= y1
    return kept


def sample_tile(im, labels, size, img_size, rng):
    """Cut a random tile of ``im`` for training.

    ``im`` (h0, w0, 3) original image (not modified; the tile is a view of it); ``labels`` (n, 5)
    ``[cls, x1, y1, x2, y2]`` in its pixels. Returns ``(tile (th, tw, 3), (h, w), labels (m, 5))``:
    the tile as cut, the size it is to be shown at (scaled by ``img_size / size``) and its labels
    in pixels of that size, the form the mosaic takes its images in.
    """
    h0, w0 = im.shape[:2]
    x1, y1, x2, y2 = tile_window(w0, h0, size, labels[:, 1:5], rng)
    tile = im[y1:y2, x1:x2]
    r = img_size / size
    h, w = math.ceil((y2 - y1) * r), math.ceil((x2 - x1) * r)
    kept = crop_labels(labels, (x1, y1, x2, y2))
    kept[:, [1, 3]] *= w / (x2 - x1)
    kept[:, [2, 4]] *= h / (y2 - y1)
    return tile, (h, w), kept


def letterbox_tile(tile, shape, labels, img_size):
    """A tile from :func:`sample_tile` resized to ``shape`` (h, w) and padded (never enlarged) to img_size^2.

    Returns ``(image (img_size, img_size, 3), labels (m, 5) xyxy pixels)``; the image may be ``tile`` itself.
    """
    if tile.shape[:2] != tuple(shape):
        tile = cv2.resize(tile, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)
    img, _, (padw, padh) = letterbox(tile, img_size, auto=False, scaleup=False)
    labels = labels.copy()
    labels[:, [1, 3]] += padw
    labels[:, [2, 4]] += padh
    return img, labels


def box_scale(shapes, size):
    """(N, 1) factor from whole-image to tile training scale of each image (None without tiles).

    ``shapes`` (N, 2) ``(w, h)``. AutoAnchor and the NWD constant size boxes as if each image were
    shrunk to ``--imgsz``; tiles of side ``size`` show them ``max(w, h) / size`` times larger.
    """
    if not size:
        return None
    shapes = np.asarray(shapes, dtype=np.float64)
    return shapes.max(1, keepdims=True) / size


def resolve_tile_size(flag, data, stride, resume_ckpt=None, rect=False):
    """The tile side for training: ``--train-tiles`` when given, else ``train_tiles`` of the data set
    dict ``data`` (from check_dataset), else None.

    A resumed run (``resume_ckpt`` given) reads only its recorded flag, so it keeps its tiles even if
    the YAML changed since. Must be a positive multiple of ``stride`` and not meet ``rect``; anything
    else is a UserError naming the flag or the YAML key.
    """
    yaml_value = None if resume_ckpt is not None else data.get("train_tiles")
    source = f"--train-tiles {flag}" if flag is not None else f"{data.get('yaml_file')}: train_tiles {yaml_value!r}"
    value = flag if flag is not None else yaml_value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise UserError(f"{source}: must be a positive whole number of pixels, the tile side (e.g. 640); "
                        "leave it out to train on whole images")
    if value % stride:
        nearest = sorted({max(value // stride, 1) * stride, math.ceil(value / stride) * stride})
        raise UserError(f"{source}: must be a multiple of the model stride {stride}, e.g. "
                        f"{' or '.join(map(str, nearest))}")
    if rect:
        raise UserError(f"{source}: cannot be combined with --rect (tiles are square); drop one of them")
    return int(value)
