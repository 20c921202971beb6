"""Two torchrun launchers on one machine acting as two nodes (gloo on CPU), against one two-process launcher.

The project promises bit-identical results for the same command on the same number of processes;
``--nnodes 2 --nproc-per-node 1`` and ``--standalone --nproc-per-node 2`` both give a world of two
ranks, so they must end with the same weights and the same results.csv. A second test kills one
node as a machine failure would and checks that the other exits non-zero instead of hanging.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.run_outputs import results_rows as rows, weights_checksum as checksum
from tests.test_ddp import launcher_env

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--imgsz", "64", "--batch-size", "8", "--epochs", "1", "--device", "cpu", "--workers", "0",
          "--noplots", "--exist-ok", "--save-interval", "0"]
TIMEOUT_S = 600


def free_port() -> int:
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


def children(pid: int) -> list:
    """Process ids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def kill_node(launcher: subprocess.Popen) -> None:
    """SIGKILL a node as a machine failure would: the launcher and its workers, which torchrun starts in
    process groups of their own (killing the launcher alone leaves them training)."""
    for pid in [launcher.pid, *children(launcher.pid)]:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone


def run_two_nodes(train_args: list, logs: Path) -> list:
    """Both node launchers to the end; returns ``[(returncode, output), ...]`` by node rank."""
    procs = start_two_nodes(train_args, logs)
    try:
        codes = [proc.wait(timeout=TIMEOUT_S) for proc in procs]
    finally:
        stop_all(procs)
    return [(code, (logs / f"node{k}.log").read_text()) for k, code in enumerate(codes)]


@pytest.mark.slow
def test_two_nodes_on_one_machine_equal_two_processes_on_one_node(shapes_data, tiny_cfg, tmp_path):
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, *COMMON]
    nodes = run_two_nodes([*args, "--name", "nodes"], tmp_path.parent / f"{tmp_path.name}-logs")
    for node_rank, (code, output) in enumerate(nodes):
        assert code == 0, f"node {node_rank}:\n{output[-3000:]}"
    single = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "train.py", *map(str, args), "--name", "one-node"], cwd=ROOT, env=launcher_env(),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert single.returncode == 0, single.stderr[-3000:]
    assert '"world_size": 2' in (tmp_path / "nodes" / "determinism.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nodes", "one-node"]  # node 1 wrote no run folder
    assert checksum(tmp_path / "nodes") == checksum(tmp_path / "one-node")
    assert rows(tmp_path / "nodes") == rows(tmp_path / "one-node")


@pytest.mark.slow
def test_a_killed_node_makes_the_other_exit_non_zero_within_the_timeout(shapes_data, tiny_cfg, tmp_path):
    """SIGKILL node 1's launcher once training has started: node 0 must fail, not hang (process-group timeout 30 s)."""
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, "--name", "killed", *COMMON,
            "--epochs", "50"]  # the last --epochs wins: long enough to be killed mid-run
    logs = tmp_path.parent / f"{tmp_path.name}-logs"
    procs = start_two_nodes(args, logs, FFCA_DDP_TIMEOUT_MIN="0.5")
    try:
        while "Starting training" not in (logs / "node0.log").read_text():  # node 0's rank 0 logs for the run
            assert procs[0].poll() is None, (logs / "node0.log").read_text()[-3000:]
            time.sleep(0.5)
        kill_node(procs[1])
        killed_at = time.monotonic()
        code = procs[0].wait(timeout=TIMEOUT_S)
        waited = time.monotonic() - killed_at
    finally:
        stop_all(procs)
    assert code != 0, (logs / "node0.log").read_text()[-3000:]
    assert waited < 30 + 120, waited  # the 30 s timeout plus the launcher's own shutdown on a loaded machine
    assert "epochs completed" not in (logs / "node0.log").read_text()  # it stopped, it did not finish
