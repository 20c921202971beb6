"""The reproducibility guarantees: reruns, worker counts and resumes (even after SIGKILL) are bit-identical."""

import itertools
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import train
from tests.support.launchers import kill_when, train_cmd
from tests.support.run_outputs import assert_identical, weights_checksum as checksum
from tests.support.val_spy import recorded_validations
from utils.determinism.compare import compare_runs

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
FINAL_VALIDATION = {}  # run folder -> training's final validation (of best.pt): tests.support.val_spy.Validation
SETTINGS = dict(imgsz=64, batch_size=4, epochs=2, device="cpu", noplots=True, exist_ok=True, save_interval=0)


def run_in_process(project: Path, name: str, data, cfg, **overrides) -> Path:
    train.run(**{**SETTINGS, "data": str(data), "cfg": str(cfg), "project": str(project), "name": name,
                 "workers": 0, **overrides})
    return project / name


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shapes_data, tiny_cfg) -> Path:
    """The uninterrupted reference run: seed 0, workers 0, 2 epochs of 4 batches; its final validation's
    metrics and detections per image are kept in FINAL_VALIDATION."""
    with recorded_validations() as validations:
        run_dir = run_in_process(tmp_path_factory.mktemp("repro"), "reference", shapes_data, tiny_cfg)
    FINAL_VALIDATION[run_dir] = validations[-1]
    return run_dir


@pytest.mark.slow
def test_checksum_is_printed_and_saved(reference):
    report = json.loads((reference / "determinism.json").read_text())
    assert report["final_ema_sha256"] == checksum(reference)
    assert len(checksum(reference)) == 64
    for key in ("mode", "seed", "audit", "relaxed_backward", "versions", "devices", "CUBLAS_WORKSPACE_CONFIG",
                "PYTHONHASHSEED", "world_size", "workers", "threads", "cpu_capability", "label_cache_hash", "data_fingerprint",
                "nondeterministic_ops", "guarantee"):
        assert key in report, key


@pytest.mark.slow
def test_final_metrics_are_those_val_py_gives_for_best_pt(reference, shapes_data, tmp_path):
    """The metrics printed at the end of training are val.py's on best.pt with the default flags, and every
    image's detections are the same bits, although training validates at twice its batch size (8) and val.py at
    its default 32."""
    import val

    weights = reference / "weights" / "best.pt"
    opt = val.parse_opt(["--weights", str(weights), "--data", str(shapes_data), "--imgsz", "64", "--workers", "0",
                         "--project", str(tmp_path), "--name", "val"])
    assert opt.batch_size != 2 * SETTINGS["batch_size"]
    with recorded_validations() as validations:
        val.main(opt)
    training, standalone = FINAL_VALIDATION[reference], validations[-1]
    assert sum(len(d) for d in training.detections.values()) > 0  # detections to compare
    assert training.detections.keys() == standalone.detections.keys()
    assert all(torch.equal(d, standalone.detections[image]) for image, d in training.detections.items())
    assert tuple(standalone.result.metrics) == tuple(training.result.metrics)
    assert np.array_equal(standalone.result.maps, training.result.maps)


@pytest.mark.slow
def test_same_command_same_seed_is_bit_identical(reference, shapes_data, tiny_cfg, tmp_path):
    assert_identical(run_in_process(tmp_path, "again", shapes_data, tiny_cfg), reference)


@pytest.mark.slow
def test_worker_count_does_not_change_results(reference, shapes_data, tiny_cfg, tmp_path):
    run_dir = run_in_process(tmp_path, "workers2", shapes_data, tiny_cfg, workers=2)
    assert_identical(run_dir, reference)
    lines, identical = compare_runs(reference, run_dir)  # compare judges the results, not the changed flag
    assert identical and "  workers: 0 -> 2 (options)" in lines and lines[-1] == "verdict: identical"


@pytest.mark.slow
def test_strict_mode_gives_the_same_weights_as_off_on_cpu(reference, shapes_data, tiny_cfg, tmp_path):
    """On a clean model the audit relaxes nothing, and strict changes no arithmetic on CPU."""
    run_dir = run_in_process(tmp_path, "strict", shapes_data, tiny_cfg, deterministic="strict")
    assert_identical(run_dir, reference)
    report = json.loads((run_dir / "determinism.json").read_text())
    assert report["mode"] == "strict" and report["relaxed_backward"] is False



@pytest.mark.slow
def test_save_interval_writes_checkpoints_but_never_changes_results(reference, shapes_data, tiny_cfg, tmp_path,
                                                                    monkeypatch):
    """A clock that jumps an hour per reading makes --save-interval 1 write last.pt after every batch."""
    from utils.training import run_state

    readings = itertools.count(0.0, 3600.0)
    monkeypatch.setattr(run_state, "time", SimpleNamespace(monotonic=lambda: next(readings)))
    positions, save_last = [], run_state.CheckpointSaver.save_last

    def recording_save_last(saver, state, required=True):
        positions.append(tuple(state["next_position"]))
        return save_last(saver, state, required)

    monkeypatch.setattr(run_state.CheckpointSaver, "save_last", recording_save_last)
    run_dir = run_in_process(tmp_path, "interval", shapes_data, tiny_cfg, save_interval=1)
    assert sum(batch > 0 for _, batch in positions) >= 4, f"mid-epoch saves expected, got {positions}"
    assert_identical(run_dir, reference)

@pytest.mark.slow
def test_different_seeds_give_different_weights(reference, shapes_data, tiny_cfg, tmp_path):
    run_dir = run_in_process(tmp_path, "seed1", shapes_data, tiny_cfg, seed=1)
    assert checksum(run_dir) != checksum(reference)


@pytest.mark.slow
# Killed mid-epoch, after a mid-epoch save. A kill after an epoch's end adds no path: its last.pt is the
# epoch-end save that tests/test_train.py resumes bit-identically, and the kill itself is this one.
@pytest.mark.parametrize("save_interval, wanted", [
    ("0.000001", lambda pos: pos[0] == 1 and pos[1] > 0),
])
def test_sigkill_then_resume_is_bit_identical(reference, shapes_data, tiny_cfg, tmp_path, save_interval, wanted):
    last_pt = tmp_path / "killed" / "weights" / "last.pt"
    cmd = train_cmd(shapes_data, tiny_cfg, tmp_path, "killed", "--save-interval", save_interval)
    position = kill_when(cmd, last_pt, wanted)
    assert position is not None and wanted(position), f"run was not killed at the wanted point: {position}"
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(last_pt)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_identical(tmp_path / "killed", reference)
