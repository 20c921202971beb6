"""Two torchrun launchers on one machine acting as two nodes of one process each (gloo on CPU, 127.0.0.1)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.launchers import child_pids, launcher_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a rendezvous port for a launcher)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(node_rank: int, port: int, train_args: list) -> list:
    """One node's launcher: ``torchrun --nnodes 2 --nproc-per-node 1 --node-rank K`` on localhost."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "train.py", *map(str, train_args)]


def start_two_nodes(train_args: list, logs: Path, **env: str) -> list:
    """Start both node launchers at once, each in its own process group, output to ``logs/nodeK.log``."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for k in (0, 1):
        with open(logs / f"node{k}.log", "w") as log:
            procs.append(subprocess.Popen(node_command(k, port, train_args), cwd=ROOT, env={**launcher_env(), **env},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def stop_all(procs: list) -> None:
    """SIGKILL whatever is left of the launchers and their workers (their own process groups)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_node(launcher: subprocess.Popen) -> None:
    """SIGKILL a node as a machine failure would: the launcher and its workers, which torchrun starts in
    process groups of their own (killing the launcher alone leaves them training)."""
    for pid in [launcher.pid, *child_pids(launcher.pid)]:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone


def wait_for_line(launcher: subprocess.Popen, log: Path, text: str) -> None:
    """Poll ``log`` until ``text`` appears in it; fail with the log's tail if the launcher ends first."""
    while text not in log.read_text():
        assert launcher.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)


def run_two_nodes(train_args: list, logs: Path) -> list:
    """Both node launchers to the end; returns ``[(returncode, output), ...]`` by node rank."""
    procs = start_two_nodes(train_args, logs)
    try:
        codes = [proc.wait(timeout=TIMEOUT_S) for proc in procs]
    finally:
        stop_all(procs)
    return [(code, (logs / f"node{k}.log").read_text()) for k, code in enumerate(codes)]
