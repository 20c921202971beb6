"""Launching train.py in a child process: its command line, a clean launcher environment, a timed SIGKILL."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def launcher_env() -> dict:
    """This environment minus any DDP variables of an outer launcher, one thread per rank.

    PYTHONFAULTHANDLER: a rank that aborts (a rare ``terminate called without an active exception`` at DDP
    exit, docs/reliability.md) prints every thread's Python stack into the test's captured stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def train_cmd(data, cfg, project: Path, name: str, *extra) -> list:
    """A 2-epoch, 64-px, CPU ``train.py`` command line for the run folder ``project/name``, then ``extra``."""
    return [sys.executable, "train.py", "--data", str(data), "--cfg", str(cfg), "--project", str(project),
            "--name", name, "--imgsz", "64", "--batch-size", "4", "--epochs", "2", "--device", "cpu",
            "--workers", "0", "--noplots", "--exist-ok", *extra]


def kill_when(cmd, last_pt: Path, position_ok, timeout: float = 240) -> list:
    """Start ``cmd``, SIGKILL it once ``last.pt`` records a position accepted by ``position_ok``.

    The run is stopped (SIGSTOP) while ``last.pt`` is read, so it cannot save again, or finish, between the
    read and the kill: the killed run's ``last.pt`` is the one that was judged, however busy the machine is.
    """
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    position = None
    try:
        while time.time() < deadline and proc.poll() is None:
            if last_pt.exists():
                proc.send_signal(signal.SIGSTOP)
                ckpt = torch.load(last_pt, weights_only=True)
                position = ckpt.get("next_position")
                if ckpt.get("optimizer") is not None and position_ok(position):
                    proc.send_signal(signal.SIGKILL)
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    return position


def child_pids(pid: int) -> list:
    """The direct children of ``pid`` (Linux /proc): torchrun's worker processes."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def proc_status(pid: int) -> dict:
    """``/proc/<pid>/status`` as a dict of its fields (Linux)."""
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def process_state(pid: int) -> str:
    """The state letter of ``pid`` (``T`` stopped, ``Z`` a zombie, ...), or ``X`` once it is gone."""
    try:
        return proc_status(pid)["State"][0]
    except FileNotFoundError:
        return "X"


def has_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits undelivered on ``pid`` (for a stopped process: sent, not yet handled)."""
    status = proc_status(pid)
    return any(int(status[field], 16) >> (signum - 1) & 1 for field in ("SigPnd", "ShdPnd"))


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out after {timeout} s waiting until {what}"
        time.sleep(0.01)


@contextlib.contextmanager
def workers_frozen(launcher: subprocess.Popen, timeout: float = 120):
    """Stop (SIGSTOP) the launcher's worker processes, wait until every one is seen stopped, yield their ids,
    and let them go on (SIGCONT) at the end. While they are stopped nothing they write changes.

    The wait matters for a signal sent inside: a worker that received SIGSTOP but was not yet stopped takes a
    lower-numbered signal such as SIGTERM first, and then shows nothing pending.
    """
    workers = child_pids(launcher.pid)
    assert workers, "the launcher has no worker processes to stop"
    try:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        # a short-lived child of the launcher may end in between (seen on a loaded machine): it writes nothing
        wait_for(lambda: all(process_state(pid) in "TZX" for pid in workers), timeout, "every worker is stopped")
        yield [pid for pid in workers if process_state(pid) == "T"]
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def sigterm_passed_on(launcher: subprocess.Popen, workers: list, timeout: float = 120) -> None:
    """SIGTERM ``launcher`` (torchrun) as a scheduler would, and wait until it has passed the signal on to every
    one of its ``workers``, frozen by :func:`workers_frozen`: each then handles it in the step it was stopped
    in, however long a busy machine takes to deliver it (unfrozen, a loaded machine once let the workers run
    to the end of the epoch first)."""
    launcher.send_signal(signal.SIGTERM)
    wait_for(lambda: all(has_pending(pid, signal.SIGTERM) for pid in workers), timeout,
             "the launcher has passed SIGTERM on to every worker")


def saved_position(last_pt: Path):
    try:
        return tuple(torch.load(last_pt, weights_only=True)["next_position"])
    except (FileNotFoundError, RuntimeError, EOFError, KeyError):
        return None  # not written yet, or being replaced right now


def file_version(path: Path):
    """What tells one save of ``path`` from the next (each is an atomic replace: a new inode), or None while
    it is absent."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def sigterm_at(cmd: list, last_pt: Path, log: Path, position: tuple = (1, 0), timeout: float = 400):
    """Start ``cmd`` and send its launcher SIGTERM as soon as ``last.pt`` records ``position`` or later.

    Each look at ``last.pt`` is made with the workers stopped, so none is missed while the file is replaced (it
    is saved after every step) and none goes stale before the signal: the workers handle it in the step they
    were stopped in, just after ``position``, on an idle machine (fast steps) as on a loaded one (slow
    delivery). The workers are stopped only for a save not looked at yet: while the file is absent or
    unchanged they train on, which spares the many stops of their start-up and of each step.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=launcher_env(), stdout=out, stderr=subprocess.STDOUT)
        deadline, judged = time.time() + timeout, None
        while proc.poll() is None and time.time() < deadline:
            if file_version(last_pt) not in (None, judged) and child_pids(proc.pid):
                with workers_frozen(proc) as workers:
                    judged = file_version(last_pt)  # frozen: the save read below is the one judged
                    saved = saved_position(last_pt)
                    if saved is not None and saved >= position:
                        sigterm_passed_on(proc, workers)
                        break
            time.sleep(0.05)
        proc.wait(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text())
