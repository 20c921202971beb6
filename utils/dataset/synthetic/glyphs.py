"""The "glyphs" small-object data set: textured stroke objects on textured clutter.

A second object kind beside the drawn geometry of ``shapes``, so accuracy claims are not made on one
kind of data. Objects are five characters drawn as strokes (OpenCV's built-in Hershey fonts, random
font, stroke width, rotation and size), filled with a noise texture of a random colour: colour says
nothing about the class. The background is multi-scale value noise with a random palette, plus
unlabelled distractor strokes and distractor characters of the same textures, so only the stroke
pattern separates an object from clutter. Command line: data/scripts/make_glyphs.py.
"""

from pathlib import Path

import cv2
import numpy as np

from utils.dataset.synthetic.build import build_yolo_set
from utils.dataset.synthetic.shapes import overlaps

NAMES = ("A", "K", "R", "X", "4")
DISTRACTORS = ("o", "c", "z", "L", "7", "=")  # unlabelled strokes of the same textures
FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX)
IMG_SIZE = 256
MIN_SIDE, MAX_SIDE = 8, 20
OBJECTS_PER_IMAGE = (4, 12)
RENDER = 4  # glyphs are drawn at 4x and area-downsampled: anti-aliased strokes at any size
DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "glyphs"


def value_noise(rng, size: int, octaves=(4, 8, 16, 32)) -> np.ndarray:
    """(size, size) float32 in [0, 1]: random grids of ``octaves`` cells upsampled and summed (1/f-like)."""
    out = np.zeros((size, size), np.float32)
    for weight, cells in enumerate(octaves, 1):
        grid = rng.random((cells, cells)).astype(np.float32)
        out += cv2.resize(grid, (size, size), interpolation=cv2.INTER_CUBIC) / weight
    out -= out.min()
    return out / max(float(out.max()), 1e-6)


def textured_fill(rng, size: int) -> np.ndarray:
    """(size, size, 3) float32 BGR: one random colour modulated by fine noise (a surface, not a flat fill)."""
    colour = rng.uniform(20, 235, 3).astype(np.float32)
    return colour * (0.6 + 0.8 * value_noise(rng, size, octaves=(2, 4, 8))[..., None])


def background(rng, size: int) -> np.ndarray:
    """(size, size, 3) float32 BGR: two-colour palette over value noise, with faint strokes of clutter."""
    low, high = rng.uniform(30, 220, 3), rng.uniform(30, 220, 3)
    t = value_noise(rng, size)[..., None]
    im = (low * (1 - t) + high * t).astype(np.float32)
    for _ in range(rng.integers(size // 16, size // 8)):  # short strokes: clutter at object scale
        start = rng.integers(0, size, 2)
        pts = (start + np.cumsum(rng.integers(-12, 13, (int(rng.integers(2, 5)), 2)), 0)).astype(np.int32)
        shade = tuple(float(v) for v in rng.uniform(20, 235, 3))
        cv2.polylines(im, [pts], False, shade, int(rng.integers(1, 3)), cv2.LINE_AA)
    return im


def glyph_alpha(rng, char: str, side: float) -> np.ndarray:
    """(k, k) float32 alpha in [0, 1] of ``char`` rotated by up to 30 degrees, its larger extent about ``side`` px."""
    k = int(np.ceil(side * 1.6))
    big = np.zeros((k * RENDER, k * RENDER), np.uint8)
    font = FONTS[int(rng.integers(0, len(FONTS)))]
    thickness = int(rng.integers(1, 4)) * RENDER
    (w, h), _ = cv2.getTextSize(char, font, 1.0, thickness)
    scale = side * RENDER / max(w, h)
    (w, h), base = cv2.getTextSize(char, font, scale, thickness)
    origin = ((k * RENDER - w) // 2, (k * RENDER + h) // 2)
    cv2.putText(big, char, origin, font, scale, 255, thickness, cv2.LINE_AA)
    turn = cv2.getRotationMatrix2D((k * RENDER / 2, k * RENDER / 2), float(rng.uniform(-30, 30)), 1.0)
    big = cv2.warpAffine(big, turn, big.shape[::-1], flags=cv2.INTER_LINEAR)
    return cv2.resize(big, (k, k), interpolation=cv2.INTER_AREA).astype(np.float32) / 255


def paste(im: np.ndarray, rng, alpha: np.ndarray, x0: int, y0: int):
    """Blend a textured glyph with ``alpha`` into ``im`` at top-left (x0, y0); returns its tight box or None."""
    k = alpha.shape[0]
    fill = textured_fill(rng, k)
    region = im[y0:y0 + k, x0:x0 + k]
    a = alpha[..., None]
    region[:] = region * (1 - a) + fill * a
    ys, xs = np.nonzero(alpha > 0.3)
    if not len(xs):
        return None
    return x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1, y0 + ys.max() + 1


def make_glyph_image(rng, size=IMG_SIZE, sides=(MIN_SIDE, MAX_SIDE), objects=OBJECTS_PER_IMAGE):
    """One image: ``(image (size, size, 3) uint8 BGR, labels (n, 5) [cls, x, y, w, h] normalised)``.

    Object sides are log-uniform in ``sides`` (px); about one distractor per two objects.
    """
    im = background(rng, size)
    taken, labels = [], []
    n_objects = int(rng.integers(objects[0], objects[1] + 1))
    for j in range(n_objects + n_objects // 2):
        labelled = j < n_objects
        cls = int(rng.integers(0, len(NAMES)))
        char = NAMES[cls] if labelled else DISTRACTORS[int(rng.integers(0, len(DISTRACTORS)))]
        alpha = glyph_alpha(rng, char, float(np.exp(rng.uniform(np.log(sides[0]), np.log(sides[1])))))
        k = alpha.shape[0]
        for _attempt in range(20):
            x0, y0 = (int(v) for v in rng.integers(0, size - k, 2))
            if not overlaps((x0, y0, x0 + k, y0 + k), taken, margin=1):
                break
        else:
            continue
        box = paste(im, rng, alpha, x0, y0)
        taken.append((x0, y0, x0 + k, y0 + k))
        if labelled and box is not None:
            x1, y1, x2, y2 = box
            labels.append((cls, (x1 + x2) / 2 / size, (y1 + y2) / 2 / size, (x2 - x1) / size, (y2 - y1) / size))
    im += rng.normal(0.0, rng.uniform(3, 10), im.shape).astype(np.float32)
    return np.clip(im, 0, 255).astype(np.uint8), np.array(labels, dtype=np.float64).reshape(-1, 5)


def make_glyphs(root=DEFAULT_ROOT, n_train=256, n_val=64, seed=0, **image_options) -> Path:
    """Generate the data set into ``root`` (must not exist or be empty) and write ``<root>.yaml``; returns it.

    ``image_options``: ``size``, ``sides``, ``objects`` of :func:`make_glyph_image`.
    """
    return build_yolo_set(root, NAMES, make_glyph_image, (7,), n_train, n_val, seed, **image_options)
