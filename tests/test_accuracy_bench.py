"""The small-object benchmark's pieces: model variants and the tiny-shapes generator."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "scripts"))

from benchmarks.accuracy.variants import swap_modules, variant_yaml  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.dataset.synthetic.glyphs import NAMES as GLYPH_NAMES, make_glyphs  # noqa: E402
from utils.dataset.synthetic.tiny_shapes import MAX_SIDE, MIN_SIDE, make_tiny_shapes  # noqa: E402
from utils.files import yaml_load  # noqa: E402


def test_ablations_keep_layer_indices(tmp_path):
    base = yaml_load(ROOT / "models" / "ffca-yolo-n.yaml")
    concat = swap_modules(base, {"FFM_Concat2": "Concat", "FFM_Concat3": "Concat"})
    assert [r[0] for r in concat["head"]] == [r[0] for r in base["head"]]
    assert {r[2] for r in concat["head"]} & {"FFM_Concat2", "FFM_Concat3"} == set()
    for name in ("ffca-yolo-n-noSCAM", "ffca-yolo-n-noFEM", "ffca-yolo-n-concat", "yolov5n-p2"):
        model = Model(variant_yaml(name, tmp_path), nc=4)
        assert model.stride.tolist() == [4.0, 8.0, 16.0]
    with pytest.raises(KeyError, match="unknown variant"):
        variant_yaml("yolov9", tmp_path)


def test_tiny_shapes_sizes_and_refuses_to_overwrite(tmp_path):
    yaml_file = make_tiny_shapes(tmp_path / "tiny", n_train=4, n_val=2, seed=3)
    labels = np.concatenate([np.loadtxt(f, ndmin=2) for f in (tmp_path / "tiny" / "labels" / "train").glob("*.txt")])
    sides = np.sqrt(labels[:, 3] * labels[:, 4]) * 160
    assert len(labels) >= 4 * 3 and sides.min() >= MIN_SIDE * 0.5 and sides.max() <= MAX_SIDE * 1.5
    assert "names: [circle, square, triangle, cross]" in yaml_file.read_text()
    with pytest.raises(FileExistsError):
        make_tiny_shapes(tmp_path / "tiny", n_train=1, n_val=1)


def test_glyphs_are_deterministic_sized_and_refuse_to_overwrite(tmp_path):
    yaml_file = make_glyphs(tmp_path / "g", n_train=3, n_val=1, seed=5, size=96, sides=(8, 16))
    again = make_glyphs(tmp_path / "h", n_train=3, n_val=1, seed=5, size=96, sides=(8, 16))
    first = sorted((tmp_path / "g" / "labels" / "train").glob("*.txt"))
    assert [f.read_text() for f in first] == [(tmp_path / "h" / "labels" / "train" / f.name).read_text() for f in first]
    labels = np.concatenate([np.loadtxt(f, ndmin=2) for f in first])
    longer_side = np.maximum(labels[:, 3], labels[:, 4]) * 96
    assert len(labels) >= 3 * 3 and longer_side.min() >= 3 and longer_side.max() <= 16 * 1.2
    assert set(labels[:, 0].astype(int)) <= set(range(len(GLYPH_NAMES)))
    assert f"names: [{', '.join(GLYPH_NAMES)}]" in yaml_file.read_text() and again.exists()
    with pytest.raises(FileExistsError):
        make_glyphs(tmp_path / "g", n_train=1, n_val=1)


def test_glyphs_cli_rejects_sides_that_do_not_fit(capsys):
    from make_glyphs import main

    assert main(["--img-size", "64", "--min-side", "8", "--max-side", "40"]) == 2
    assert "--max-side 40" in capsys.readouterr().err


def _row(model, first, m):
    return {"kind": "glyphs", "size": 256, "seed": 0, "model": model, "first": first, "map": m}


def test_target_verdicts_apply_both_conditions():
    from benchmarks.accuracy.matrix import target_verdicts

    meets = [_row("yolov5n", 9, 0.010), _row("yolov5n-p2", 5, 0.02), _row("ffca-yolo-n", 7, 0.010)]
    assert target_verdicts(meets)[0].startswith("glyphs 256 px seed 0: meets")
    late = [_row("yolov5n", 9, 0.010), _row("yolov5n-p2", 5, 0.02), _row("ffca-yolo-n", 8, 0.5)]
    assert "misses start" in target_verdicts(late)[0]
    never = [_row("yolov5n", None, 0.0), _row("yolov5n-p2", 4, 0.02), _row("ffca-yolo-n", None, 0.0)]
    assert "(first epoch never vs p2 4;" in target_verdicts(never)[0]
    assert "misses start" in target_verdicts(never)[0] and "end" not in target_verdicts(never)[0].split(":")[1].split("(")[0]
    silent = [_row("yolov5n", None, 0.0), _row("yolov5n-p2", None, 0.0), _row("ffca-yolo-n", None, 0.0)]
    assert "no model reached" in target_verdicts(silent)[0]
    low = [_row("yolov5n", 9, 0.011), _row("yolov5n-p2", None, 0.0), _row("ffca-yolo-n", None, 0.010)]
    assert "misses end" in target_verdicts(low)[0]


def test_read_curve_finds_first_epoch_above_the_start_threshold(tmp_path):
    from benchmarks.accuracy.matrix import read_curve

    csv_file = tmp_path / "results.csv"
    csv_file.write_text("epoch,train/box_loss,metrics/mAP_0.5\n0,0.13,0.0\n1,0.12,0.0009\n2,0.11,0.002\n3,0.10,0.0\n")
    assert read_curve(csv_file) == {"first": 3, "box0": 0.13, "box1": 0.10}


def _job(out, epochs=3):
    return {"kind": "shapes", "size": 160, "seed": 1, "model": "yolov5n", "out": str(out), "data": "unused.yaml",
            "opt": {"epochs": epochs}}


def test_finished_row_reuses_a_saved_row_and_skips_unfinished_runs(tmp_path):
    import json

    from benchmarks.accuracy.matrix import finished_row, run_name

    job = _job(tmp_path)
    run_dir = tmp_path / "runs" / run_name(job)
    assert finished_row(job) is None  # nothing there yet: the run must be trained
    (run_dir / "weights").mkdir(parents=True)
    (run_dir / "weights" / "last.pt").write_bytes(b"")
    (run_dir / "results.csv").write_text("epoch,train/box_loss,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n0,0.1,0,0\n")
    assert finished_row(job) is None  # 1 of 3 epochs: interrupted, train again
    saved = {"model": "yolov5n", "map": 0.25}
    (run_dir / "row.json").write_text(json.dumps(saved))
    assert finished_row(job) == saved


def test_report_only_needs_the_matrix_folder_and_generates_nothing(capsys, tmp_path, monkeypatch):
    from benchmarks.accuracy import matrix

    with pytest.raises(SystemExit) as exit_info:
        matrix.main(["--report-only"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.startswith("ERROR: --report-only needs --out")
    with pytest.raises(SystemExit) as exit_info:
        matrix.main(["--report-only", "--out", str(tmp_path / "typo")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == (
        f"ERROR: --out {tmp_path / 'typo'}: no runs there to report; the same command without --report-only trains them")
    assert not (tmp_path / "typo").exists()
    (tmp_path / "m" / "runs").mkdir(parents=True)
    monkeypatch.setattr(matrix, "make_data", lambda *a, **k: pytest.fail("a report generated data"))
    partial = tmp_path / "m" / "runs" / "glyphs-64-s0-ffca-yolo-n"
    partial.mkdir()
    (partial / "results.csv").write_text("epoch,metrics/mAP_0.5\n0,0.0\n1,0.0\n")
    report = matrix.main(["--report-only", "--out", str(tmp_path / "m"), "--kinds", "glyphs", "--sizes", "64",
                          "--seeds", "0", "--epochs", "5"])
    assert report.startswith("| kind |") and not (tmp_path / "m" / "data").exists()
    assert report.splitlines()[-3:] == ["not finished: glyphs-64-s0-yolov5n, 0 of 5 epochs logged",
                                        "not finished: glyphs-64-s0-yolov5n-p2, 0 of 5 epochs logged",
                                        "not finished: glyphs-64-s0-ffca-yolo-n, 2 of 5 epochs logged"]


def test_reruns_with_other_training_seeds_get_their_own_runs_and_verdicts():
    from benchmarks.accuracy.matrix import run_name, target_verdicts

    base = {"kind": "glyphs", "size": 256, "seed": 1, "model": "ffca-yolo-n"}
    assert run_name(base) == run_name({**base, "train_seed": 1}) == "glyphs-256-s1-ffca-yolo-n"  # old folders reused
    assert run_name({**base, "train_seed": 2}) == "glyphs-256-s1-t2-ffca-yolo-n"
    rows = [{**_row(m, first, 0.01), "train_seed": t} for t, firsts in ((0, (9, 5, 7)), (2, (9, 5, 12)))
            for m, first in zip(("yolov5n", "yolov5n-p2", "ffca-yolo-n"), firsts)]
    verdicts = target_verdicts(rows)
    assert len(verdicts) == 2
    assert verdicts[0].startswith("glyphs 256 px seed 0: meets")
    assert verdicts[1].startswith("glyphs 256 px seed 0 (train 2): misses start")


def test_spread_verdicts_apply_the_target_to_the_medians_over_training_seeds():
    from benchmarks.accuracy.matrix import spread_verdicts

    firsts = {"yolov5n": (None, None, None), "yolov5n-p2": (16, 18, 17), "ffca-yolo-n": (23, 14, 19)}
    rows = [{**_row(m, f, 0.01 if m == "ffca-yolo-n" else 0.0), "train_seed": t}
            for m, fs in firsts.items() for t, f in zip((1, 2, 3), fs)]
    (line,) = spread_verdicts(rows)
    assert "over 3 training seeds" in line and "23, 14, 19 (median 19)" in line and "(median 17)" in line
    assert line.endswith("meets on the medians")
    late = [{**r, "first": None} if r["model"] == "ffca-yolo-n" and r["train_seed"] > 1 else r for r in rows]
    assert "(median never)" in spread_verdicts(late)[0] and spread_verdicts(late)[0].endswith("misses start on the medians")
    assert spread_verdicts(rows[:: 3]) == []  # one training seed per model: nothing to summarise
    without_v5 = [r for r in rows if r["model"] != "yolov5n"]
    assert "end not judged" in spread_verdicts(without_v5)[0]
    low = [{**r, "map": 0.02} if r["model"] == "yolov5n" else r for r in rows]
    assert spread_verdicts(low)[0].endswith("misses end on the medians")
    v5_early = [{**r, "first": 15} if r["model"] == "yolov5n" else r for r in rows]
    line = spread_verdicts(v5_early)[0]
    assert "yolov5n 15, 15, 15 (median 15)" in line and line.endswith("misses start vs yolov5n on the medians")
    v5_close = [{**r, "first": 17} if r["model"] == "yolov5n" else r for r in rows]
    assert spread_verdicts(v5_close)[0].endswith("meets on the medians")  # 19 <= 17 + 2


def test_separability_is_zero_for_one_distribution_and_affine_invariant():
    from benchmarks.accuracy.separability import squared_mahalanobis

    rng = np.random.default_rng(0)
    background = rng.normal(size=(4000, 3))
    same = rng.normal(size=(4000, 3))
    shifted = same + np.array([2.0, 0.0, 0.0])
    assert squared_mahalanobis(same, background) < 0.02
    assert squared_mahalanobis(shifted, background) == pytest.approx(4.0, rel=0.1)
    scale, offset = np.array([10.0, 0.1, 3.0]), np.array([5.0, -1.0, 0.0])
    assert squared_mahalanobis(shifted * scale + offset, background * scale + offset) == pytest.approx(
        squared_mahalanobis(shifted, background), rel=0.01)
    with pytest.raises(ValueError, match="at least 2 rows"):
        squared_mahalanobis(shifted[:1], background)


def test_separability_cells_and_epoch_order(tmp_path):
    import torch

    from benchmarks.accuracy.separability import cell_masks, check_layers, collect_cells, epoch_order

    centres, background = cell_masks(torch.tensor([[8.0, 8.0, 16.0, 16.0]]), h=8, w=8, stride=4)
    assert centres.nonzero().tolist() == [[3, 3]]
    assert not background[1:6, 1:6].any() and background[0, 0] and background[7, 7]
    names = ["last.pt", "epoch10.pt", "epoch2.pt", "best.pt"]
    assert sorted(names, key=epoch_order) == ["epoch2.pt", "epoch10.pt", "best.pt", "last.pt"]

    make_glyphs(tmp_path / "g", n_train=1, n_val=2, seed=1, size=64, sides=(8, 12))
    model = Model(ROOT / "benchmarks" / "accuracy" / "models" / "yolov5n-p2.yaml", nc=5).eval()
    images = sorted((tmp_path / "g" / "images" / "val").glob("*"))
    cells = collect_cells(model, images, [2, 4])
    n_labels = sum(len(np.loadtxt(f, ndmin=2)) for f in (tmp_path / "g" / "labels" / "val").glob("*.txt"))
    objects, bg = cells[2]
    assert 0 < len(objects) <= n_labels and objects.shape[1] == bg.shape[1] == 32
    assert cells[4][0].shape[1] == 64 and len(bg) > len(objects)
    with pytest.raises(ValueError, match=r"--layers 99: this model's feature rows are 0-21"):
        check_layers(model, [2, 99])


def test_a_run_interrupted_midway_is_trained_again_from_an_empty_folder(tmp_path, monkeypatch):
    """train.py appends to an existing results.csv: a rerun must not count the interrupted run's epochs."""
    import train
    from benchmarks.accuracy import matrix

    job = matrix_job(tmp_path)
    folder = tmp_path / "runs" / matrix.run_name(job)
    folder.mkdir(parents=True)
    header = "epoch,train/box_loss,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n"
    (folder / "results.csv").write_text(header + "0,0.2,0.5,0.3\n")  # the interrupted run's one epoch
    assert matrix.finished_row(job) is None

    def fake_run(**kwargs):
        path = folder / "results.csv"
        old = path.read_text() if path.exists() else header
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(old + "".join(f"{e},0.1,{0.002 * e},0.001\n" for e in range(3)))
        return (0, 0, 0.004, 0.001)

    monkeypatch.setattr(train, "run", fake_run)
    monkeypatch.setattr(matrix, "size_band_ap", lambda *args: {})
    row = matrix.train_one(job)
    assert len(matrix.results_rows(folder / "results.csv")) == 3
    assert row["first"] == 2  # epoch index 1 (mAP50 0.002) is the first above 0.001; 1-based 2


def matrix_job(tmp_path) -> dict:
    return {"kind": "glyphs", "size": 64, "seed": 0, "model": "yolov5n", "data": "d.yaml", "out": str(tmp_path),
            "cfg": "m.yaml", "opt": {"epochs": 3, "batch_size": 16, "hyp": "h.yaml"}}


def save_interrupted_checkpoint(folder: Path, **opt) -> Path:
    """A last.pt as train.py leaves it mid-run: unfinished, with its optimizer, after ``epoch`` 0 (one epoch)."""
    import torch

    last = folder / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    began = {"epochs": 3, "imgsz": 64, "batch_size": 16, "seed": 0, **opt}
    torch.save({"model_cfg": {}, "model": {}, "optimizer": {"state": {}}, "epoch": 0, "opt": began}, last)
    return last


def test_a_run_interrupted_after_a_checkpoint_is_resumed_not_retrained(tmp_path, monkeypatch):
    import train
    from benchmarks.accuracy import matrix

    job = matrix_job(tmp_path)
    folder = tmp_path / "runs" / matrix.run_name(job)
    last = save_interrupted_checkpoint(folder)
    header = "epoch,train/box_loss,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n"
    (folder / "results.csv").write_text(header + "0,0.2,0.0,0.0\n")
    calls = []

    def fake_resume(**kwargs):
        calls.append(kwargs)
        with open(folder / "results.csv", "a") as f:
            f.write("1,0.1,0.002,0.001\n2,0.1,0.003,0.002\n")
        return (0, 0, 0.003, 0.002)

    monkeypatch.setattr(train, "run", fake_resume)
    monkeypatch.setattr(matrix, "size_band_ap", lambda *args: {})
    row = matrix.train_one(job)
    assert calls == [{"resume": str(last)}]
    assert last.exists() and row["first"] == 2 and row["map"] == 0.002
    assert row["s_per_epoch"] >= 0 and json.loads((folder / "row.json").read_text())["first"] == 2


@pytest.mark.parametrize("change", [{"imgsz": 96}, {"epochs": 5}, {"seed": 1}, {"batch_size": 8}])
def test_a_checkpoint_begun_with_other_settings_is_not_resumed(tmp_path, monkeypatch, change):
    import train
    from benchmarks.accuracy import matrix

    job = matrix_job(tmp_path)
    folder = tmp_path / "runs" / matrix.run_name(job)
    save_interrupted_checkpoint(folder, **change)
    calls = []

    def fake_run(**kwargs):
        calls.append(kwargs)
        assert not folder.exists(), "the old run's folder was not cleared"
        (folder / "weights").mkdir(parents=True)
        (folder / "results.csv").write_text("epoch,train/box_loss,metrics/mAP_0.5,metrics/mAP_0.5:0.95\n"
                                            + "".join(f"{e},0.1,0.0,0.0\n" for e in range(3)))
        return (0, 0, 0.0, 0.0)

    monkeypatch.setattr(train, "run", fake_run)
    monkeypatch.setattr(matrix, "size_band_ap", lambda *args: {})
    matrix.train_one(job)
    assert len(calls) == 1 and "resume" not in calls[0] and calls[0]["epochs"] == 3


def test_an_unreadable_or_finished_checkpoint_is_not_resumed(tmp_path):
    import torch

    from benchmarks.accuracy import matrix

    job = matrix_job(tmp_path)
    last = save_interrupted_checkpoint(tmp_path / "run")
    assert matrix.resumable_epochs(job, last) == 1
    torch.save({"model_cfg": {}, "model": {}, "optimizer": {}, "epoch": 2, "finished": True,
                "opt": {"epochs": 3, "imgsz": 64, "batch_size": 16, "seed": 0}}, last)
    assert matrix.resumable_epochs(job, last) is None
    last.write_bytes(b"not a checkpoint")
    assert matrix.resumable_epochs(job, last) is None
    assert matrix.resumable_epochs(job, tmp_path / "absent.pt") is None


def test_a_run_another_matrix_is_training_is_not_cleared(tmp_path, monkeypatch):
    """Two matrices on one --out: deleting the other's run folder would not stop it, only hide its lock."""
    import train
    from benchmarks.accuracy import matrix
    from utils.training.run_folder import hold_run_folder

    job = matrix_job(tmp_path)
    folder = tmp_path / "runs" / matrix.run_name(job)
    folder.mkdir(parents=True)
    (folder / "results.csv").write_text("epoch\n0\n")
    monkeypatch.setattr(train, "run", lambda **kwargs: pytest.fail("trained a run in use"))
    with hold_run_folder(folder, "--name x"):
        with pytest.raises(UserError, match=rf"^--out {tmp_path}: {folder} is in use: process \d+ is training"):
            matrix.train_one(job)
    assert (folder / "results.csv").read_text() == "epoch\n0\n"
