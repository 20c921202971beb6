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
    """train.run replaced: records its arguments and logs the whole 50-epoch schedule into the run folder."""
    made = []

    def fake_run(**kwargs):
        made.append(kwargs)
        _csv(long_matrix.run_dir(_job(tmp_path)) / "results.csv", [0.0, 0.2] + [0.1] * 48)

    monkeypatch.setattr(train, "run", fake_run)
    return made


def test_a_new_run_trains_the_whole_schedule_and_its_row_is_reused(tmp_path, calls, monkeypatch):
    row = long_matrix.run_one(_job(tmp_path))
    assert len(calls) == 1 and calls[0]["epochs"] == 50 and calls[0]["patience"] == 0 and "resume" not in calls[0]
    assert row["state"] == "done" and row["best_epoch"] == 1 and row["epochs"] == 50
    assert long_matrix.run_one(_job(tmp_path)) == json.loads(json.dumps(row)) and len(calls) == 1


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, calls, monkeypatch):
    last = long_matrix.run_dir(_job(tmp_path)) / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    monkeypatch.setattr(long_matrix, "resumable", lambda path: True)
    long_matrix.run_one(_job(tmp_path))
    assert calls == [{"resume": str(last), "patience": 0}]  # a run started with a patience of its own no longer stops


def test_a_finished_run_without_its_row_is_reported_not_trained(tmp_path, calls, monkeypatch):
    folder = long_matrix.run_dir(_job(tmp_path))
    (folder / "weights").mkdir(parents=True)
    (folder / "weights" / "last.pt").write_bytes(b"")
    _csv(folder / "results.csv", [0.1] * 49 + [0.4])
    monkeypatch.setattr(long_matrix, "resumable", lambda path: False)
    row = long_matrix.run_one(_job(tmp_path))
    assert calls == [] and row["map"] == pytest.approx(0.4) and row["epochs"] == 50


@pytest.mark.parametrize("with_row", [True, False])
def test_a_run_its_own_patience_ended_early_is_set_aside_and_trained_again(tmp_path, calls, monkeypatch, with_row):
    folder = long_matrix.run_dir(_job(tmp_path))
    (folder / "weights").mkdir(parents=True)
    (folder / "weights" / "last.pt").write_bytes(b"old")
    _csv(folder / "results.csv", [0.1, 0.4])
    if with_row:
        (folder / "row.json").write_text(json.dumps({"state": "done", "epochs": 2, "map": 0.4}))
    (folder.parent / (folder.name + "-stopped-early")).mkdir()  # an earlier one keeps its name too
    monkeypatch.setattr(long_matrix, "resumable", lambda path: False)
    row = long_matrix.run_one(_job(tmp_path))
    assert len(calls) == 1 and calls[0]["patience"] == 0 and row["epochs"] == 50  # the fake run's
    kept = folder.parent / (folder.name + "-stopped-early-2")
    assert (kept / "weights" / "last.pt").read_bytes() == b"old" and len(long_matrix.read_rows(kept / "results.csv")) == 2


def test_report_only_shows_running_runs_and_generates_nothing(tmp_path, capsys, calls):
    _csv(tmp_path / "runs" / "glyphs-96-s0-yolov5n" / "results.csv", [0.0, 0.05])
    report = long_matrix.main(["--out", str(tmp_path), "--report-only", "--size", "96", "--kinds", "glyphs",
                               "--seeds", "0", "1", "--models", "yolov5n"])
    assert "| glyphs | 96 | 0 | yolov5n | 2 (running) | 2 | 0.0500 |" in report
    assert len([line for line in report.splitlines() if line.startswith("| glyphs")]) == 1  # seed 1 has no run yet
    assert calls == [] and not (tmp_path / "data").exists()


def test_report_only_on_a_folder_without_runs_is_one_line(tmp_path, capsys, calls):
    with pytest.raises(SystemExit) as exit_info:
        long_matrix.main(["--out", str(tmp_path / "typo"), "--report-only"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err == [f"ERROR: --out {tmp_path / 'typo'}: no runs there to report; the same "
                                                 "command without --report-only trains them"]
    assert calls == [] and not (tmp_path / "typo").exists()


def test_a_run_stopped_early_in_a_settled_cell_is_kept(tmp_path, calls, monkeypatch):
    job = _job(tmp_path)
    stalled = [0.1, 0.3, 0.2, 0.2] + [0.2] * 20  # the cell's best at epoch 2, then 22 epochs without a new best
    for model in ("ffca-yolo-n", "yolov5n-p2", "yolov5n"):
        _csv(long_matrix.run_dir({**job, "model": model}) / "results.csv", stalled if model == "yolov5n" else [0.1] * 30)
    folder = long_matrix.run_dir(job)  # yolov5n, stopped at 24 of 50 epochs, past the cell's budget of 22
    (folder / "weights").mkdir()
    (folder / "weights" / "last.pt").write_bytes(b"old")
    monkeypatch.setattr(long_matrix, "resumable", lambda path: False)
    row = long_matrix.run_one(job)
    assert calls == [] and row["epochs"] == 24 and (folder / "weights" / "last.pt").read_bytes() == b"old"


def _curve(maps):
    return [{"epoch": str(i), MAP50: str(m * 2), MAP: str(m)} for i, m in enumerate(maps)]


def _run(model, maps, state="done"):
    return {"kind": "photos", "size": 160, "seed": 0, "model": model, "state": state, "epochs": len(maps),
            "curve": _curve(maps)}


OPT = type("Opt", (), {"patience": 3, "max_epochs": 10, "auc_epochs": 10})


def test_the_cells_budget_is_where_the_best_of_its_runs_stopped_improving():
    from benchmarks.accuracy.long_matrix import cell_budget

    leader = _curve([0.1, 0.5, 0.5, 0.4, 0.4, 0.3, 0.3, 0.3])
    assert cell_budget([leader, _curve([0.0, 0.2, 0.3, 0.4, 0.45, 0.45])], patience=3) == 6  # 0.5 (a tie counts
    # as new) at the third epoch, unbeaten through the sixth
    assert cell_budget([leader, _curve([0.0, 0.2, 0.3, 0.4, 0.45, 0.6, 0.1])], patience=3) is None  # a new best at 6
    assert cell_budget([leader, _curve([0.0, 0.2, 0.3, 0.55, 0.1, 0.1, 0.1])], patience=3) == 7  # the other run leads
    assert cell_budget([leader, _curve([0.1, 0.2])], patience=3) is None  # not logged far enough yet


def test_verdicts_compare_every_model_at_the_cells_budget():
    from benchmarks.accuracy.long_matrix import converged_verdicts

    ffca = _run("ffca-yolo-n", [0.1, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2])
    late_p2 = _run("yolov5n-p2", [0.0, 0.1, 0.2, 0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 0.5])  # best after the budget
    rule, end = converged_verdicts([_run("yolov5n", [0.1] * 10), late_p2, ffca], OPT)
    assert rule == ("photos 160 px seed 0 (converged: compared at 5 epochs): ffca-yolo-n 0.3000 vs yolov5n-p2 "
                    "0.2500, 3.000x yolov5n: meets")
    assert end == ("photos 160 px seed 0 (at the schedule's end, 10 epochs): ffca-yolo-n 0.3000 vs yolov5n-p2 "
                   "0.5000, 3.000x yolov5n: misses p2")  # the runs learned on past the rule's plateau
    still_training = _run("yolov5n-p2", [0.0, 0.1, 0.2, 0.25, 0.25, 0.25, 0.25, 0.5], state="running")
    (line,) = converged_verdicts([_run("yolov5n", [0.1] * 10), still_training, ffca], OPT)
    assert line.startswith("photos 160 px seed 0 (converged: compared at 5 epochs)")  # no end before every run has one
    rising = _run("yolov5n-p2", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    (line,) = converged_verdicts([_run("yolov5n", [0.1] * 10), rising, ffca], OPT)
    assert "(not converged: the best run still improved" in line and line.endswith("misses p2")
    (line,) = converged_verdicts([_run("yolov5n", [0.1] * 4, state="running"), rising, ffca], OPT)
    assert line == ("photos 160 px seed 0 (running: compared at 4 epochs, as far as every run has got): ffca-yolo-n "
                    "0.3000 vs yolov5n-p2 0.3000, 3.000x yolov5n: meets")  # p2's later epochs are not counted
    (line,) = converged_verdicts([_run("yolov5n", [0.1] * 4), rising, ffca], OPT)
    assert line.endswith("(not judged: yolov5n stopped early at epoch 4, by the per-run patience this command "
                         "used before; training again sets it aside and trains it over the whole schedule)")
    assert converged_verdicts([rising, ffca], OPT) == []  # yolov5n missing: no verdict
    silent = [_run(m, [0.0] * 10) for m in ("yolov5n", "yolov5n-p2", "ffca-yolo-n")]
    assert "yolov5n at 0" in converged_verdicts(silent, OPT)[0]


def test_a_run_another_process_is_training_is_neither_resumed_nor_set_aside(tmp_path, calls):
    from utils.errors import UserError
    from utils.training.run_folder import hold_run_folder

    folder = long_matrix.run_dir(_job(tmp_path))
    (folder / "weights").mkdir(parents=True)
    (folder / "weights" / "last.pt").write_bytes(b"")
    with hold_run_folder(folder, "--name x"):
        with pytest.raises(UserError, match=f"^--out {tmp_path}: {folder} is in use"):
            long_matrix.run_one(_job(tmp_path))
    assert calls == [] and (folder / "weights" / "last.pt").is_file()
