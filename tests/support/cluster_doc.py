"""docs/cluster.md's batch scripts, run on one machine: SLURM's variables set, ``srun`` and ``scontrol``
simulated (tests/support/fake_slurm.py), only the settings at the top of a script replaced."""

import os
import re
import shlex
import sys
from pathlib import Path

from tests.support.launchers import ROOT, launcher_env
from tests.support.process_tree import command_line, job_processes

DOC = ROOT / "docs" / "cluster.md"
JOB_ID = "4242"


def batch_script(name: str) -> str:
    """The bash block the doc gives under the line "`name`:"."""
    found = re.search(rf"`{re.escape(name)}`:\n\n```bash\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"docs/cluster.md gives no script `{name}`"
    return found[1]


def bash_array(values) -> str:
    return "(" + " ".join(shlex.quote(str(v)) for v in values) + ")"


def with_settings(script: str, **settings) -> str:
    """``script`` with the line ``NAME=...`` of each setting replaced; each must be there exactly once."""
    for name, value in settings.items():
        script, count = re.subn(rf"^{name}=.*$", f"{name}={value}", script, flags=re.M)
        assert count == 1, f"the script sets {name} {count} times, not once"
    return script


def slurm_job(folder: Path) -> dict:
    """The environment of a simulated one-node SLURM job: fake ``srun``/``scontrol`` first on PATH, SLURM's
    variables, and ``FAKE_SLURM_LOG`` (where a requeue is recorded) in ``folder``."""
    bin_dir = folder / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("srun", "scontrol"):
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT}/tests/support/fake_slurm.py" {tool} "$@"\n')
        wrapper.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**launcher_env(), "PATH": path, "SLURM_JOB_ID": JOB_ID, "SLURM_NNODES": "1",
            "SLURM_JOB_NODELIST": "node001", "FAKE_SLURM_LOG": str(folder / "slurm.log")}


def requeues(folder: Path) -> list:
    log = folder / "slurm.log"
    return log.read_text().splitlines() if log.exists() else []


def fake_srun(batch_pid: int) -> int | None:
    """The pid of the simulated ``srun`` the batch script started, or None while there is none."""
    for pid in job_processes(batch_pid):
        args = command_line(pid)
        if len(args) > 2 and args[1].endswith("fake_slurm.py") and args[2] == "srun":
            return pid
    return None
