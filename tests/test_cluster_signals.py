"""Signals as a cluster delivers them: to the whole process group (``kill -- -PGID``), and SIGUSR1 (docs/cluster.md).

Data-loader workers share the training's process group, so a group signal reaches them too. They must leave it
to the main process, which finishes its step, saves a mid-epoch last.pt and exits 128 + the signal, as when only
the main process is signalled. torchrun jobs, whose every process is signalled, are tests/test_cluster_slurm.py.

Child runs: SIGTERM to the group (its stop), a second SIGTERM during the save, and the one-GPU batch script,
whose simulated srun sends SIGUSR1 to the run and its workers (the SIGUSR1 stop, exit 138) and whose requeued
run resumes; the uninterrupted reference it must match is trained in this process.
"""

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

import train

from tests.conftest import TINY_CFG, write_shapes_dataset
from tests.support.cluster_doc import JOB_ID, bash_array, batch_script, fake_srun, requeues, slurm_job, with_settings
from tests.support.group_signals import (saved_mid_epoch_0, start_in_own_session, tracebacks, wait_for_a_finished_batch,
                                         wait_for_text, wait_until_group_is_gone)
from tests.support.launchers import ROOT, wait_for
from tests.support.process_tree import group_members, job_processes, signal_every_process, still_running
from tests.support.run_outputs import weights_checksum
from utils import dataloaders
from utils.dataset.sampling import DeterministicDataLoader
from utils.training.interrupts import STOP_SIGNALS, GracefulInterrupt

BATCHES = 12  # per epoch: a stop after the first few batches is in the middle of the epoch
TIMEOUT_S = 300


pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


@pytest.fixture
def stop_handlers_restored():
    """GracefulInterrupt leaves a stopping process its own handlers; the test process gets its own back."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def signal_self(signum: int, counted) -> None:
    os.kill(os.getpid(), signum)
    wait_for(counted, 30, f"{signal.Signals(signum).name} was counted")


def test_sigusr1_stops_like_sigterm_with_its_own_exit_code(stop_handlers_restored, log_lines):
    with GracefulInterrupt() as interrupt:
        signal_self(signal.SIGUSR1, lambda: interrupt.requested)
    assert interrupt.requested == signal.SIGUSR1 and interrupt.exit_code == 138
    assert any("SIGUSR1 received: finishing the current step, then saving last.pt" in line for line in log_lines)
    os.kill(os.getpid(), signal.SIGUSR1)  # after the loop: reported, not the default action (which ends the process)
    wait_for(lambda: any("SIGUSR1 received: already stopping" in line for line in log_lines), 30, "the late signal")


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_a_repeat_is_a_second_signal_except_when_torchrun_passes_it_on(under_torchrun, stop_handlers_restored,
                                                                      log_lines):
    exits = []
    with GracefulInterrupt(launcher_passes_signals_on=under_torchrun) as interrupt:
        interrupt._exit_now = lambda name, code: exits.append((name, code))
        signal_self(signal.SIGTERM, lambda: interrupt.requested)
        passed_on = lambda: any("SIGTERM again, passed on by torchrun" in line for line in log_lines)  # noqa: E731
        signal_self(signal.SIGTERM, lambda: exits or passed_on())
        if under_torchrun:
            assert exits == [] and interrupt.count == 1
            signal_self(signal.SIGINT, lambda: exits)  # a different signal still exits at once
            assert exits == [("SIGINT", 128 + signal.SIGINT)]
        else:
            assert exits == [("SIGTERM", 128 + signal.SIGTERM)] and not passed_on()
    assert interrupt.requested == signal.SIGTERM


class _WorkerSignalState(Dataset):
    """Item i: what the worker that loads it sees of the stop signals, at its start and after its init."""

    held_at_start = None

    def __len__(self):
        return 2

    def __getitem__(self, i):
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        return {"held_at_start": sorted(self.held_at_start), "blocked": sorted(set(STOP_SIGNALS) & blocked),
                "handlers": [signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS]}


def _record_then_init(worker_id):
    info = torch.utils.data.get_worker_info()
    info.dataset.held_at_start = set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    dataloaders._worker_init(worker_id)


def test_loader_workers_start_with_the_stop_signals_held_then_ignore_them():
    loader = DeterministicDataLoader(_WorkerSignalState(), batch_size=None, num_workers=1,
                                     worker_init_fn=_record_then_init, persistent_workers=True)
    for _ in range(2):  # the second epoch reuses the persistent worker
        items = list(loader)
        assert all(item["held_at_start"] == sorted(STOP_SIGNALS) for item in items), items
        assert all(item["blocked"] == [] and all(item["handlers"]) for item in items), items
        assert not set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the main thread's mask is back


# ------------------------------------------------------------------ a training run signalled as a process group


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_shapes_dataset(tmp_path_factory.mktemp("group_signals"), n_train=2 * BATCHES, n_val=4)


# One epoch of BATCHES batches with two loader workers; only the interrupt's save writes last.pt mid-epoch.
RUN_KEYWORDS = dict(cfg=str(TINY_CFG), imgsz=64, batch_size=2, epochs=1, device="cpu", workers=2, noplots=True,
                    save_interval=0)


def training_flags(data: Path) -> list:
    """RUN_KEYWORDS as train.py's flags (``batch_size`` -> ``--batch-size``; True: the flag alone), for ``data``."""
    flags = ["--data", data]
    for key, value in RUN_KEYWORDS.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, value]
    return flags


def train_args(data: Path, project: Path, name: str) -> list:
    return [*training_flags(data), "--project", project, "--name", name, "--exist-ok"]


def train_cmd(*args) -> list:
    return [sys.executable, "train.py", *map(str, args)]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> str:
    """The weights checksum of the run, never stopped: train.run in this process, on one thread as the children
    run (launcher_env), since the same run gives the same bits in or out of a child process
    (tests/test_reproducibility.py resumes a killed child to the bits of an in-process reference)."""
    project, threads = tmp_path_factory.mktemp("uninterrupted"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train.run(**RUN_KEYWORDS, data=str(data), project=str(project), name="whole")
    finally:
        torch.set_num_threads(threads)
    return weights_checksum(project / "whole")


def stop_by_group_signal(cmd: list, log: Path, signum: int) -> subprocess.CompletedProcess:
    """Start ``cmd`` in its own process group, send the whole group ``signum`` once a batch is done, and check
    that no process of the group outlives the main one (it ends its workers before it exits)."""
    proc = start_in_own_session(cmd, log)
    try:
        wait_for_a_finished_batch(proc, log, TIMEOUT_S)
        os.killpg(proc.pid, signum)
        proc.wait(timeout=TIMEOUT_S)
        assert group_members(proc.pid) == [], log.read_text()[-3000:]
    finally:
        end_job(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text())


def end_job(proc: subprocess.Popen) -> None:
    """A test that failed half-way leaves nothing running: the process and all it started."""
    if proc.poll() is None:
        signal_every_process(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_clean_stop(stopped: subprocess.CompletedProcess, signum: int, last_pt: Path) -> int:
    """Exit 128 + signal, no traceback, a mid-epoch last.pt and its resume line; returns the saved batch."""
    out = stopped.stdout
    assert stopped.returncode == 128 + signum, out[-3000:]
    assert not tracebacks(out) and "DataLoader worker" not in out, out[-3000:]
    assert f"{signal.Signals(signum).name} received: finishing the current step" in out, out[-3000:]
    assert f"Resume with:\n    python train.py --resume {last_pt}" in out, out[-3000:]
    return saved_mid_epoch_0(last_pt, BATCHES)


@pytest.mark.slow
def test_sigterm_to_the_process_group_saves_mid_epoch(data, tmp_path):
    """What ``kill -TERM -- -PGID`` sends: the workers used to die first and the run ended in a traceback.
    That a stop signal's mid-epoch last.pt resumes to the uninterrupted bits is the one-GPU batch script's test
    below (the save does not depend on which stop signal asked for it)."""
    cmd = train_cmd(*train_args(data, tmp_path, "stopped"))
    stopped = stop_by_group_signal(cmd, tmp_path / "stopped.log", signal.SIGTERM)
    assert_clean_stop(stopped, signal.SIGTERM, tmp_path / "stopped" / "weights" / "last.pt")


@pytest.mark.slow
def test_a_second_group_signal_exits_at_once_and_the_workers_follow(data, tmp_path):
    """The first SIGTERM's save is slowed down (tests/support/fault_launcher.py), so the second arrives during it."""
    cmd = [sys.executable, ROOT / "tests" / "support" / "fault_launcher.py", "slow:60",
           *train_args(data, tmp_path, "twice")]
    log = tmp_path / "twice.log"
    proc = start_in_own_session(cmd, log)
    try:
        wait_for_a_finished_batch(proc, log, TIMEOUT_S)
        os.killpg(proc.pid, signal.SIGTERM)
        wait_for_text(proc, log, "FAULT: writing last.pt", TIMEOUT_S)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=TIMEOUT_S)
        out = log.read_text()
        assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
        assert "Second SIGTERM: exiting now; abandoned the unfinished write of last.pt" in out, out[-3000:]
        assert not tracebacks(out) and "FAULT: wrote" not in out, out[-3000:]
        # exiting at once leaves the workers to notice their parent is gone (torch looks every 5 s)
        wait_until_group_is_gone(proc.pid, TIMEOUT_S)
    finally:
        end_job(proc)


@pytest.mark.slow
def test_the_one_gpu_batch_script_requeues_on_138_and_the_requeued_job_resumes(data, uninterrupted, tmp_path):
    """docs/cluster.md's train-1gpu.sbatch as written, only its settings replaced; SLURM's SIGUSR1 reaches every
    process of the job step (here: the simulated srun passes it on), the training and its loader workers, as a
    group signal (``kill -USR1 -- -PGID``) reaches them: this is also the SIGUSR1 group-signal case. The resumed
    run ends with the uninterrupted run's bits."""
    runs = tmp_path / "runs"
    script = tmp_path / "train-1gpu.sbatch"
    script.write_text(with_settings(batch_script("train-1gpu.sbatch"), RUNS=shlex.quote(str(runs)), NAME="one-gpu",
                                    TRAIN_ARGS=bash_array(training_flags(data))))
    env, log = slurm_job(tmp_path), tmp_path / "job.log"
    batch = start_in_own_session(["bash", script], log, env)
    try:
        wait_for_a_finished_batch(batch, log, TIMEOUT_S)
        job = job_processes(batch.pid)
        assert len(job) >= 5, f"bash, srun, train.py and its 2 loader workers expected: {job}"
        os.kill(fake_srun(batch.pid), signal.SIGUSR1)
        batch.wait(timeout=TIMEOUT_S)
        assert still_running(job) == [], log.read_text()[-3000:]  # no loader worker outlives the job
    finally:
        end_job(batch)
    last_pt = runs / "one-gpu" / "weights" / "last.pt"
    saved_batch = assert_clean_stop(subprocess.CompletedProcess(script, batch.returncode, log.read_text()),
                                    signal.SIGUSR1, last_pt)
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"]

    requeued = subprocess.run(["bash", script], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    out = requeued.stdout + requeued.stderr
    assert requeued.returncode == 0, out[-3000:]
    assert f"Resuming {last_pt} from epoch 0, batch {saved_batch}" in out, out[-3000:]
    assert requeues(tmp_path) == [f"requeue {JOB_ID}"]  # a finished run is not requeued
    assert weights_checksum(runs / "one-gpu") == uninterrupted
