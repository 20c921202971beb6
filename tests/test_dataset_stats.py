"""Data set report (python -m utils.dataset.dataset_stats): sizes at imgsz, bands, classes, advice, plot, bad input."""

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.dataset.dataset_stats import band_counts, dataset_report, format_report
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def write_yolo_set(root: Path) -> Path:
    """A 200 x 100 px train image with square objects of 10, 20, 40, 80 px, a background image, a val image."""
    for split, stem in (("train", "a"), ("train", "empty"), ("val", "v")):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / "images" / split / f"{stem}.png"), np.zeros((100, 200, 3), np.uint8))
    rows = [f"{cls} 0.5 0.5 {side / 200} {side / 100}" for cls, side in ((0, 10), (0, 20), (1, 40), (0, 80))]
    (root / "labels" / "train" / "a.txt").write_text("\n".join(rows + ["0 0.5 not-a-number 0.1 0.1"]) + "\n")
    (root / "labels" / "train" / "empty.txt").write_text("")
    (root / "labels" / "val" / "v.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    yaml_file = root / "set.yaml"
    yaml_file.write_text("path: .\ntrain: images/train\nval: images/val\nnames: [car, truck]\n")
    return yaml_file


def test_sizes_are_measured_at_the_training_size(tmp_path):
    report = dataset_report(write_yolo_set(tmp_path), imgsz=100)  # long side 200 -> scale 0.5
    train = report["splits"]["train"]
    assert np.allclose(sorted(train["sizes"]), [5, 10, 20, 40])
    assert band_counts(train["sizes"]) == {"very tiny <8": 1, "tiny 8-16": 1, "small 16-32": 1, "medium >=32": 1}
    assert train["images"] == 2 and list(train["per_image"]) == [4, 0] and train["unreadable_rows"] == 1
    assert np.bincount(train["classes"]).tolist() == [3, 1]
    assert np.allclose(report["splits"]["val"]["sizes"], [np.sqrt(100 * 50) * 0.5])  # 100 x 50 px box
    advice = " | ".join(a for a, _ in report["advice"])
    assert "slice the images" in advice and "stride-4 model" in advice
    text = format_report(report)
    assert "very tiny <8: 1 (25%)" in text and "car 3 (75%)" in text and "1 label rows that are not 5 numbers" in text


def test_advice_changes_with_the_image_size(tmp_path):
    report = dataset_report(write_yolo_set(tmp_path), imgsz=200)  # native size: 10, 20, 40, 80 px
    advice = [a for a, _ in report["advice"]]
    assert np.allclose(sorted(report["splits"]["train"]["sizes"]), [10, 20, 40, 80])
    assert not any("slice" in a or "--imgsz" in a for a in advice)
    assert any("standard stride 8/16/32" in a for a in advice)
    reasons = " ".join(r for _, r in report["advice"])
    assert "25% of objects are under 16 px at 200" in reasons


@pytest.mark.slow
def test_cli_prints_report_and_writes_plot(tmp_path):
    yaml_file = write_yolo_set(tmp_path)
    png = tmp_path / "plots" / "sizes.png"
    run = subprocess.run([sys.executable, "-m", "utils.dataset.dataset_stats", "--data", yaml_file, "--imgsz", "100",
                          "--plot", png], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "Sizes train: very tiny <8: 1 (25%)" in run.stdout and "Advice (from the train split):" in run.stdout
    image = cv2.imread(str(png))
    assert image is not None and image.shape[1] > 600


@pytest.mark.slow
def test_bad_input_is_one_error_line(tmp_path):
    with pytest.raises(UserError, match="--imgsz"):
        dataset_report(write_yolo_set(tmp_path), imgsz=0)
    run = subprocess.run([sys.executable, "-m", "utils.dataset.dataset_stats", "--data", tmp_path / "missing.yaml"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and run.stderr.startswith("ERROR: ") and run.stderr.strip().count("\n") == 0


def test_a_polygon_row_counts_as_its_enclosing_box_as_in_training(tmp_path):
    from utils.dataset.dataset_stats import read_labels

    labels = tmp_path / "a.txt"
    labels.write_text("2 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6\n1 0.5 0.5 0.2 0.2\n0 1 2 3 4 5\n")
    rows, unreadable = read_labels(labels)
    np.testing.assert_allclose(rows, [[2, 0.3, 0.4, 0.4, 0.4], [1, 0.5, 0.5, 0.2, 0.2]])
    assert unreadable == 1  # six numbers are neither a box nor a polygon
