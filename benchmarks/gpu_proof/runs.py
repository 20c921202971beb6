"""Training runs for the GPU proof: ``train.py`` in separate processes, SIGKILL and resume, checksums.

Each run is its own Python process, as a user would start it, with its output in ``NAME.log``
beside its run folder. The environment is the caller's minus ``CUBLAS_WORKSPACE_CONFIG``, so
``train.py`` has to set that variable itself, in time. Runs whose model uses a block from
``benchmarks/gpu_proof/modules.py`` start through
``python -c "import benchmarks.gpu_proof.modules, train; train.cli()"`` in the repository root
(train.py has no flag for user modules; importing the module registers the block).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.gpu_proof.report import DeadlineExceeded

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_WITH_PROOF_MODULES = "import benchmarks.gpu_proof.modules, train; train.cli()"  # started in ROOT
CHECKSUM_LINE = re.compile(r"Final EMA weights sha256[^:]*: ([0-9a-f]{64})")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")
# Mid-epoch in both plans (4 batches per epoch in the quick one, 6 in the full one) and, with warm-up
# off and 4 batches per optimizer step (NOMINAL_BATCH 64 / batch 16), after 2 of the 4 batches' gradients.
KILL_AFTER_BATCH = 2


def read_log(log_file: Path) -> str:
    """A run's output without colour codes."""
    return ANSI_CODE.sub("", log_file.read_text(errors="replace"))


@dataclass
class RunSettings:
    """The flags shared by a group of runs."""

    data: Path
    project: Path
    device: str
    imgsz: int
    epochs: int
    batch_size: int
    workers: int
    mode: str = "strict"
    custom_modules: bool = False  # start through LAUNCH_WITH_PROOF_MODULES
    threads: int | None = None  # OMP_NUM_THREADS of each run (CPU runs side by side share the cores)
    extra: list = field(default_factory=list)

    def command(self, cfg: Path, name: str, *overrides: str) -> list:
        """The command line of one run; ``overrides`` come last, so they win."""
        return launcher(self.custom_modules) + self.flags(cfg, name, *overrides)

    def flags(self, cfg: Path, name: str, *overrides: str) -> list:
        """train.py's flags of one run."""
        return ["--data", str(self.data), "--cfg", str(cfg), "--project", str(self.project), "--name", name,
                 "--imgsz", str(self.imgsz), "--epochs", str(self.epochs), "--batch-size", str(self.batch_size),
                 "--workers", str(self.workers), "--device", self.device, "--deterministic", self.mode,
                 "--noplots", "--exist-ok", "--save-interval", "0", *self.extra, *overrides]


def launcher(custom_modules: bool) -> list:
    """``[python, train.py]``, or the ``-c`` launcher that registers the proof's blocks first."""
    return [sys.executable, "-c", LAUNCH_WITH_PROOF_MODULES] if custom_modules else [sys.executable, "train.py"]


def fault_launcher(custom_modules: bool, kill_after_batch: int) -> list:
    """The launcher of a run that saves ``last.pt`` after ``kill_after_batch`` batches, then SIGKILLs itself
    (benchmarks/gpu_proof/fault_train.py: a callback, no switch in train.py)."""
    return [sys.executable, "-m", "benchmarks.gpu_proof.fault_train", "--kill-after-batch", str(kill_after_batch),
            *(["--proof-modules"] if custom_modules else [])]


def child_env(threads: int | None = None) -> dict:
    """The environment of a run: the caller's, without CUBLAS_WORKSPACE_CONFIG."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


@dataclass
class RunResult:
    """A finished (or killed) process: its exit code, log and run folder."""

    name: str
    returncode: int
    log: str
    run_dir: Path
    seconds: float
    timed_out: bool = False  # still going at the proof's deadline, and killed for it

    def checksum(self) -> str:
        """The final EMA weights' SHA-256 from ``weights/sha256.txt``."""
        return (self.run_dir / "weights" / "sha256.txt").read_text().split()[0]

    def printed_checksum(self) -> str | None:
        """The last ``Final EMA weights sha256: ...`` line of the log."""
        found = CHECKSUM_LINE.findall(self.log)
        return found[-1] if found else None

    def report(self) -> dict:
        """The run's ``determinism.json``."""
        return json.loads((self.run_dir / "determinism.json").read_text())

    def tail(self) -> str:
        """The last non-empty log line, for one-line failure reasons."""
        lines = [line.strip() for line in self.log.splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(no output)"


def _start(cmd: list, log_file: Path, threads: int | None) -> subprocess.Popen:
    """Start ``cmd`` in ROOT in its own process group, output to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as log:
        return subprocess.Popen(cmd, cwd=ROOT, env=child_env(threads), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process and its data-loader workers (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_to_end(cmd: list, project: Path, name: str, timeout: float, threads: int | None = None) -> RunResult:
    """Run ``cmd`` to completion (killed after ``timeout`` seconds, then returncode is -9)."""
    log_file = project / f"{name}.log"
    t0 = time.monotonic()
    proc = _start(cmd, log_file, threads)
    timed_out = False
    try:
        proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    return RunResult(name, proc.returncode, read_log(log_file), project / name, time.monotonic() - t0, timed_out)


def _mid_epoch_position(last_pt: Path) -> list | None:
    """``[epoch, batch, batches accumulated since the last optimizer step]`` of a mid-epoch ``last.pt`` in
    epoch 0 (batch > 0 and still resumable), else None."""
    if not last_pt.exists():
        return None
    ckpt = torch.load(last_pt, weights_only=True, map_location="cpu")
    position = ckpt.get("next_position")
    if ckpt.get("optimizer") is None or not position or position[1] <= 0:
        return None
    return [*position, position[1] - 1 - int(ckpt["last_opt_step"])]


def kill_mid_epoch(cmd: list, project: Path, name: str, timeout: float,
                   threads: int | None = None) -> tuple[list | None, RunResult]:
    """Run ``cmd``, a :func:`fault_launcher` command: it saves ``last.pt`` mid-epoch, then SIGKILLs itself.

    Returns the recorded position ``[epoch, batch, batches of pending gradient]`` (None unless the run
    died of its SIGKILL with a mid-epoch ``last.pt``) and the killed run.
    """
    log_file = project / f"{name}.log"
    t0 = time.monotonic()
    proc = _start(cmd, log_file, threads)
    timed_out = False
    try:
        proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc)  # also its data-loader workers, orphaned by the SIGKILL
    killed = proc.returncode == -signal.SIGKILL and not timed_out
    position = _mid_epoch_position(project / name / "weights" / "last.pt") if killed else None
    return position, RunResult(name, proc.returncode, read_log(log_file), project / name, time.monotonic() - t0,
                               timed_out)


def resume(run: RunResult, settings: RunSettings, timeout: float) -> RunResult:
    """``train.py --resume RUN/weights/last.pt`` to the end; the log goes to ``RUN-resume.log``."""
    cmd = launcher(settings.custom_modules) + ["--resume", str(run.run_dir / "weights" / "last.pt"),
                                               "--save-interval", "0"]
    resumed = run_to_end(cmd, settings.project, f"{run.name}-resume", timeout, settings.threads)
    return RunResult(resumed.name, resumed.returncode, resumed.log, run.run_dir, resumed.seconds, resumed.timed_out)


def kill_and_resume(settings: RunSettings, cfg: Path, name: str, timeout_at: float) -> tuple:
    """SIGKILL a run mid-epoch, resume it; returns ``(position, resumed RunResult)``."""
    cmd = fault_launcher(settings.custom_modules, KILL_AFTER_BATCH) + settings.flags(cfg, name)
    position, killed = kill_mid_epoch(cmd, settings.project, name, timeout_at - time.monotonic(), settings.threads)
    if killed.timed_out:
        finished(killed)  # raises DeadlineExceeded
    if position is None:
        raise RuntimeError(f"{name}: no mid-epoch checkpoint before the run ended (exit {killed.returncode}): "
                           f"{killed.tail()}")
    return position, resume(killed, settings, timeout_at - time.monotonic())


def run_named(settings: RunSettings, cfg: Path, name: str, timeout_at: float, *overrides: str) -> RunResult:
    """One run of ``cfg`` called ``name`` with ``overrides``, to the end or ``timeout_at`` (monotonic)."""
    return run_to_end(settings.command(cfg, name, *overrides), settings.project, name,
                      timeout_at - time.monotonic(), settings.threads)


def finished(run: RunResult) -> None:
    """Raise with the log's last line unless ``run`` exited 0 (DeadlineExceeded if the deadline killed it)."""
    if run.timed_out:
        raise DeadlineExceeded(f"{run.name} was still running at the proof's deadline and was killed after "
                               f"{run.seconds:.0f} s")
    if run.returncode != 0:
        raise RuntimeError(f"{run.name} exited {run.returncode}: {run.tail()}")
