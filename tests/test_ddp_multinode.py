"""Two torchrun launchers on one machine acting as two nodes (gloo on CPU), against one two-process launcher.

The project promises bit-identical results for the same command on the same number of processes;
``--nnodes 2 --nproc-per-node 1`` and ``--standalone --nproc-per-node 2`` both give a world of two
ranks, so they must end with the same weights and the same results.csv. A second test kills one
node as a machine failure would and checks that the other exits non-zero, with one line, instead of
hanging. A third stops one node with SIGTERM and resumes both.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.run_outputs import results_rows as rows, weights_checksum as checksum
from tests.support.launchers import child_pids, launcher_env, sigterm_passed_on, workers_frozen

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--imgsz", "64", "--batch-size", "8", "--epochs", "1", "--device", "cpu", "--workers", "0",
          "--noplots", "--exist-ok", "--save-interval", "0"]
TIMEOUT_S = 600
STOP_S = 90  # SIGTERM to both launchers gone: measured 23 s on a 2-core machine at load 10-17


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


@pytest.fixture(scope="module")
def two_nodes_run(shapes_data, tiny_cfg, tmp_path_factory) -> Path:
    """The uninterrupted 2-epoch two-node run, alone in its project; the one-node run and the resumed run below
    must both end with it (one launch of both nodes fewer than each test training its own)."""
    project = tmp_path_factory.mktemp("two_nodes")
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", project, *COMMON, "--epochs", "2", "--name", "whole"]
    for node_rank, (code, output) in enumerate(run_two_nodes(args, project.parent / f"{project.name}-logs")):
        assert code == 0, f"node {node_rank}:\n{output[-3000:]}"
    return project / "whole"


@pytest.mark.slow
def test_two_nodes_on_one_machine_equal_two_processes_on_one_node(two_nodes_run, shapes_data, tiny_cfg, tmp_path):
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, *COMMON, "--epochs", "2"]
    single = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "train.py", *map(str, args), "--name", "one-node"], cwd=ROOT, env=launcher_env(),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert single.returncode == 0, single.stderr[-3000:]
    assert '"world_size": 2' in (two_nodes_run / "determinism.json").read_text()
    assert sorted(p.name for p in two_nodes_run.parent.iterdir()) == ["whole"]  # node 1 wrote no run folder
    assert checksum(two_nodes_run) == checksum(tmp_path / "one-node")
    assert rows(two_nodes_run) == rows(tmp_path / "one-node")


@pytest.mark.slow
def test_a_killed_node_makes_the_other_exit_non_zero_within_the_timeout(shapes_data, tiny_cfg, tmp_path):
    """SIGKILL node 1's launcher once training has started: node 0 must fail, not hang (process-group timeout 30 s)."""
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, "--name", "killed", *COMMON,
            "--epochs", "50"]  # the last --epochs wins: long enough to be killed mid-run
    logs = tmp_path.parent / f"{tmp_path.name}-logs"
    procs = start_two_nodes(args, logs, FFCA_DDP_TIMEOUT_MIN="0.5")
    try:
        wait_for_line(procs[0], logs / "node0.log", "Starting training")  # node 0's rank 0 logs for the run
        kill_node(procs[1])
        killed_at = time.monotonic()
        code = procs[0].wait(timeout=TIMEOUT_S)
        waited = time.monotonic() - killed_at
    finally:
        stop_all(procs)
    output = (logs / "node0.log").read_text()
    assert code != 0, output[-3000:]
    assert waited < 30 + 120, waited  # the 30 s timeout plus the launcher's own shutdown on a loaded machine
    assert "epochs completed" not in output  # it stopped, it did not finish
    # one line naming the lost rank and the timeout instead of gloo's traceback
    assert "ERROR: rank 0 lost rank 1 at [127.0.0.1]:" in output and "FFCA_DDP_TIMEOUT_MIN=0.5 min" in output
    assert "[rank0]: Traceback" not in output and "exitcode  : 1 " in output, output[-3000:]


@pytest.mark.slow
def test_sigterm_to_one_node_stops_both_and_resuming_both_ends_as_the_uninterrupted_run(two_nodes_run, shapes_data,
                                                                                          tiny_cfg, tmp_path):
    """SIGTERM to node 1's launcher (what a scheduler or ``docker stop`` sends): torchrun passes it to its worker,
    the stop flag's all-reduce stops every rank after the same step, and rank 0 on node 0 saves last.pt.
    ``--resume`` on both launchers must then end with the uninterrupted two-node run's weights and results."""
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, *COMMON, "--epochs", "2"]
    logs = tmp_path.parent / f"{tmp_path.name}-logs"
    procs = start_two_nodes([*args, "--name", "stopped"], logs / "stopped")
    try:
        # SIGTERM before the first step ends: 4 steps and a validation remain, so the run cannot finish first
        wait_for_line(procs[0], logs / "stopped" / "node0.log", "Starting training")
        with workers_frozen(procs[1]) as workers:
            sigterm_passed_on(procs[1], workers)
        sent = time.monotonic()
        codes = [proc.wait(timeout=STOP_S) for proc in procs]
        stopped_in = time.monotonic() - sent
    finally:
        stop_all(procs)
    node0, node1 = ((logs / "stopped" / f"node{k}.log").read_text() for k in (0, 1))
    assert codes[0] != 0 and codes[1] != 0, node0[-3000:] + node1[-3000:]  # interrupted, not finished
    assert stopped_in < STOP_S
    assert "SIGTERM received: finishing the current step" in node1
    assert "SIGTERM received by another rank: stopping after this step on every rank" in node0
    assert "(resumable)" in node0 and "the same torchrun command(s) on every node (2 processes in all)" in node0
    assert "exitcode  : 143" in node0  # node 0's worker exits as the signalled one does, 128 + SIGTERM
    last = tmp_path / "stopped" / "weights" / "last.pt"
    assert torch.load(last, weights_only=True)["next_position"] < [2, 0]
    for node_rank, (code, output) in enumerate(run_two_nodes(["--resume", last], logs / "resumed")):
        assert code == 0, f"node {node_rank}:\n{output[-3000:]}"
    assert checksum(tmp_path / "stopped") == checksum(two_nodes_run)
    assert rows(tmp_path / "stopped") == rows(two_nodes_run)
