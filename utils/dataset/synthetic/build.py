"""Write a generated data set in YOLO layout: per-image seed streams, atomic folder, data YAML."""

import os
import shutil
import tempfile
from functools import partial
from pathlib import Path

import cv2
import numpy as np


def write_split(root: Path, split: str, n: int, seed: int, split_id: int, make, stream=(), quality=92,
                **image_options) -> None:
    """``n`` images of ``make(rng, **image_options)`` and their labels; image i draws from its own stream
    ``[seed, split_id, i, *stream]`` (independent of n; ``stream`` keeps sibling generators apart)."""
    (root / "images" / split).mkdir(parents=True)
    (root / "labels" / split).mkdir(parents=True)
    for i in range(n):
        rng = np.random.default_rng([seed, split_id, i, *stream])
        im, labels = make(rng, **image_options)
        cv2.imwrite(str(root / "images" / split / f"{i:06d}.jpg"), im, [cv2.IMWRITE_JPEG_QUALITY, quality])
        rows = "".join(f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
        (root / "labels" / split / f"{i:06d}.txt").write_text(rows)


def build_atomically(root: Path, write) -> None:
    """Run ``write(tmp)`` on a temporary sibling of ``root`` and rename it into place.

    ``root`` must not exist or be empty; an interrupted run never leaves a half-written data set
    that would look complete.
    """
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty; delete it to regenerate the data set")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write(tmp)
        if root.exists():
            root.rmdir()
        try:
            os.replace(tmp, root)
        except OSError:  # another process (e.g. a second DDP rank) finished first
            if root.exists() and any(root.iterdir()):
                raise FileExistsError(f"{root} was created by another process meanwhile") from None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_yolo_set(root: Path, names, make, stream: tuple, n_train: int, n_val: int, seed: int,
                   **image_options) -> Path:
    """Write train/val splits of ``make(rng, **image_options)`` images into ``root`` atomically and the
    data YAML ``<root>.yaml`` beside it; returns the YAML path (the sibling generators' common tail)."""
    root = Path(root).resolve()
    split = partial(write_split, make=make, stream=stream, quality=95, **image_options)
    build_atomically(root, lambda tmp: (split(tmp, "train", n_train, seed, 0), split(tmp, "val", n_val, seed, 1)))
    yaml_file = root.with_suffix(".yaml")
    yaml_file.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [{', '.join(names)}]\n")
    return yaml_file
