"""Small generated image sets with YOLO labels, for the loader and cache tests."""

from pathlib import Path

import cv2
import numpy as np


def noise(h, w, seed=0):
    """An (h, w, 3) uint8 image of uniform noise (a JPEG of it does not compress to nothing)."""
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def make_dataset(root: Path, n=6, size=(80, 96), split="train"):
    """n JPEG images (h, w) = size with one or two labelled boxes each; returns the images folder."""
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i in range(n):
        cv2.imwrite(str(images / f"im{i}.jpg"), noise(*size, seed=i))
        rows = [f"{i % 3} 0.5 0.5 0.3 0.4"] + (["1 0.25 0.3 0.2 0.2"] if i % 2 else [])
        (labels / f"im{i}.txt").write_text("\n".join(rows) + "\n")
    return images


def warnings_about(lines, name):
    """The logged warnings that mention ``name``."""
    return [m for m in lines if name in m and "WARNING" in m]
