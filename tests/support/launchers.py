"""Launching train.py in a child process: its command line, a clean launcher environment, a timed SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def launcher_env() -> dict:
    """This environment minus any DDP variables of an outer launcher, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1"}


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
