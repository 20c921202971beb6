"""The long-budget matrix's bookkeeping: what a run's row says, and which runs start, resume or are only reported."""

import json

import pytest

import train
from benchmarks.accuracy import long_matrix
from benchmarks.accuracy.long_matrix import MAP, MAP50, summarise

HEADER = f"epoch,{MAP50},{MAP},metrics/mAP50-95_very_tiny,metrics/mAP50-95_tiny,metrics/mAP50-95_aitod_small\n"


def _csv(path, maps):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(f"{i},{m * 2},{m},{m / 2},{m},nan\n" for i, m in enumerate(maps)))


def _job(tmp_path):
    opt = {"max_epochs": 50, "patience": 20, "batch_size": 16, "hyp": "h.yaml", "auc_epochs": 7}
    return {"kind": "glyphs", "size": 64, "seed": 1, "model": "yolov5n", "data": "d.yaml", "out": str(tmp_path),
            "cfg": "m.yaml", "opt": opt}


def test_summary_best_epoch_bands_and_area(tmp_path):
    _csv(tmp_path / "r.csv", [0.0, 0.1, 0.3, 0.3, 0.2])
    got = summarise(long_matrix.read_rows(tmp_path / "r.csv"), auc_epochs=7)
    assert got["epochs"] == 5 and got["best_epoch"] == 3 and got["map"] == pytest.approx(0.3)  # last of ties
    assert got["bands"]["very_tiny"] == pytest.approx(0.15) and got["bands"]["aitod_small"] != got["bands"]["aitod_small"]
    assert got["auc"] == pytest.approx((0.0 + 0.1 + 0.3 + 0.3 + 0.2 * 3) / 7)  # last value held to epoch 7


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """train.run replaced: records its arguments and logs three epochs into the run folder."""
    made = []

    def fake_run(**kwargs):
        made.append(kwargs)
        _csv(long_matrix.run_dir(_job(tmp_path)) / "results.csv", [0.0, 0.2, 0.1])

    monkeypatch.setattr(train, "run", fake_run)
    return made


def test_a_new_run_starts_with_the_stop_rule_and_its_row_is_reused(tmp_path, calls, monkeypatch):
    row = long_matrix.run_one(_job(tmp_path))
    assert len(calls) == 1 and calls[0]["epochs"] == 50 and calls[0]["patience"] == 20 and "resume" not in calls[0]
    assert row["state"] == "done" and row["best_epoch"] == 1 and row["epochs"] == 3
    assert long_matrix.run_one(_job(tmp_path)) == json.loads(json.dumps(row)) and len(calls) == 1


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, calls, monkeypatch):
    last = long_matrix.run_dir(_job(tmp_path)) / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    monkeypatch.setattr(long_matrix, "resumable", lambda path: True)
    long_matrix.run_one(_job(tmp_path))
    assert calls == [{"resume": str(last)}]


def test_a_finished_run_without_its_row_is_reported_not_trained(tmp_path, calls, monkeypatch):
    folder = long_matrix.run_dir(_job(tmp_path))
    (folder / "weights").mkdir(parents=True)
    (folder / "weights" / "last.pt").write_bytes(b"")
    _csv(folder / "results.csv", [0.1, 0.4])
    monkeypatch.setattr(long_matrix, "resumable", lambda path: False)
    row = long_matrix.run_one(_job(tmp_path))
    assert calls == [] and row["map"] == pytest.approx(0.4) and row["epochs"] == 2


def test_report_only_shows_running_runs_and_generates_nothing(tmp_path, capsys, calls):
    _csv(tmp_path / "runs" / "glyphs-96-s0-yolov5n" / "results.csv", [0.0, 0.05])
    report = long_matrix.main(["--out", str(tmp_path), "--report-only", "--size", "96", "--kinds", "glyphs",
                               "--seeds", "0", "1", "--models", "yolov5n"])
    assert "| glyphs | 96 | 0 | yolov5n | 2 (running) | 2 | 0.0500 |" in report
    assert len([line for line in report.splitlines() if line.startswith("| glyphs")]) == 1  # seed 1 has no run yet
    assert calls == [] and not (tmp_path / "data").exists()


def _summary(model, best_map, epochs=60, best_epoch=30, state="done"):
    return {"kind": "photos", "size": 160, "seed": 0, "model": model, "map": best_map, "epochs": epochs,
            "best_epoch": best_epoch, "state": state}


def test_converged_verdicts_apply_issue_38s_end_target():
    from benchmarks.accuracy.long_matrix import converged_verdicts

    meets = [_summary("yolov5n", 0.10), _summary("yolov5n-p2", 0.11), _summary("ffca-yolo-n", 0.111)]
    (line,) = converged_verdicts(meets, patience=20)
    assert line.startswith("photos 160 px seed 0 (converged)") and "1.11x yolov5n" in line and line.endswith("meets")
    short = [_summary("yolov5n", 0.10), _summary("yolov5n-p2", 0.12), _summary("ffca-yolo-n", 0.105)]
    assert converged_verdicts(short, patience=20)[0].endswith("misses p2 and 1.1x yolov5n")
    still_rising = [*meets[:2], _summary("ffca-yolo-n", 0.2, epochs=100, best_epoch=85)]
    assert "not converged: ffca-yolo-n still improved" in converged_verdicts(still_rising, patience=20)[0]
    running = [*meets[:2], _summary("ffca-yolo-n", 0.05, state="running")]
    assert "(running)" in converged_verdicts(running, patience=20)[0]
    assert converged_verdicts(meets[:2], patience=20) == []  # ffca-yolo-n missing: no verdict
    silent = [_summary("yolov5n", 0.0), _summary("yolov5n-p2", 0.0), _summary("ffca-yolo-n", 0.0)]
    assert "yolov5n at 0" in converged_verdicts(silent, patience=20)[0]
