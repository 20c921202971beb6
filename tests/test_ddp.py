"""Multi-process training through torchrun with the gloo backend on CPU (what NCCL does on GPUs).

One uninterrupted two-process run (``ddp_run``) is the reference every run here must end with, bit for bit:
a ``--resume`` from its epoch-0 checkpoint, and two launchers acting as two nodes, stopped by SIGTERM to one
node and resumed on both. Each of those trains from scratch or from a checkpoint on two ranks and ends with
the reference's weights and results.csv, so a second uninterrupted run of the same command would add only a
launch: the plain rerun on two processes is also a row of the multi-GPU proof's dry run
(tests/test_multi_gpu_proof.py). The reference run audits at start-up; the runs after it read its audit from a
cache this module shares (``audit_once_per_model``, tests/conftest.py), and must still end with its bits.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.launchers import launcher_env, sigterm_passed_on, workers_frozen
from tests.support.run_outputs import results_rows as rows, weights_checksum as checksum
from tests.support.two_nodes import run_two_nodes, start_two_nodes, stop_all, wait_for_line

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--imgsz", "64", "--batch-size", "8", "--epochs", "2", "--device", "cpu", "--workers", "0",
          "--noplots", "--exist-ok", "--save-interval", "0", "--save-period", "1"]
LOSS_TOLERANCE = 0.25  # relative; per-rank BatchNorm statistics make 2-process losses differ slightly
STOP_S = 90  # SIGTERM to both launchers gone: measured 23 s on a 2-core machine at load 10-17


def torchrun(nproc: int, *args, timeout: int = 400) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "train.py", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=launcher_env())


def train_args(data: Path, cfg: Path, project: Path, name: str) -> list:
    """The reference run's flags in the run folder ``project/name``: every run here trains with them."""
    return ["--data", data, "--cfg", cfg, "--project", project, "--name", name, *COMMON]


def total_train_loss(row: dict) -> float:
    return sum(float(row[f"train/{k}_loss"]) for k in ("box", "obj", "cls"))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, shapes_data, tiny_cfg) -> Path:
    project = tmp_path_factory.mktemp("ddp")
    proc = torchrun(2, *train_args(shapes_data, tiny_cfg, project, "a"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project / "a"


@pytest.mark.slow
def test_two_process_run_writes_one_set_of_outputs(ddp_run):
    assert sorted(p.name for p in ddp_run.parent.iterdir()) == ["a"]
    assert [r["epoch"] for r in rows(ddp_run)] == ["0", "1"]
    assert (ddp_run / "weights" / "best.pt").is_file()
    assert '"world_size": 2' in (ddp_run / "determinism.json").read_text()


@pytest.mark.slow
def test_ddp_loss_curve_close_to_single_process(ddp_run, shapes_data, tiny_cfg):
    import train

    train.run(data=str(shapes_data), cfg=str(tiny_cfg), project=str(ddp_run.parent), name="single", imgsz=64,
              batch_size=8, epochs=2, device="cpu", workers=0, noplots=True, exist_ok=True, save_interval=0)
    multi_rows, single_rows = rows(ddp_run), rows(ddp_run.parent / "single")
    assert len(multi_rows) == len(single_rows) == 2
    for multi, single in zip(multi_rows, single_rows):
        a, b = total_train_loss(multi), total_train_loss(single)
        assert abs(a - b) <= LOSS_TOLERANCE * b, (a, b)


@pytest.mark.slow
def test_resume_under_ddp_matches_uninterrupted(ddp_run, tmp_path):
    copy = tmp_path / "resumed"
    (copy / "weights").mkdir(parents=True)
    (copy / "results.csv").write_bytes((ddp_run / "results.csv").read_bytes())
    (copy / "weights" / "last.pt").write_bytes((ddp_run / "weights" / "epoch0.pt").read_bytes())
    proc = torchrun(2, "--resume", copy / "weights" / "last.pt")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert checksum(copy) == checksum(ddp_run)
    assert rows(copy) == rows(ddp_run)


@pytest.mark.slow
def test_two_nodes_stopped_by_sigterm_to_one_and_resumed_on_both_end_as_the_one_node_run(ddp_run, shapes_data,
                                                                                         tiny_cfg, tmp_path):
    """``--nnodes 2 --nproc-per-node 1`` (two launchers on one machine, 127.0.0.1) and ``--standalone
    --nproc-per-node 2`` both give a world of two ranks, so the same command must end with the same weights
    and results.csv on either. SIGTERM to node 1's launcher (what a scheduler or ``docker stop`` sends):
    torchrun passes it to its worker, the stop flag's all-reduce stops every rank after the same step, and
    rank 0 on node 0 saves last.pt. ``--resume`` on both launchers must then end with the one-node run.

    Every step, from the first, is trained on the two launchers, so this shows two nodes equal one as an
    uninterrupted two-node run would, and node 1 writes no run folder in either launch."""
    logs = tmp_path.parent / f"{tmp_path.name}-logs"
    procs = start_two_nodes(train_args(shapes_data, tiny_cfg, tmp_path, "stopped"), logs / "stopped")
    try:
        # SIGTERM before the first step ends: 3 steps and two validations remain, so the run cannot finish first
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stopped"]  # node 1 wrote no run folder
    assert '"world_size": 2' in (tmp_path / "stopped" / "determinism.json").read_text()
    assert checksum(tmp_path / "stopped") == checksum(ddp_run)
    assert rows(tmp_path / "stopped") == rows(ddp_run)


@pytest.mark.slow
def test_a_world_size_refused_is_one_error_line_from_rank_0(shapes_data, tiny_cfg, tmp_path):
    """Every rank finds the refusal after joining the group (utils.ddp.refused_alike, which --micro-batch's check
    shares): rank 0 alone prints it."""
    flags, message = ["--batch-size", "5"], "--batch-size 5 must be a multiple of the world size 2"
    proc = torchrun(2, "--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, "--imgsz", "64",
                    "--device", "cpu", *flags, timeout=200)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]
    assert not any(tmp_path.iterdir()), "a refused run leaves no run folder"
