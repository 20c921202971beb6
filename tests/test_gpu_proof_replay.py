"""The GPU proof replayed on a CPU: a table of CUDA outcomes drives the real proof code through every branch.

benchmarks/gpu_proof/replay/cuda-torch-{2.9,2.11,2.14}.json hold the outcomes CUDA is expected to give on
each torch release (from its documentation and libtorch_cuda.so, not measured). The fast tests replay
the ops and control sections of every table on the installed torch, and the deadline and budget
machinery: a run killed at the deadline or a spent budget leaves the verdict undecided (exit 3), never a
FAIL. tests/test_gpu_proof.py replays the whole quick plan, with one fault of each kind added, on the
training runs of its CPU proof, and checks that every row kind and every section came out.
"""

import json
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_proof import proof as gpu_proof
from benchmarks.gpu_proof import runs as proof_runs
from benchmarks.gpu_proof.device import ReplayDevice, table_from_record
from benchmarks.gpu_proof.report import DeadlineExceeded, Proof, info, row_kind, verdict
from tests.support.replay_tables import FAULTS, RELEASES, REPLAY, recorded, with_faults

ROOT = Path(__file__).resolve().parents[1]
TABLE = REPLAY / "cuda-torch-2.14.json"


def test_every_table_covers_every_battery_case_with_its_torch_range():
    from benchmarks.gpu_proof import ops as proof_ops

    for release in RELEASES:
        table = recorded(release)
        assert table["torch"] == release and set(table["ops"]) == set(proof_ops.CASES)
        assert all(row["holds_for"] for row in table["ops"].values())


def test_the_tables_differ_only_where_torch_changed():
    """kthvalue raised on CUDA through 2.9 (pytorch#165762); bilinear runs on every release (finding 1);
    F.max_pool3d(return_indices=True) decomposes on CUDA from 2.13."""
    outcomes = {release: {name: row["outcome"] for name, row in recorded(release)["ops"].items()}
                for release in RELEASES}
    changed = {release: {name for name in outcomes[release] if outcomes[release][name] != outcomes["2.14"][name]}
               for release in ("2.9", "2.11")}
    assert changed == {"2.9": {"kthvalue", "max_pool3d return_indices"}, "2.11": {"max_pool3d return_indices"}}
    assert outcomes["2.9"]["kthvalue"] == "raises" and outcomes["2.14"]["kthvalue"] == "runs"
    assert all(outcomes[release]["interpolate bilinear"] == "runs" for release in RELEASES)


def test_the_cuda_branches_of_the_cuda_prediction_are_cases_of_every_table():
    """Where CUDA's branch differs from meta's (is_cuda in Python, cuDNN in C++) or a kernel varies without an
    alert: replicate pad and max_pool3d with indices decompose, cuDNN takes grid_sample with align_corners and
    eligible CTC, adaptive_max_pool3d with sizes that do not divide accumulates with atomics."""
    for release in RELEASES:
        ops = recorded(release)["ops"]
        assert {name for name, row in ops.items() if row.get("silent")} == {
            "grid_sample align_corners", "adaptive_max_pool3d output 3"}
        assert [ops[name]["outcome"] for name in ("replication pad", "grid_sample align_corners", "max_pool3d",
                                                  "ctc_loss cuDNN", "ctc_loss native")] == [
            "runs", "runs", "raises", "runs", "raises"]
        assert ops["max_pool3d return_indices"]["outcome"] == ("runs" if release == "2.14" else "raises")


@pytest.mark.parametrize("release", RELEASES)
def test_replayed_cuda_outcomes_agree_with_the_cpu_audit(tmp_path, release):
    """Every ops row passes with the table's own torch release, histc on integers through the meta-device audit."""
    proof = Proof(tmp_path / "p.json", budget_s=600, meta={"proved_torch": release})
    layer = ReplayDevice(recorded(release), budget_s=600)
    gpu_proof.ops_section(proof, layer)
    rows = {row.name: row for row in proof.rows}
    assert [row.status for row in proof.rows] == ["PASS"] * len(proof.rows), [r.detail for r in proof.rows]
    assert proof.exit_code() == 0
    assert rows["histc int"].data["audit_device"] == "meta"
    assert rows["interpolate bilinear"].data["audit_device"] == "meta"  # predicted from CUDA's Python branch
    assert rows["bincount with weights"].data["audit_device"].startswith("cpu (meta has no kernel: aten::bincount")
    assert "on cuda" in rows["adaptive_max_pool2d output 1"].detail
    assert rows["kthvalue"].data["table"] == recorded(release)["ops"]["kthvalue"]["outcome"]
    for silent, op in (("adaptive_max_pool3d output 3", "adaptive_max_pool3d_backward (backward, silent)"),
                       ("grid_sample align_corners", "cudnn_grid_sampler_backward (backward, silent)")):
        assert rows[silent].data["predicted_ops"] == [op] and rows[silent].data["table_silent"]
    assert rows["ctc_loss cuDNN"].data["predicted_ops"] == [] and rows["replication pad"].data["predicted_ops"] == []
    assert rows["index_add_ 10^6 -> 1 slot x20, off"].detail == "off: 7 distinct hash(es) in 20 runs"
    record = json.loads((tmp_path / "p.json").read_text())  # as a GPU run would have written it
    again = table_from_record(record)
    assert again["torch"] == release and again["control"] == recorded(release)["control"]
    assert {name: (row["outcome"], row.get("silent")) for name, row in again["ops"].items()} == {
        name: (row["outcome"], row.get("silent")) for name, row in recorded(release)["ops"].items()}


@pytest.mark.parametrize("release, flipped", [("2.9", "kthvalue"), ("2.11", "interpolate bilinear")])
def test_one_flipped_outcome_is_the_one_mismatch_and_exit_1(tmp_path, release, flipped):
    table = recorded(release)
    row = table["ops"][flipped]
    row["outcome"] = "runs" if row["outcome"] == "raises" else "raises"
    proof = Proof(tmp_path / "p.json", budget_s=600, meta={})
    gpu_proof.ops_section(proof, ReplayDevice(table, budget_s=600))
    kinds = {row.name: row_kind(row) for row in proof.rows}
    assert kinds.pop(flipped) == "MISMATCH" and set(kinds.values()) == {"PASS"}
    assert proof.exit_code() == 1


def test_replayed_faults_in_ops_and_control_give_mismatch_and_fail(tmp_path):
    proof = Proof(tmp_path / "p.json", budget_s=600, meta={})
    gpu_proof.ops_section(proof, ReplayDevice(with_faults(recorded()), budget_s=600))
    kinds = {row.name: row_kind(row) for row in proof.rows}
    assert kinds.pop(FAULTS["mismatch_case"]) == "MISMATCH"
    assert kinds.pop("index_add_ 10^6 -> 1 slot x20, off") == "FAIL"
    assert set(kinds.values()) == {"PASS"}


def test_a_run_killed_at_the_deadline_is_incomplete_not_fail(tmp_path):
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    run = proof_runs.run_to_end(cmd, tmp_path, "sleeper", timeout=0)
    assert run.timed_out and run.returncode == -9 and run.seconds < 30
    proof = Proof(tmp_path / "p.json", budget_s=600, meta={})
    proof.check("reruns", "passed", lambda: verdict(True))
    row = proof.check("reruns", "sleeper", lambda: proof_runs.finished(run))
    assert row.status == "INCOMPLETE" and row_kind(row) == "TIMEOUT" and "deadline" in row.detail
    assert proof.exit_code() == 3 and "INCOMPLETE (exit 3)" in proof.verdict_line()
    assert "sleeper" in proof.verdict_line()
    with pytest.raises(DeadlineExceeded):
        proof_runs.finished(run)


def test_a_budget_cut_of_information_rows_keeps_the_exit_code(tmp_path, monkeypatch):
    layer = ReplayDevice({**recorded(), "budget_cut_after_timing_rows": 1}, budget_s=100)
    monkeypatch.setattr(gpu_proof.LiveDevice, "time_fixed_batch", lambda self, *args: (0.25, 1.0))
    proof = Proof(tmp_path / "p.json", budget_s=100, meta={}, clock=layer.clock, info_budget_s=50)
    proof.check("ops", "a claim", lambda: verdict(True))
    gpu_proof.timing_section(proof, gpu_proof.QUICK, layer, tmp_path / "data.yaml")
    assert [row_kind(row) for row in proof.rows] == ["PASS", "INFO", "SKIP budget", "SKIP budget", "SKIP budget"]
    assert len(proof.info_cut()) == 3 and proof.undecided() == []
    assert proof.exit_code() == 0 and "3 information row(s) cut" in proof.verdict_line()


def test_information_rows_start_only_while_their_budget_holds_the_longest_row(tmp_path):
    clock = [0.0]
    proof = Proof(tmp_path / "p.json", budget_s=10, meta={}, clock=lambda: clock[0], info_budget_s=5)
    clock[0] = 12.0  # claims' budget spent, 3 s of the information budget left
    assert proof.check("timing", "short", lambda: info("x"), claim=False, needs_s=2).status == "INFO"
    row = proof.check("timing", "long", lambda: info("x"), claim=False, needs_s=4)
    assert row_kind(row) == "SKIP budget" and "4 s this check takes" in row.detail
    assert proof.check("ops", "late claim", lambda: verdict(True)).status == "INCOMPLETE"
    assert proof.exit_code() == 3


@pytest.mark.parametrize("args, message", [
    (("--replay", str(TABLE)), "add --quick"),
    (("--quick", "--replay", "no-such-table.json"), "not a replay table"),
    (("--quick", "--replay", str(ROOT / "README.md")), "not a replay table"),
])
def test_bad_replay_arguments_exit_2(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        gpu_proof.main(["--out", str(tmp_path / "p.json"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("ERROR: --replay") and message in err[0]
