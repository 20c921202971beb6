"""Tasks for map_in_workers tests: importable by a spawned worker."""

import os
import time
from pathlib import Path


def report_pid_and_wait(path: str) -> None:
    """Write this worker's pid to ``path``, then wait a minute (long past any test)."""
    Path(path).write_text(str(os.getpid()))
    time.sleep(60)
