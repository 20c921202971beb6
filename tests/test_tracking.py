"""--logger mlflow / tensorboard: what the real MLflow package stores, read back with MlflowClient.

Every test points MLFLOW_TRACKING_URI at a SQLite store in its own temporary folder.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import yaml

import train
from tests.support.run_outputs import results_rows, weights_checksum
from utils.errors import UserError
from utils.tracking import check_loggers, start_tracking

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(imgsz=64, batch_size=8, workers=0, device="cpu", exist_ok=True)


pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


@pytest.fixture(scope="module")
def module_store(tmp_path_factory) -> str:
    """One SQLite tracking store for this module (creating its tables takes seconds); tests tell their runs
    apart by the run id each run folder records."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture
def store(module_store, monkeypatch) -> str:
    """MLFLOW_TRACKING_URI set to the module's store for this test; returns the URI."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", module_store)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return module_store


def run_id_of(run_dir: Path) -> str:
    return json.loads((run_dir / "mlflow.json").read_text())["run_id"]


def steps(client, run_id: str, key: str) -> list:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def artifact_paths(client, run_id: str, folder=None) -> set:
    return {f.path for f in client.list_artifacts(run_id, folder)}


def fake_run_folder(path: Path) -> Path:
    """The files train.py writes before the first epoch, plus the two checkpoints and a plot."""
    (path / "weights").mkdir(parents=True)
    (path / "opt.yaml").write_text(yaml.safe_dump({"epochs": 3, "imgsz": 64, "logger": ["mlflow"]}))
    (path / "hyp.yaml").write_text(yaml.safe_dump({"lr0": 0.01, "mosaic": 1.0}))
    (path / "determinism.json").write_text(json.dumps({
        "mode": "strict", "nondeterministic_ops": {"aten::index_put": 2}, "world_size": 1, "seed": 0,
        "audit": {"findings": [{"op": "aten::index_put"}], "torch_flagged": []},
        "versions": {"torch": "9.9", "cuda": None, "cudnn": None}, "data_fingerprint": "f" * 64}))
    for name in ("best.pt", "last.pt", "results.png"):
        (path / ("weights" if name.endswith(".pt") else "") / name).write_bytes(b"x")
    return path


# ----------------------------------------------------------------------------------- no training


@pytest.mark.parametrize("logger, module", [("mlflow", "mlflow"), ("tensorboard", "torch.utils.tensorboard")])
def test_missing_package_is_one_user_error(monkeypatch, logger, module):
    monkeypatch.setitem(sys.modules, module, None)  # the next import of it raises ImportError
    with pytest.raises(UserError, match=f"--logger {logger}: the '{logger}' package is not installed; "
                                        f"run 'pip install {logger}'"):
        check_loggers(Namespace(logger=[logger]))
    check_loggers(Namespace())  # a checkpoint from before --logger asks for nothing


@pytest.mark.slow
def test_missing_package_stops_train_py_before_any_folder(shapes_data, tiny_cfg, tmp_path):
    shadow = tmp_path / "shadow" / "mlflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'mlflow'\")\n")
    proc = subprocess.run(
        [sys.executable, "train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
         "--epochs", "1", "--device", "cpu", "--project", str(tmp_path / "runs"), "--logger", "mlflow"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(shadow.parent), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: --logger mlflow:") and "pip install mlflow" in lines[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()


@pytest.mark.slow
def test_tracker_records_params_tags_metrics_and_artifacts(tmp_path, store):
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with start_tracking(Namespace(logger=["mlflow"], resume=False), run_dir, is_main=True) as trackers:
        trackers.log_epoch(0, {"train/box_loss": 0.5, "metrics/mAP50-95_tiny": float("nan")})
        trackers.log_epoch(1, {"train/box_loss": 0.25, "metrics/mAP50-95_tiny": 0.125})
        report = json.loads((run_dir / "determinism.json").read_text())
        report["final_ema_sha256"] = "a" * 64  # what CheckpointSaver.finish adds at the end
        (run_dir / "determinism.json").write_text(json.dumps(report))
    client = MlflowClient(store)
    run = client.get_run(run_id_of(run_dir))
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.data.params == {"opt/epochs": "3", "opt/imgsz": "64", "opt/logger": "['mlflow']",
                               "hyp/lr0": "0.01", "hyp/mosaic": "1.0"}
    tags = run.data.tags
    assert tags["determinism.mode"] == "strict" and tags["determinism.relaxed_ops"] == "aten::index_put x2"
    assert tags["determinism.audit"] == "1 finding(s): aten::index_put"
    assert tags["ema_sha256"] == "a" * 64 and tags["data_fingerprint"] == "f" * 64
    assert tags["torch"] == "9.9" and tags["world_size"] == "1" and "cuda" not in tags
    history = client.get_metric_history(run.info.run_id, "train/box_loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (1, 0.25)]
    assert steps(client, run.info.run_id, "metrics/mAP50-95_tiny") == [1]  # the NaN of epoch 0 is left out
    assert artifact_paths(client, run.info.run_id, "weights") == {"weights/best.pt", "weights/last.pt"}
    assert {"opt.yaml", "hyp.yaml", "determinism.json", "plots"} <= artifact_paths(client, run.info.run_id)
    assert artifact_paths(client, run.info.run_id, "plots") == {"plots/results.png"}


@pytest.mark.slow
def test_a_raised_error_marks_the_run_failed(tmp_path, store):
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with pytest.raises(UserError), start_tracking(Namespace(logger=["mlflow"]), run_dir, is_main=True):
        raise UserError("the final weights could not be saved")
    run = MlflowClient(store).get_run(run_id_of(run_dir))
    assert run.info.status == "FAILED"
    assert not MlflowClient(store).list_artifacts(run.info.run_id)  # nothing of a failed finish is uploaded


def test_only_the_main_process_tracks(tmp_path, store):
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with start_tracking(Namespace(logger=["mlflow", "tensorboard"]), run_dir, is_main=False) as trackers:
        assert trackers.trackers == []
    assert not (run_dir / "mlflow.json").exists()


def test_resume_from_an_older_checkpoint_starts_a_new_run_instead_of_repeating_steps(tmp_path, store, log_lines):
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with start_tracking(Namespace(logger=["mlflow"]), run_dir, is_main=True) as trackers:
        for epoch in range(3):
            trackers.log_epoch(epoch, {"train/box_loss": 1.0 / (epoch + 1)})
    first = run_id_of(run_dir)
    with start_tracking(Namespace(logger=["mlflow"], resume="last.pt"), run_dir, True, start_epoch=1) as trackers:
        trackers.log_epoch(1, {"train/box_loss": 0.75})
    second = run_id_of(run_dir)
    client = MlflowClient(store)
    assert second != first and client.get_run(second).data.tags["resumed_from"] == first
    assert steps(client, first, "train/box_loss") == [0, 1, 2] and steps(client, second, "train/box_loss") == [1]
    assert "already holds epoch 1 or later" in "\n".join(log_lines)


@pytest.mark.slow
def test_unreachable_server_warns_once_and_training_goes_on(tmp_path, monkeypatch, log_lines):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with start_tracking(Namespace(logger=["mlflow"]), run_dir, is_main=True) as trackers:
        trackers.log_epoch(0, {"train/box_loss": 0.5})
        trackers.log_epoch(1, {"train/box_loss": 0.4})
    warnings = [line for line in log_lines if "MLflow" in line and "WARNING" in line]
    assert len(warnings) == 1 and "http://127.0.0.1:9 failed" in warnings[0], log_lines
    assert "training continues without MLflow" in warnings[0]


def test_an_unreachable_evolution_store_warns_once_for_all_generations(tmp_path, monkeypatch, log_lines):
    from utils.tracking.mlflow_run import MlflowTracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    parent = MlflowTracker(tmp_path / "evolve" / "exp", Namespace(), params={}, keep_record=False)
    for generation in range(2):
        child = MlflowTracker(fake_run_folder(tmp_path / "evolve" / "exp" / f"gen{generation}"), Namespace(),
                              parent=parent)
        child.log_epoch(0, {"train/box_loss": 0.5})
        child.end("FINISHED")
    parent.end("FINISHED")
    assert len([line for line in log_lines if "MLflow" in line and "WARNING" in line]) == 1, log_lines


# ----------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_training_run_fills_mlflow_and_tensorboard(shapes_data, tiny_cfg, tmp_path, store):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train.run(cfg=str(tiny_cfg), data=str(shapes_data), epochs=2, project=str(tmp_path / "train"), name="exp",
              logger=["mlflow", "tensorboard"], **FAST)
    run_dir = tmp_path / "train" / "exp"
    client = MlflowClient(store)
    run = client.get_run(run_id_of(run_dir))
    assert run.info.status == "FINISHED"
    assert run.data.params["opt/epochs"] == "2" and run.data.params["hyp/lr0"] == "0.01"
    rows = results_rows(run_dir)
    for key in ("train/box_loss", "metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
                "val/box_loss", "x/lr0"):
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert logged == [(int(r["epoch"]), pytest.approx(float(r[key]), rel=1e-6)) for r in rows], key
    bands = [k for k in rows[0] if k.startswith("metrics/mAP50-95_") and rows[-1][k] != "nan"]
    assert bands and all(steps(client, run.info.run_id, k)[-1] == 1 for k in bands)
    determinism = json.loads((run_dir / "determinism.json").read_text())
    tags = run.data.tags
    assert tags["ema_sha256"] == weights_checksum(run_dir) == determinism["final_ema_sha256"]
    assert tags["determinism.mode"] == determinism["mode"] == "scoped"
    assert tags["data_fingerprint"] == determinism["data_fingerprint"]
    assert tags["torch"] == determinism["versions"]["torch"] and tags["world_size"] == "1"
    assert tags["determinism.audit"] and tags["determinism.relaxed_ops"]
    assert artifact_paths(client, run.info.run_id, "weights") == {"weights/best.pt", "weights/last.pt"}
    assert {"determinism.json", "opt.yaml", "hyp.yaml"} <= artifact_paths(client, run.info.run_id)
    assert "plots/results.png" in artifact_paths(client, run.info.run_id, "plots")
    found = mlflow.search_runs([run.info.experiment_id], output_format="list",
                               filter_string=f"tags.ema_sha256 = '{weights_checksum(run_dir)}'")
    assert [r.info.run_id for r in found] == [run.info.run_id]
    events = EventAccumulator(str(run_dir)).Reload()
    assert [s.step for s in events.Scalars("train/box_loss")] == [0, 1]
    assert events.Scalars("metrics/mAP_0.5")[-1].value == pytest.approx(float(rows[-1]["metrics/mAP_0.5"]))


@pytest.mark.slow
def test_sigterm_marks_killed_and_resume_continues_the_same_run(shapes_data, tiny_cfg, tmp_path, store):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
           "--batch-size", "2", "--epochs", "2", "--workers", "0", "--device", "cpu", "--noplots",
           "--project", str(tmp_path / "train"), "--name", "exp", "--logger", "mlflow"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    headers = 0
    for line in proc.stdout:  # each epoch prints its header first: the second one means epoch 0 is logged
        headers += line.split()[:2] == ["Epoch", "GPU_mem"]
        if headers == 2:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 128 + signal.SIGTERM, out
    run_dir = tmp_path / "train" / "exp"
    client, run_id = MlflowClient(store), run_id_of(run_dir)
    assert client.get_run(run_id).info.status == "KILLED"
    assert steps(client, run_id, "train/box_loss") == [0]
    train.run(resume=str(run_dir / "weights" / "last.pt"))  # the stop needs a process of its own, the resume not
    assert run_id_of(run_dir) == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    assert steps(client, run_id, "train/box_loss") == [0, 1]  # each epoch once: the stopped epoch 1 too
    assert client.get_run(run_id).data.tags["ema_sha256"] == weights_checksum(run_dir)


@pytest.mark.slow
def test_failed_final_save_marks_the_run_failed(shapes_data, tiny_cfg, tmp_path, store, monkeypatch):
    from utils.training.run_state import CheckpointNotSaved, CheckpointSaver

    def fail(self, final_position):
        raise CheckpointNotSaved("the final weights could not be saved")

    monkeypatch.setattr(CheckpointSaver, "finish", fail)
    with pytest.raises(CheckpointNotSaved):
        train.run(cfg=str(tiny_cfg), data=str(shapes_data), epochs=1, project=str(tmp_path / "train"), name="exp",
                  noplots=True, logger=["mlflow"], **FAST)
    run = MlflowClient(store).get_run(run_id_of(tmp_path / "train" / "exp"))
    assert run.info.status == "FAILED" and steps(MlflowClient(store), run.info.run_id, "train/box_loss") == [0]


@pytest.mark.slow
def test_evolve_logs_each_generation_as_a_child_run(shapes_data, tiny_cfg, tmp_path, store):
    train.run(cfg=str(tiny_cfg), data=str(shapes_data), epochs=1, evolve=2, project=str(tmp_path / "evolve"),
              name="evo", logger=["mlflow"], **FAST)
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("evolve").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(r.info.run_name for r in children) == ["gen0", "gen1"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in children)
    assert {"evolve.csv", "hyp_evolve.yaml"} <= artifact_paths(client, parents[0].info.run_id)


@contextlib.contextmanager
def sqlite_lock_wait(milliseconds: int):
    """MLflow makes each SQLite session wait up to 20 s for a lock (``PRAGMA busy_timeout = 20000``); here the
    wait is ``milliseconds``. Only how long a locked store is waited on changes, not whether it fails."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def shorter_wait(conn, cursor, statement, parameters, context, executemany):
        return BUSY_TIMEOUT.sub(f"PRAGMA busy_timeout = {milliseconds}", statement), parameters

    event.listen(Engine, "before_cursor_execute", shorter_wait, retval=True)
    try:
        yield
    finally:
        event.remove(Engine, "before_cursor_execute", shorter_wait)


BUSY_TIMEOUT = re.compile(r"PRAGMA busy_timeout\s*=\s*\d+", re.I)


@pytest.mark.slow
def test_a_locked_store_is_one_plain_warning_and_no_mlflow_traceback(store, tmp_path, log_lines, capfd):
    """A real failure: another process holds the SQLite store's write lock (as a read-only or full store
    refuses writes); MLflow used to log 'SQLAlchemy database error' with a traceback of its own. The lock is
    held until both epochs are logged, so a wait of 0.2 s instead of MLflow's 20 s fails the same way."""
    import sqlite3

    db = store[len("sqlite:///"):]
    run_dir = fake_run_folder(tmp_path / "proj" / "exp")
    with sqlite_lock_wait(200), start_tracking(Namespace(logger=["mlflow"]), run_dir, is_main=True) as trackers:
        holder = sqlite3.connect(db, timeout=0)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            trackers.log_epoch(0, {"train/box_loss": 0.5})
            trackers.log_epoch(1, {"train/box_loss": 0.4})
        finally:
            holder.rollback()
            holder.close()
    warnings = [line for line in log_lines if "WARNING" in line]
    assert len(warnings) == 1 and "failed (the store is locked by another process)" in warnings[0], log_lines
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "SQLAlchemy" not in out + err, err[-3000:]


@pytest.mark.parametrize("message, words", [
    ("(sqlite3.OperationalError) attempt to write a readonly database", "the store is read-only"),
    ("(sqlite3.OperationalError) database or disk is full", "the disk holding the store is full"),
    ("[Errno 28] No space left on device: '/store/mlruns'", "the disk holding the store is full"),
    ("HTTPConnectionPool(host='h', port=5000): Max retries exceeded", "the tracking server does not answer"),
    ("INVALID_PARAMETER_VALUE: metric key too long", "Autoflush: the session was flushed too early"),
])
def test_store_failures_are_named_in_plain_words(message, words):
    from utils.tracking.mlflow_run import plain_cause

    try:
        try:
            raise OSError(message)
        except OSError as cause:
            raise RuntimeError("Autoflush: the session was flushed too early") from cause
    except RuntimeError as error:
        named = plain_cause(error)
    assert named == words  # an unknown cause: the first line of what the store raised
