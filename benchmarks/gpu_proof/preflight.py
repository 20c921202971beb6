"""What the GPU proof checks about the machine before it starts a training process, and how it sizes them.

- ``/dev/shm``: data-loader workers hand batches over in shared memory; Docker's default of 64 MB
  makes several concurrent runs die of a bus error minutes into the proof.
- The GPU's compute mode: in ``Exclusive_Process`` mode only one process may hold a context, and
  the proof's own process already holds one, so every training process would fail to start.
- Processes: ``jobs`` runs at once, each with ``workers`` train and ``2 * workers`` validation
  loader processes (train.py), sized so that they do not outnumber the cores.
"""

import os
import shutil
import subprocess
from pathlib import Path

from utils.errors import UserError

SHM = Path("/dev/shm")
SHM_NEEDED_MIB = 512  # 6 runs' train and validation prefetch at 256 px stay well below this
EXCLUSIVE = "Exclusive_Process"
GPU_JOBS, CPU_JOBS = 6, 2


def shm_mib(path: Path = SHM) -> tuple[float, float] | None:
    """``(free, total)`` MiB of ``path``, or None where it does not exist."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.free / 2**20, usage.total / 2**20


def compute_mode(index: int) -> str:
    """The GPU's compute mode as nvidia-smi names it (``Default``, ``Exclusive_Process``), or why it is unknown."""
    command = ["nvidia-smi", "-i", str(index), "--query-gpu=compute_mode", "--format=csv,noheader"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    return done.stdout.strip() or f"unknown (nvidia-smi exit {done.returncode})"


def sizes(cuda: bool, plan_workers: int, jobs: int | None, cores: int | None = None) -> tuple[int, int]:
    """``(jobs, workers)``: runs at once, and loader workers per run so that all of them fit ``cores``."""
    cores = cores or os.cpu_count() or 1
    jobs = jobs or (GPU_JOBS if cuda else CPU_JOBS)
    return jobs, max(1, min(plan_workers, cores // (3 * jobs)))  # each worker: 1 train + 2 validation processes


def check(shm: tuple | None, mode: str, jobs: int, workers: int) -> str:
    """The preflight line; a UserError when the machine cannot run the proof's training processes."""
    if mode.startswith(EXCLUSIVE):
        raise UserError(f"the GPU is in {mode} compute mode: the proof's {jobs} training processes cannot share "
                        "it with the proof's own process; set it to Default (nvidia-smi -c DEFAULT) and rerun")
    shm_text = "absent" if shm is None else f"{shm[0]:.0f} MiB free of {shm[1]:.0f} MiB"
    if shm is not None and shm[0] < SHM_NEEDED_MIB:
        raise UserError(f"/dev/shm has {shm_text}; the proof's data loaders need {SHM_NEEDED_MIB} MiB "
                        "(Docker's default is 64 MB): start the container with --shm-size=2g or --ipc=host")
    return (f"preflight: /dev/shm {shm_text}; GPU compute mode {mode}; {jobs} training processes at once, "
            f"{workers} train + {2 * workers} validation loader workers each, on {os.cpu_count()} cores")
