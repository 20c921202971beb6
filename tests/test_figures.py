"""The picture helpers of ``python -m benchmarks.figures``: size limit, labels, windows, cached runs."""

import csv

import numpy as np
import pytest

from benchmarks.figures import draw, pictures, runs


def test_a_picture_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    fig = draw.figure(2, 1.5)
    fig.subplots().imshow(np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8))
    assert 0 < draw.save_png(fig, tmp_path / "noise.png") <= draw.LIMIT_BYTES
    monkeypatch.setattr(draw, "LIMIT_BYTES", 1000)
    with pytest.raises(ValueError, match="over the 1000-byte limit"):
        draw.save_png(fig, tmp_path / "big.png")
    assert not (tmp_path / "big.png").exists()


def test_the_caption_names_the_command_and_both_versions():
    fig = draw.figure(6, 3)
    draw.caption(fig, draw.trained("yolov5n, 2 epochs", "0.9.0"), "1.0.0")
    text = " ".join(fig.texts[0].get_text().split())
    assert "Trained: yolov5n, 2 epochs (at version 0.9.0)." in text
    assert "Made by `python -m benchmarks.figures` at version 1.0.0." in text


def test_a_finished_run_is_stamped_with_the_project_version_once(tmp_path, monkeypatch):
    """The stamp is the version the run was trained at, never a commit (a working tree's "-dirty" means nothing)."""
    from utils import __version__

    runs.stamp(tmp_path)
    assert runs.trained_at(tmp_path) == __version__
    monkeypatch.setattr(runs, "__version__", "9.9.9")
    runs.stamp(tmp_path)  # a later redraw at another version keeps the version it was trained at
    assert runs.trained_at(tmp_path) == __version__
    assert runs.trained_at(tmp_path / "no-stamp") == "unknown"


def test_yolo_labels_become_pixel_boxes(tmp_path):
    label = tmp_path / "a.txt"
    label.write_text("2 0.5 0.25 0.1 0.2\n")
    xyxy, classes = draw.labels_xyxy(label, 200, 100)
    assert classes.tolist() == [2]
    assert np.allclose(xyxy, [[90, 15, 110, 35]])
    (tmp_path / "empty.txt").write_text("")
    assert draw.labels_xyxy(tmp_path / "empty.txt", 200, 100)[0].shape == (0, 4)


def test_the_busiest_window_holds_the_most_box_centres():
    boxes = np.array([[10, 10, 20, 20], [700, 600, 710, 610], [720, 650, 730, 660], [900, 900, 910, 910]])
    x, y = pictures.busiest_window(boxes, crop=384, size=1024, step=64)
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    assert ((centres >= (x, y)) & (centres < (x + 384, y + 384))).all(1).sum() == 3  # no window holds all four
    assert x % 64 == 0 and y % 64 == 0 and x + 384 <= 1024 and y + 384 <= 1024


def test_a_run_counts_as_finished_only_with_every_epoch_and_last_pt(tmp_path):
    with open(tmp_path / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "metrics/mAP_0.5"])
        writer.writerows([[0, 0.1], [1, 0.2]])
    assert not runs.finished(tmp_path, 2)  # no last.pt yet
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "last.pt").write_bytes(b"x")
    assert runs.finished(tmp_path, 2) and not runs.finished(tmp_path, 3)


def test_an_unusable_out_is_one_line_before_any_training(monkeypatch, capsys):
    from benchmarks.figures import __main__ as figures

    def refuse(*args, **kwargs):
        raise AssertionError("training started before --out was checked")

    monkeypatch.setattr(runs, "detector_run", refuse)
    with pytest.raises(SystemExit) as exit_info:
        figures.main(["--out", "/proc/no-such/images"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert err[0].startswith("ERROR: --out /proc/no-such/images: cannot write in /proc (")


def test_draw_only_without_the_runs_is_exit_2_and_generates_nothing(tmp_path, monkeypatch, capsys):
    """It exited 1 (the convention is 2 for a user error), and generated the matrix's data set first."""
    from benchmarks.figures import __main__ as figures

    cache = tmp_path / "figures"
    monkeypatch.setattr(runs, "CACHE", cache)
    monkeypatch.setattr(runs, "MATRIX_ARGV", [*runs.MATRIX_ARGV[:-1], str(cache / "matrix")])
    finished = cache / runs.DETECTOR["name"]
    for missing in ("detector", "matrix"):
        with pytest.raises(SystemExit) as exit_info:
            figures.main(["--draw-only", "--out", str(tmp_path / "images")])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1 and "run without --draw-only to train it" in err[0], err
        assert ("is not a finished run" if missing == "detector" else "has no row.json") in err[0]
        assert not (cache / "matrix" / "data").exists()  # the matrix's data set was not generated
        finished.mkdir(parents=True, exist_ok=True)  # the detector's run is there now; the matrix's are not
        monkeypatch.setattr(runs, "finished", lambda run_dir, epochs: run_dir == finished)
