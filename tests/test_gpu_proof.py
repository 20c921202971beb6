"""benchmarks/gpu_proof.py: its CPU run passes in full, and its parts report what they see.

The slow test runs the whole proof on the CPU (``--device cpu --quick``), so every line of the
script has run before a GPU ever sees it. The fast tests pin the parts: a failing check becomes a
FAIL row without stopping the others, a mismatch between audit and device is a FAIL, a spent
budget skips, and bad arguments exit 2 with one line.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import proof_ops  # noqa: E402
from proof_report import STATUSES, Proof, verdict  # noqa: E402

SECTIONS = {"ops", "control", "scam", "reruns", "timing"}
CUDA_ONLY = ("AMP on", "CUBLAS_WORKSPACE_CONFIG set in time")


def run_proof(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/gpu_proof.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_cpu_proof_passes_and_records_every_section(tmp_path):
    out = tmp_path / "proof.json"
    proc = run_proof("--device", "cpu", "--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert record["complete"] is True and record["quick"] is True and record["device"] == "cpu"
    assert all(set(row) == {"section", "name", "status", "detail", "seconds", "data"} for row in rows)
    assert {row["section"] for row in rows} == SECTIONS
    assert [row for row in rows if row["status"] == "FAIL"] == []
    assert record["counts"] == {s: sum(row["status"] == s for row in rows) for s in STATUSES}
    assert not [row for row in rows if "time budget" in row["detail"]]
    by_name = {row["name"]: row for row in rows}
    assert [row["name"] for row in rows if row["section"] == "ops"] == list(proof_ops.CASES)
    assert by_name["put_ accumulate=False"]["data"]["actual"] == "raises"  # the battery sees a failing op
    assert by_name["index_add_ 10^6 -> 1 slot x20, strict"]["status"] == "PASS"
    cuda_only = [row for row in rows if row["name"].endswith(CUDA_ONLY)]
    assert cuda_only and all(row["status"] == "SKIP" and "CUDA only" in row["detail"] for row in cuda_only)
    for section in ("scam", "reruns"):
        assert all(row["status"] == "PASS" for row in rows if row["section"] == section and row not in cuda_only)
    assert "SIGKILL at epoch 0 batch" in by_name["tiny: SIGKILL mid-epoch + --resume bit-identical"]["detail"]
    timing = [row for row in rows if row["section"] == "timing"]
    assert [row["name"].rsplit(" ", 1)[1] for row in timing] == ["off", "warn", "scoped", "strict"]
    assert all(row["status"] == "INFO" and row["data"]["seconds"] > 0 for row in timing)
    assert "FAIL in" not in proc.stdout and f"Record: {out.resolve()}" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (("--jobs", "0"), "ERROR: --jobs 0: must be at least 1"),
    (("--budget", "-5"), "ERROR: --budget -5.0: must be a positive number of seconds"),
    (("--device", "7"), "ERROR: --device '7'"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    if args[0] == "--device" and torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a GPU 7")
    proc = run_proof("--out", str(tmp_path / "proof.json"), *args, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line for line in proc.stderr.strip().splitlines()
                                                if line.startswith("ERROR: ")] and message in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "proof.json").exists()


def test_a_failing_check_is_recorded_and_the_next_still_runs(tmp_path):
    proof = Proof(tmp_path / "p.json", budget_s=60, meta={"device": "cpu"})

    def broken():
        raise ValueError("first line\nsecond line")

    proof.check("ops", "broken", broken)
    proof.check("ops", "fine", lambda: verdict(True, "ok"))
    record = json.loads((tmp_path / "p.json").read_text())
    assert [(r["name"], r["status"], r["detail"]) for r in record["rows"]] == [
        ("broken", "FAIL", "ValueError: first line"), ("fine", "PASS", "ok")]
    assert record["complete"] is False and record["counts"]["FAIL"] == 1


def test_a_spent_budget_skips_the_check_without_running_it(tmp_path):
    proof = Proof(tmp_path / "p.json", budget_s=0, meta={})
    ran = []
    row = proof.check("timing", "late", lambda: ran.append(1) or verdict(True))
    assert row.status == "SKIP" and "time budget" in row.detail and ran == []


def test_battery_reports_a_mismatch_between_audit_and_device(monkeypatch):
    """The audit predicts that adaptive_max_pool2d runs on a CPU; a device that raised would be a FAIL."""
    cpu = torch.device("cpu")
    assert proof_ops.battery_case("adaptive_max_pool2d output 1", cpu).status == "PASS"
    monkeypatch.setattr(proof_ops, "strict_outcome", lambda op, device: ("raises", "x does not have a ..."))
    result = proof_ops.battery_case("adaptive_max_pool2d output 1", cpu)
    assert result.status == "FAIL" and result.detail.startswith("MISMATCH")


def test_audit_predicts_the_documented_cuda_failures_from_a_cpu():
    predicted = {name: proof_ops.predicted_failures(proof_ops.CASES[name], "cuda")[:2]
                 for name in ("adaptive_max_pool2d output 1", "adaptive_avg_pool2d output 1", "gather")}
    assert predicted == {"adaptive_max_pool2d output 1": (True, ["adaptive_max_pool2d_backward (backward)"]),
                         "adaptive_avg_pool2d output 1": (False, []),  # aten computes it as a mean
                         "gather": (False, [])}


@pytest.mark.slow
def test_the_gpu_run_s_scam_model_is_flagged_for_cuda_in_every_scam_layer(tmp_path):
    """What the GPU run checks first, checked here: the published SCAM in ffca-yolo-n, audited on a CPU."""
    import gpu_proof
    import proof_modules

    assert proof_modules.flagged_block("cuda") == "UpstreamSCAM"
    cfg = proof_modules.write_scam_variant(gpu_proof.FULL.scam_base, "UpstreamSCAM", tmp_path)
    result = gpu_proof.scam_audit_row(cfg, "UpstreamSCAM", "cuda")
    assert result.status == "PASS", result.detail
    assert result.detail.startswith("adaptive_max_pool2d_backward for cuda in layers [24, 25, 26]")
