"""Multi-process training through torchrun with the gloo backend on CPU (what NCCL does on GPUs)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.launchers import launcher_env
from tests.support.run_outputs import results_rows as rows, weights_checksum as checksum

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--imgsz", "64", "--batch-size", "8", "--epochs", "2", "--device", "cpu", "--workers", "0",
          "--noplots", "--exist-ok", "--save-interval", "0"]
LOSS_TOLERANCE = 0.25  # relative; per-rank BatchNorm statistics make 2-process losses differ slightly


def torchrun(nproc: int, *args, timeout: int = 400) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "train.py", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=launcher_env())


def total_train_loss(row: dict) -> float:
    return sum(float(row[f"train/{k}_loss"]) for k in ("box", "obj", "cls"))


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, shapes_data, tiny_cfg) -> Path:
    project = tmp_path_factory.mktemp("ddp")
    proc = torchrun(2, "--data", shapes_data, "--cfg", tiny_cfg, "--project", project, "--name", "a",
                    "--save-period", "1", *COMMON)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project / "a"


@pytest.mark.slow
def test_two_process_run_writes_one_set_of_outputs(ddp_run):
    assert sorted(p.name for p in ddp_run.parent.iterdir()) == ["a"]
    assert [r["epoch"] for r in rows(ddp_run)] == ["0", "1"]
    assert (ddp_run / "weights" / "best.pt").is_file()
    assert '"world_size": 2' in (ddp_run / "determinism.json").read_text()


@pytest.mark.slow
def test_two_identical_ddp_runs_are_bit_identical(ddp_run, shapes_data, tiny_cfg):
    proc = torchrun(2, "--data", shapes_data, "--cfg", tiny_cfg, "--project", ddp_run.parent, "--name", "b",
                    "--save-period", "1", *COMMON)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checksum(ddp_run.parent / "b") == checksum(ddp_run)
    assert rows(ddp_run.parent / "b") == rows(ddp_run)


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
