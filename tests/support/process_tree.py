"""Processes by group and by descent, read from Linux /proc (no torch import: the fake srun uses it too).

``kill -- -PGID`` reaches one process group. SLURM (proctrack/cgroup) and systemd (control-group kill mode)
signal every process of a job, whatever its group: torchrun starts each worker in a session of its own, so
only a walk over the job's process tree (:func:`signal_every_process`) reaches them all.
"""

import os
from pathlib import Path


def _stat_fields(pid: int) -> list:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ... (empty once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return text.rsplit(")", 1)[1].split()


def _all_pids() -> list:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def group_members(pgid: int) -> list:
    """Processes of process group ``pgid``, zombies included (they are not reaped yet)."""
    return [pid for pid in _all_pids() if (fields := _stat_fields(pid)) and int(fields[2]) == pgid]


def job_processes(root: int) -> list:
    """``root`` and every process descended from it, parents first."""
    children = {}
    for pid in _all_pids():
        if fields := _stat_fields(pid):
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def signal_every_process(root: int, signum: int) -> list:
    """Send ``signum`` to ``root`` and all its descendants, as SLURM and systemd signal a job; returns the pids."""
    pids = job_processes(root)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:  # ended since the walk
            pass
    return pids


def command_line(pid: int) -> list:
    """The arguments ``pid`` was started with (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except (FileNotFoundError, ProcessLookupError):
        return []


def still_running(pids: list) -> list:
    """Those of ``pids`` that exist and are not zombies."""
    return [pid for pid in pids if (fields := _stat_fields(pid)) and fields[0] != "Z"]
