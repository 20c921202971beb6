"""Two torchrun launchers on one machine acting as two nodes (gloo on CPU), against one two-process launcher.

The project promises bit-identical results for the same command on the same number of processes;
``--nnodes 2 --nproc-per-node 1`` and ``--standalone --nproc-per-node 2`` both give a world of two
ranks, so they must end with the same weights and the same results.csv.
"""

import socket
import subprocess
import sys
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


def run_two_nodes(train_args: list, logs: Path) -> list:
    """Start both node launchers at once, wait for both; returns ``[(returncode, output), ...]`` by node rank."""
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for k in (0, 1):
            with open(logs / f"node{k}.log", "w") as log:
                procs.append(subprocess.Popen(node_command(k, port, train_args), cwd=ROOT, env=launcher_env(),
                                              stdout=log, stderr=subprocess.STDOUT))
        codes = [proc.wait(timeout=TIMEOUT_S) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
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
