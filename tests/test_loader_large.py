"""benchmarks/speed/loader_large.py's data and pixel check, and vs_upstream_process's start-up accounting:
the parts a benchmark's figures rest on, without running the benchmarks."""

import cv2
import numpy as np
import pytest

from benchmarks.speed import loader_large, vs_upstream_process
from utils.dataloaders import LoadImagesAndLabels


@pytest.mark.slow
@pytest.mark.parametrize("width, height, suffix", [(1000, 600, "jpg"), (700, 700, "png")])
def test_large_images_are_tiled_photos_with_labels_inside_them(tmp_path, width, height, suffix):
    root = loader_large.write_large_set(tmp_path / "set", width, height, suffix, n=2)
    images = sorted((root / "images" / "train").iterdir())
    assert [p.suffix for p in images] == [f".{suffix}"] * 2
    for image in images:
        im = cv2.imread(str(image))
        assert im.shape == (height, width, 3) and im.std() > 10  # photo content, not a flat fill
        rows = np.loadtxt(root / "labels" / "train" / f"{image.stem}.txt", ndmin=2)
        assert len(rows) >= 4 and set(rows[:, 0]) <= set(range(5))
        x, y, w, h = rows[:, 1:].T
        assert (x - w / 2 >= 0).all() and (x + w / 2 <= 1).all() and (y - h / 2 >= 0).all() and (y + h / 2 <= 1).all()
    assert LoadImagesAndLabels(str(root / "images" / "train"), img_size=256).n == 2  # every label accepted


@pytest.mark.slow
def test_pixel_check_sees_the_reduced_decode_on_jpegs_and_nothing_on_pngs(tmp_path):
    for suffix in ("jpg", "png"):
        root = loader_large.write_large_set(tmp_path / suffix, 1000, 1000, suffix, n=1)
        files = [str(p) for p in (root / "images" / "train").iterdir()]
        reduced_vs_full, area_vs_linear = loader_large.pixel_differences(files, 1000, 1000, 250)
        assert area_vs_linear > 0
        assert (reduced_vs_full > 0) if suffix == "jpg" else (reduced_vs_full == 0)


def test_start_up_time_outside_the_phases_is_what_is_left_of_the_first_batch():
    report = {"first_batch": 10.0, "imports": 3.0, "create_dataloader": 1.5, "smart_optimizer": 2.0, "unknown": 9.0}
    assert vs_upstream_process.rest(report) == pytest.approx(3.5)
