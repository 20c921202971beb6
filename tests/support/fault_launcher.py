"""Run train.py's command line with a fault injected into checkpoint writes (for tests/test_faults.py).

    python tests/support/fault_launcher.py SPEC train.py-arguments...

SPEC is one of
    none            no fault
    enospc:K        the first K checkpoint writes succeed; every later one writes half of its
                    bytes, then fails with OSError(ENOSPC) — a disk that fills up mid-write
    slow:SECONDS    every checkpoint write writes half, prints ``FAULT: writing NAME`` on stderr,
                    sleeps SECONDS, writes the rest and prints ``FAULT: wrote NAME``
"""

import contextlib
import errno
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from utils.training import checkpoints  # noqa: E402


class FaultyFile:
    """A file proxy whose ``write`` misbehaves as the spec says; everything else passes through."""

    def __init__(self, f, path: Path, mode: str, seconds: float):
        self._f, self._path, self._mode, self._seconds = f, Path(path), mode, seconds

    def __getattr__(self, name):
        return getattr(self._f, name)

    def write(self, data) -> int:
        data = bytes(data)
        half = len(data) // 2
        self._f.write(data[:half])
        self._f.flush()
        if self._mode == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        print(f"FAULT: writing {self._path.name}", file=sys.stderr, flush=True)
        time.sleep(self._seconds)
        self._f.write(data[half:])
        print(f"FAULT: wrote {self._path.name}", file=sys.stderr, flush=True)
        return len(data)


def install(spec: str) -> None:
    """Wrap the atomic writer that utils.training.checkpoints.save_checkpoint uses."""
    if spec == "none":
        return
    mode, value = spec.split(":")
    real_open = checkpoints.atomic_open
    writes = {"count": 0}

    @contextlib.contextmanager
    def faulty_open(path, file_mode="wb", on_commit=None):
        writes["count"] += 1
        healthy = mode == "enospc" and writes["count"] <= int(value)
        with real_open(path, file_mode, on_commit=on_commit) as f:
            yield f if healthy else FaultyFile(f, path, mode, float(value) if mode == "slow" else 0.0)

    checkpoints.atomic_open = faulty_open


if __name__ == "__main__":
    install(sys.argv[1])
    sys.argv = ["train.py", *sys.argv[2:]]
    train.cli()
