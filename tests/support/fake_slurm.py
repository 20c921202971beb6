"""Stand-ins for SLURM's ``srun`` and ``scontrol``, to run docs/cluster.md's batch scripts on one machine.

    python tests/support/fake_slurm.py srun COMMAND...
    python tests/support/fake_slurm.py scontrol show hostnames NODELIST
    python tests/support/fake_slurm.py scontrol requeue JOBID

``srun`` runs COMMAND as the job step's one task, in a session of its own. A signal it receives (from the
batch script's trap) goes on to every process of the step, as slurmstepd signals a step with
proctrack/cgroup. It exits with the task's exit code, or 128 + the signal that killed the task (srun's rule).
``scontrol show hostnames`` names this machine as the job's one node; ``scontrol requeue JOBID`` appends the
line ``requeue JOBID`` to the file that ``FAKE_SLURM_LOG`` names.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.process_tree import signal_every_process  # noqa: E402

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def srun(command: list) -> int:
    task = subprocess.Popen(command, start_new_session=True)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: signal_every_process(task.pid, signum))
    code = task.wait()
    return 128 - code if code < 0 else code


def scontrol(args: list) -> int:
    if args[:2] == ["show", "hostnames"]:
        print("127.0.0.1")
        return 0
    if args[:1] == ["requeue"] and len(args) == 2:
        with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
            log.write(f"requeue {args[1]}\n")
        return 0
    print(f"fake scontrol: {' '.join(args)} is not simulated", file=sys.stderr)
    return 1


if __name__ == "__main__":
    tool, rest = sys.argv[1], sys.argv[2:]
    sys.exit(srun(rest) if tool == "srun" else scontrol(rest))
