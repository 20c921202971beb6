"""benchmarks/gpu_proof/multi_gpu.sh: the multi-GPU proof's dry run on the CPU (gloo), and its bad arguments.

The slow test runs the whole script with the test suite's plan (2 processes, the switch to 1) and
checks every row and the record; the script's own plan (4 -> 2) is the same code with ``--nproc 4``.
"""

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.gpu_proof import multi_gpu
from benchmarks.gpu_proof.report import Proof
from benchmarks.gpu_proof.runs import RunResult

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_proof" / "multi_gpu.sh"


def multi_gpu_sh(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_dry_run_passes_every_check_on_two_processes_and_one(tmp_path):
    out = tmp_path / "out"
    proc = multi_gpu_sh(str(out), "--device", "cpu", "--quick", "--nproc", "2", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    record = json.loads((out / "multi_gpu.json").read_text())
    rows = {row["name"]: row for row in record["rows"]}
    assert list(rows) == ["2 processes: reference run, checksum", "2 processes: rerun bit-identical",
                          "2 processes: SIGTERM mid-epoch + --resume bit-identical",
                          "2 processes --micro-batch 2: reference run, checksum",
                          "2 -> 1 processes --micro-batch 2: SIGTERM + --resume bit-identical"]
    assert all(row["status"] == "PASS" for row in rows.values()) and record["complete"] is True
    plain, micro = (rows[f"2 processes{flag}: reference run, checksum"]["data"]["sha256"]
                    for flag in ("", " --micro-batch 2"))
    assert plain != micro, "the micro-batch run must compute differently, or nothing trained"
    for name, reference in (("2 processes: SIGTERM mid-epoch + --resume bit-identical", plain),
                            ("2 -> 1 processes --micro-batch 2: SIGTERM + --resume bit-identical", micro)):
        epoch, batch = rows[name]["data"]["position"]
        assert epoch == 0 and 0 < batch < 5 and rows[name]["data"]["other"] == reference
    runs = Path(record["workdir"]) / "runs"
    assert "Resuming" in (runs / "switched-resume.log").read_text()
    assert "SIGTERM received" in (runs / "switched.log").read_text()
    assert proc.stdout.strip().splitlines()[-1].startswith("multi-GPU proof exit code 0; record ")


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (("--device",), "'--device'"),
    (("a-file",), "'a-file'"),
    (("",), "usage"),
])
def test_a_bad_out_dir_is_exit_2_with_one_line(tmp_path, args, needle):
    (tmp_path / "a-file").write_text("kept\n")
    proc = multi_gpu_sh(*args, cwd=tmp_path)
    errors = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0] and proc.stdout == "", proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and (tmp_path / "a-file").read_text() == "kept\n"


@pytest.mark.slow
def test_a_bad_flag_is_exit_2_with_one_error_line_and_no_record(tmp_path):
    """The proof's output goes to the log through tee: its ERROR line is on stdout, then the script's last line.

    Every bad flag takes this path out of the script; the other flags' messages are checked in this process
    (below), without starting the script's Python interpreters again."""
    proc = multi_gpu_sh(str(tmp_path / "out"), "--nproc", "3", "--device", "cpu", "--quick", cwd=tmp_path)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stdout + proc.stderr
    assert lines[0].startswith("ERROR: --nproc 3: must be a power of two")
    assert lines[1].startswith("multi-GPU proof exit code 2; no record written")
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "out" / "multi_gpu.json").exists()


def test_the_full_plan_on_the_cpu_is_exit_2_with_one_line_and_no_record(tmp_path, capsys):
    out = tmp_path / "multi_gpu.json"
    with pytest.raises(SystemExit) as stop:
        multi_gpu.main(["--device", "cpu", "--out", str(out), "--workdir", str(tmp_path / "work")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(err) == 1
    assert err[0].startswith("ERROR: --device cpu: the full plan is sized for GPUs")
    assert sorted(tmp_path.iterdir()) == []


def test_fewer_gpus_than_processes_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(multi_gpu.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as stop:
        multi_gpu.main(["--nproc", "4"])
    assert stop.value.code == 2
    assert "--nproc 4: this machine has 1 CUDA GPU(s)" in capsys.readouterr().err


def finished_run(tmp_path: Path, name: str, sha: str, world_size: int) -> RunResult:
    run_dir = tmp_path / name
    (run_dir / "weights").mkdir(parents=True)
    (run_dir / "weights" / "sha256.txt").write_text(f"{sha}  last.pt\n")
    (run_dir / "determinism.json").write_text(json.dumps({"world_size": world_size}))
    return RunResult(name, 0, f"Final EMA weights sha256: {sha}\n", run_dir, 1.0)


def test_a_micro_batch_run_that_ends_where_the_plain_one_did_fails(tmp_path):
    """Had no optimizer step run, both would hold the initial weights: the row must not pass then."""
    plain = finished_run(tmp_path, "first", "a" * 64, 4)
    same = finished_run(tmp_path, "micro", "a" * 64, 4)
    other = finished_run(tmp_path, "micro2", "b" * 64, 4)
    assert multi_gpu.reference_row(other, 4, plain).status == "PASS"
    assert multi_gpu.reference_row(same, 4, plain).status == "FAIL"
    assert multi_gpu.reference_row(other, 2).status == "FAIL"  # it ran on another number of processes


def test_a_resume_that_does_not_end_with_the_reference_fails_and_a_crash_is_an_error(tmp_path):
    reference = finished_run(tmp_path, "first", "a" * 64, 4)
    diverged = finished_run(tmp_path, "stopped", "c" * 64, 4)
    proof = Proof(tmp_path / "p.json", budget_s=60, meta={})
    proof.check("multi", "resume", lambda: multi_gpu.resumed_row(reference, ((0, 2), diverged), "--resume on 4"))
    crashed = RunResult("switched-resume", 1, "RuntimeError: boom\n", tmp_path / "stopped", 1.0)
    proof.check("multi", "switch", lambda: multi_gpu.resumed_row(reference, ((0, 2), crashed), "--resume on 2"))
    assert [row.status for row in proof.rows] == ["FAIL", "ERROR"]
    assert "SIGTERM at epoch 0 batch 2" in proof.rows[0].detail and "exited 1" in proof.rows[1].detail
    assert proof.exit_code() == 1


@pytest.mark.parametrize("mode, jobs", [("Default", 2), ("Exclusive_Process", 1)])
def test_runs_share_the_gpus_only_where_the_compute_mode_lets_them(monkeypatch, mode, jobs):
    monkeypatch.setattr(multi_gpu.preflight, "shm_mib", lambda: (4096.0, 8192.0))
    monkeypatch.setattr(multi_gpu.preflight, "compute_mode", lambda index: mode)
    args = multi_gpu.argparse.Namespace(jobs=None, device="cuda")
    assert multi_gpu.runs_at_once(args, multi_gpu.FULL) == jobs


def test_a_small_dev_shm_stops_the_proof_with_one_line(monkeypatch):
    monkeypatch.setattr(multi_gpu.preflight, "shm_mib", lambda: (60.0, 64.0))
    with pytest.raises(multi_gpu.UserError, match="/dev/shm has 60 MiB free.*--shm-size=2g"):
        multi_gpu.runs_at_once(multi_gpu.argparse.Namespace(jobs=None, device="cuda"), multi_gpu.FULL)
