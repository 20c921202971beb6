"""Source data sets in the converters' native formats (data/scripts/convert.py input), written on the fly."""

from pathlib import Path

import cv2
import numpy as np


def write_image(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A random-noise image (exact pixels survive PNG; JPEG for the formats that use it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cv2.imwrite(str(path), rng.integers(30, 255, (height, width, 3), dtype=np.uint8))
    return path


def make_visdrone(root: Path, ext: str = ".png") -> Path:
    """Two splits; train image a has every kind of row, b has no annotation file."""
    train, val = root / "VisDrone2019-DET-train", root / "VisDrone2019-DET-val"
    write_image(train / "images" / f"a{ext}", 64, 48, seed=1)
    write_image(train / "images" / f"b{ext}", 64, 48, seed=2)
    write_image(val / "images" / f"c{ext}", 64, 48, seed=3)
    (train / "annotations").mkdir(parents=True)
    (val / "annotations").mkdir(parents=True)
    (train / "annotations" / "a.txt").write_text(
        "10,20,8,6,1,4,0,0\n"       # car -> class 3
        "40,0,20,20,0,0,0,0\n"      # ignored region x 40-60, y 0-20
        "42,2,10,10,1,1,0,0\n"      # pedestrian fully inside the ignored region -> dropped
        "30,30,4,4,1,11,0,0\n"      # others -> dropped
        "2,2,5,5,0,2,0,0\n"         # score 0 -> dropped
        "not,a,row\n"               # malformed (line 6)
        "60,40,10,10,1,9,0,0,\n")   # bus, partly outside (clipped), trailing comma tolerated
    (val / "annotations" / "c.txt").write_text("0,0,16,16,1,1,0,0\n")
    return root
