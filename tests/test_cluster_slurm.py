"""torchrun jobs signalled as SLURM and systemd signal them: every process of the job, ranks and loader workers
included, so each rank also gets torchrun's copy of the signal. Two ranks on gloo (CPU), slow tier.

docs/cluster.md's train.sbatch runs as written, only its settings replaced, with ``srun`` and ``scontrol``
simulated (tests/support/fake_slurm.py). The one-process script is tested in tests/test_cluster_signals.py.
"""

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_CFG, write_shapes_dataset
from tests.support.cluster_doc import JOB_ID, bash_array, batch_script, requeues, slurm_job, with_settings
from tests.support.group_signals import (assert_only_torchrun_tracebacks, saved_mid_epoch_0, start_in_own_session,
                                         wait_for_a_finished_batch)
from tests.support.launchers import ROOT, launcher_env
from tests.support.process_tree import job_processes, signal_every_process, still_running
from tests.support.run_outputs import weights_checksum
from tests.support.two_nodes import free_port

NPROC = 2
BATCHES = 12  # per epoch and rank
TIMEOUT_S = 400


pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


def training_flags(data: Path) -> list:
    """One epoch of BATCHES steps per rank, two loader workers per rank; last.pt is written only by a stop."""
    return ["--data", data, "--cfg", TINY_CFG, "--imgsz", "64", "--batch-size", 2 * NPROC, "--epochs", "1",
            "--device", "cpu", "--workers", "2", "--noplots", "--save-interval", "0"]


def torchrun_cmd(*args) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", "train.py",
            *map(str, args)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_shapes_dataset(tmp_path_factory.mktemp("cluster_slurm"), n_train=BATCHES * 2 * NPROC, n_val=4)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> str:
    """The weights checksum of the two-rank run, never stopped."""
    project = tmp_path_factory.mktemp("uninterrupted")
    done = subprocess.run(torchrun_cmd(*training_flags(data), "--project", project, "--name", "whole"), cwd=ROOT,
                          env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return weights_checksum(project / "whole")


def end_job(proc: subprocess.Popen) -> None:
    """A test that failed half-way leaves nothing running: the process and all it started."""
    if proc.poll() is None:
        signal_every_process(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_saved_mid_epoch(out: str, signum: int, last_pt: Path) -> int:
    """Every rank stopped after the same step without a traceback of its own, rank 0 saved; returns the batch."""
    assert_only_torchrun_tracebacks(out)
    assert f"{signal.Signals(signum).name} received: finishing the current step" in out, out[-3000:]
    assert f"with train.py's arguments replaced by --resume {last_pt}" in out, out[-3000:]
    return saved_mid_epoch_0(last_pt, BATCHES)


def write_script(folder: Path, runs: Path, data: Path) -> Path:
    """train.sbatch with a tiny CPU run in its settings, on a free rendezvous port."""
    script = folder / "train.sbatch"
    script.write_text(with_settings(batch_script("train.sbatch"), RUNS=shlex.quote(str(runs)), NAME="nodes",
                                    TRAIN_ARGS=bash_array(training_flags(data)), GPUS_PER_NODE=str(NPROC),
                                    PORT=str(free_port())))
    return script


@pytest.mark.slow
def test_the_batch_script_passes_the_warning_on_requeues_and_the_requeued_job_resumes(data, uninterrupted,
                                                                                      tmp_path):
    """``--signal=B:USR1``: SIGUSR1 reaches the batch script alone; its trap passes it to srun, which signals every
    process of the step (torchrun, both ranks, their loader workers), and torchrun passes it on once more."""
    runs, env, log = tmp_path / "runs", slurm_job(tmp_path), tmp_path / "job.log"
    script = write_script(tmp_path, runs, data)
    batch = start_in_own_session(["bash", script], log, env)
    try:
        wait_for_a_finished_batch(batch, log, TIMEOUT_S)
        job = job_processes(batch.pid)
        os.kill(batch.pid, signal.SIGUSR1)
        batch.wait(timeout=TIMEOUT_S)
        assert still_running(job) == []
    finally:
        end_job(batch)
    out = log.read_text()
    assert batch.returncode == 1, out[-3000:]  # torchrun's exit code after it passed a signal on
    last_pt = runs / "nodes" / "weights" / "last.pt"
    saved_batch = assert_saved_mid_epoch(out, signal.SIGUSR1, last_pt)
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"]

    requeued = subprocess.run(["bash", write_script(tmp_path, runs, data)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    out = requeued.stdout + requeued.stderr
    assert requeued.returncode == 0, out[-3000:]
    assert f"Resuming {last_pt} from epoch 0, batch {saved_batch}" in out, out[-3000:]
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"]  # no warning this time: not requeued again
    assert weights_checksum(runs / "nodes") == uninterrupted


@pytest.mark.slow
def test_sigterm_to_every_process_of_a_torchrun_job_saves_after_the_same_step(data, tmp_path):
    """What ``scancel``, preemption or ``systemctl stop`` send: each rank gets SIGTERM directly and from torchrun."""
    log = tmp_path / "job.log"
    proc = start_in_own_session(torchrun_cmd(*training_flags(data), "--project", tmp_path, "--name", "scancel"), log)
    try:
        wait_for_a_finished_batch(proc, log, TIMEOUT_S)
        job = signal_every_process(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT_S)
        assert still_running(job) == []
    finally:
        end_job(proc)
    out = log.read_text()
    assert proc.returncode == 1, out[-3000:]
    assert_saved_mid_epoch(out, signal.SIGTERM, tmp_path / "scancel" / "weights" / "last.pt")
