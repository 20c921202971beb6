"""benchmarks/gpu_proof/proof.py: its CPU run passes in full, and its parts report what they see.

The slow tests run the whole proof on the CPU (``--device cpu --quick``), which takes the CPU
branches, then replay the same plan against a CUDA table with one fault of each kind added, which
takes the CUDA ones. Both proofs train the same runs on the same CPU, so the replay is handed the CPU
proof's runs (tests/support/shared_proof_runs.py checks it asks for each with the same flags) and
starts only the run its table kills at the deadline. tests/test_gpu_proof_replay.py replays every
table's ops and control rows. The fast tests pin the parts: a check that raises becomes an ERROR row
(exit 3) without stopping the others, a mismatch between audit and device is a FAIL, a spent budget
skips, and bad arguments exit 2 with one line.
"""

import contextlib
import io
import json
import logging
import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.gpu_proof import ops as proof_ops
from benchmarks.gpu_proof import twin_rows
from benchmarks.gpu_proof.device import LiveDevice
from benchmarks.gpu_proof.report import EXIT_FAIL, EXIT_INCOMPLETE, EXIT_PASS, STATUSES, Proof, row_kind, verdict
from tests.support.global_state import kept_process_state
from tests.support.replay_tables import FAULTS, recorded, with_faults
from tests.support.shared_audit import shared_audit_cache
from tests.support.shared_proof_runs import SharedRuns

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = {"ops", "twins", "control", "scam", "reruns", "timing"}
CUDA_ONLY = ("AMP on", "CUBLAS_WORKSPACE_CONFIG set in time")


def run_proof(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_proof.proof", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def proof_in_this_process(*args: str) -> tuple:
    """``python -m benchmarks.gpu_proof.proof ARGS`` run here: (exit code, what it printed)."""
    from benchmarks.gpu_proof import proof as gpu_proof

    printed = io.StringIO()
    with kept_process_state(), contextlib.redirect_stdout(printed), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")  # a battery case, on purpose
        code = gpu_proof.main(list(args))
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def cpu_proof(tmp_path_factory):
    """The quick CPU proof, run once; its training runs are kept for the replay of the same plan."""
    folder = tmp_path_factory.mktemp("cpu_proof")
    runs = SharedRuns()
    with pytest.MonkeyPatch.context() as patch, shared_audit_cache():  # the proof patches no op table
        runs.record(patch)
        code, printed = proof_in_this_process("--device", "cpu", "--quick", "--out", str(folder / "proof.json"),
                                              "--workdir", str(folder / "work"))
    return SimpleNamespace(code=code, printed=printed, out=folder / "proof.json", runs=runs)


@pytest.mark.slow
def test_quick_cpu_proof_passes_and_records_every_section(cpu_proof):
    out, printed = cpu_proof.out, cpu_proof.printed
    assert cpu_proof.code == 0, printed[-4000:]
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert record["complete"] is True and record["quick"] is True and record["device"] == "cpu"
    assert all(set(row) == {"section", "name", "status", "detail", "seconds", "data", "claim"} for row in rows)
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
    killed = by_name["tiny: SIGKILL mid-accumulation + --resume bit-identical"]
    assert "SIGKILL at epoch 0 batch 2 with 2 batch(es) of gradient pending" in killed["detail"]
    runs = Path(record["workdir"]) / "runs"  # the kill came from the run's own progress, before it could finish:
    assert "Final EMA weights" not in (runs / "tiny-killed.log").read_text()
    assert "Final EMA weights" in (runs / "tiny-killed-resume.log").read_text()
    twins = [row for row in rows if row["section"] == "twins"]
    assert len(twins) == 3 * len(twin_rows.TWIN_CASES) + 2
    assert all(row["status"] == ("SKIP" if row["name"].endswith("native on CUDA") else "PASS") for row in twins)
    zoo = by_name["user-block-zoo: strict run with twins, clean audit"]["data"]
    assert {"adaptive_max_pool2d", "adaptive_avg_pool2d", "grid_sample", "interpolate"} <= set(zoo["twins"])
    timing = [row for row in rows if row["section"] == "timing"]
    assert [row["name"].rsplit(" ", 1)[1] for row in timing] == ["off", "warn", "scoped", "strict"]
    assert all(row["status"] == "INFO" and row["data"]["seconds"] > 0 for row in timing)
    assert "FAIL in" not in printed and f"Record: {out.resolve()}" in printed


@pytest.mark.slow
def test_the_replay_of_the_same_plan_produces_every_row_kind_in_every_section(cpu_proof, tmp_path, monkeypatch):
    table = tmp_path / "faulted.json"
    table.write_text(json.dumps(with_faults(recorded())))
    out = tmp_path / "proof.json"
    cpu_proof.runs.reuse(monkeypatch)
    code, printed = proof_in_this_process("--quick", "--replay", str(table), "--out", str(out),
                                          "--workdir", str(tmp_path / "work"))
    assert code == EXIT_FAIL, printed[-4000:]
    assert cpu_proof.runs.started == [FAULTS["killed_run"]]  # the one run the table kills at the deadline
    assert sorted(cpu_proof.runs.reused) == sorted(set(cpu_proof.runs.runs) - {FAULTS["killed_run"]})
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert record["device"] == "cuda:0" and record["replay"] == str(table) and record["complete"] is False
    assert {row["section"] for row in rows} == SECTIONS
    kinds = {}
    for row in rows:
        kinds.setdefault(row_kind(row), []).append(row["name"])
    assert set(kinds) == {"PASS", "FAIL", "MISMATCH", "TIMEOUT", "SKIP budget", "INFO", "SKIP"}, kinds
    assert kinds["SKIP"] and all(name.endswith("native on CUDA") for name in kinds["SKIP"])  # computed on the CPU
    assert kinds["MISMATCH"] == [FAULTS["mismatch_case"]]
    assert kinds["FAIL"] == ["index_add_ 10^6 -> 1 slot x20, off"]
    assert kinds["TIMEOUT"] == ["tiny: --workers 0 bit-identical"] == record["undecided"]
    timing = [row for row in rows if row["section"] == "timing"]
    assert [row_kind(row) for row in timing] == ["INFO", "INFO", "SKIP budget", "SKIP budget"]
    assert len(record["info_cut"]) == 2 and record["proved_torch"] == "2.14"
    by_name = {row["name"]: row for row in rows}
    for cuda_only in ("tiny: AMP on", "tiny: CUBLAS_WORKSPACE_CONFIG set in time"):
        assert by_name[cuda_only]["status"] == "PASS"  # the CUDA branch ran, not the CPU's SKIP
    assert "FAIL (exit 1)" in printed


@pytest.mark.slow
def test_a_bad_device_on_the_command_line_exits_2_with_one_line_and_no_record(tmp_path):
    if torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a GPU 7")
    proc = run_proof("--out", str(tmp_path / "proof.json"), "--device", "7", timeout=300)
    errors = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith("ERROR: --device '7'"), proc.stderr
    assert not (tmp_path / "proof.json").exists()


@pytest.mark.parametrize("args, message", [
    (("--jobs", "0"), "ERROR: --jobs 0: must be at least 1"),
    (("--budget", "-5"), "ERROR: --budget -5.0: must be a positive number of seconds"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    """The same exit route as the command line above (main's one-line UserError), without a new interpreter."""
    from benchmarks.gpu_proof import proof as gpu_proof

    with pytest.raises(SystemExit) as stop:
        gpu_proof.main(["--out", str(tmp_path / "proof.json"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "proof.json").exists()


def test_a_check_that_raises_is_an_error_row_with_its_reason_and_the_next_still_runs(tmp_path, capsys):
    """An exception says the check could not run (a missing module, out of memory), not that the claim is false."""
    proof = Proof(tmp_path / "p.json", budget_s=60, meta={"device": "cpu"})

    def broken():
        raise ValueError("first line\nsecond line")

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    proof.check("ops", "broken", broken)
    proof.check("reruns", "tiny: rerun", out_of_memory)
    proof.check("ops", "fine", lambda: verdict(True, "ok"))
    record = json.loads((tmp_path / "p.json").read_text())
    assert [(r["name"], r["status"], r["detail"]) for r in record["rows"]] == [
        ("broken", "ERROR", "ValueError: first line"),
        ("tiny: rerun", "ERROR", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        ("fine", "PASS", "ok")]
    assert [row_kind(r) for r in record["rows"]] == ["ERROR", "ERROR", "PASS"]
    assert record["complete"] is False and record["counts"]["ERROR"] == 2 and record["counts"]["FAIL"] == 0
    assert record["exit_code"] == EXIT_INCOMPLETE and proof.exit_code() == EXIT_INCOMPLETE
    assert proof.verdict_line() == ("INCOMPLETE (exit 3), no verdict: 2 claim row(s) errored: ops/broken: "
                                    "ValueError: first line; reruns/tiny: rerun: OutOfMemoryError: CUDA out of "
                                    "memory. Tried to allocate 2.00 GiB")
    assert "2 ERROR row(s):\n  ops/broken: ValueError: first line" in proof.table()
    assert record["undecided"] == ["broken", "tiny: rerun"]


def test_a_fail_outranks_an_error_and_an_information_row_that_raises_changes_nothing(tmp_path):
    def missing_module():
        raise ModuleNotFoundError("No module named 'pycocotools'")

    proof = Proof(tmp_path / "p.json", budget_s=60, meta={})
    proof.check("ops", "passes", lambda: verdict(True))
    proof.check("timing", "tiny: off", missing_module, claim=False)
    assert proof.rows[-1].status == "ERROR" and proof.exit_code() == EXIT_PASS
    proof.check("scam", "raises", missing_module)
    assert proof.exit_code() == EXIT_INCOMPLETE
    proof.check("control", "false claim", lambda: verdict(False, "3 hashes"))
    assert proof.exit_code() == EXIT_FAIL and proof.verdict_line().startswith("FAIL (exit 1): 1 claim row(s) failed")


def test_a_spent_budget_skips_the_check_without_running_it(tmp_path):
    proof = Proof(tmp_path / "p.json", budget_s=0, meta={})
    ran = []
    row = proof.check("reruns", "late", lambda: ran.append(1) or verdict(True))
    assert row.status == "INCOMPLETE" and "time budget" in row.detail and ran == []
    row = proof.check("timing", "late", lambda: ran.append(1) or verdict(True), claim=False)
    assert row.status == "SKIP" and "time budget" in row.detail and ran == []


def test_battery_reports_a_mismatch_between_audit_and_device(monkeypatch):
    """The audit predicts that adaptive_max_pool2d runs on a CPU; a device that raised would be a FAIL."""
    cpu = torch.device("cpu")
    assert proof_ops.battery_case("adaptive_max_pool2d output 1", cpu).status == "PASS"
    monkeypatch.setattr(proof_ops, "strict_outcome", lambda op, device: ("raises", "x does not have a ..."))
    result = proof_ops.battery_case("adaptive_max_pool2d output 1", cpu)
    assert result.status == "FAIL" and result.detail.startswith("MISMATCH")


def test_audit_predicts_the_documented_cuda_failures_from_a_cpu():
    predicted = {name: proof_ops.predicted_failures(proof_ops.CASES[name], "cuda")
                 for name in ("adaptive_max_pool2d output 1", "adaptive_avg_pool2d output 1", "gather",
                              "interpolate bilinear", "interpolate bicubic")}
    assert predicted == {"adaptive_max_pool2d output 1": (True, ["adaptive_max_pool2d_backward (backward)"], "meta"),
                         "adaptive_avg_pool2d output 1": (False, [], "meta"),  # aten computes it as a mean
                         "gather": (False, [], "meta"),
                         # Issue 37 finding 1: the CPU trace said bilinear raises; CUDA takes the decomposition
                         "interpolate bilinear": (False, [], "meta"),
                         "interpolate bicubic": (True, ["upsample_bicubic2d_backward (backward)"], "meta")}


def test_twin_rows_pass_on_the_cpu_and_fail_a_twin_that_varies_or_disagrees(tmp_path):
    """The twins section in the CPU check: reruns and agreement pass, the native row does not apply; a twin
    whose backward draws noise fails its reruns row, and one off by 1e-6 fails its agreement row."""
    proof = Proof(tmp_path / "p.json", budget_s=60, meta={})
    twin_rows.twin_section(proof, torch.device("cpu"), quick=True)
    assert [row.name for row in proof.rows][:3] == ["adaptive_max_pool2d (7, 5): twin backward bit-identical x5",
                                                    "adaptive_max_pool2d (7, 5): twin agrees with native",
                                                    "adaptive_max_pool2d (7, 5): native on CUDA"]
    for row in proof.rows:
        native = row.name.endswith("native on CUDA")
        assert row.status == ("SKIP" if native else "PASS"), (row.name, row.detail)
        assert row.claim is not native
        assert not native or row.detail.startswith("not applicable on cpu")

    def noisy(x):
        return torch.nn.functional.adaptive_max_pool2d(x, 3) * (1 + 1e-3 * torch.rand(()))

    x = twin_rows.case_input(torch.device("cpu"), quick=True)
    varying = twin_rows.TwinCase(lambda t: torch.nn.functional.adaptive_max_pool2d(t, 3), noisy)
    assert twin_rows.twin_reruns_row(varying, x).status == "FAIL"
    off = twin_rows.TwinCase(lambda t: torch.nn.functional.adaptive_avg_pool2d(t, 3),
                             lambda t: torch.nn.functional.adaptive_avg_pool2d(t, 3) * (1 + 1e-6))
    result = twin_rows.agreement_row(off, x)
    assert result.status == "FAIL" and result.data["forward"] > twin_rows.FORWARD_ATOL


@pytest.mark.parametrize("version, raises", [("2.9.0", True), ("2.11.0+cu130", False), ("2.14.1", False)])
def test_kthvalue_is_predicted_per_torch_release(version, raises):
    predicted, ops, _ = proof_ops.predicted_failures(proof_ops.CASES["kthvalue"], "cuda", version)
    assert predicted is raises and ops == (["kthvalue (forward)"] if raises else [])


@pytest.mark.slow
def test_the_gpu_run_s_scam_model_is_flagged_for_cuda_in_every_scam_layer(tmp_path):
    """What the GPU run checks first, checked here: the published SCAM in ffca-yolo-n, audited on a CPU."""
    from benchmarks.gpu_proof import proof as gpu_proof
    from benchmarks.gpu_proof import modules as proof_modules

    assert proof_modules.flagged_block("cuda") == "UpstreamSCAM"
    cfg = proof_modules.write_scam_variant(gpu_proof.FULL.scam_base, "UpstreamSCAM", tmp_path)
    result = gpu_proof.scam_audit_row(cfg, "UpstreamSCAM", "cuda")
    assert result.status == "PASS", result.detail
    assert result.detail.startswith("adaptive_max_pool2d_backward for cuda in layers [24, 25, 26]")


# ----------------------------------------------------------------------------- findings of issue 23


def stub_prove(calls):
    """A ``prove`` that records its work folder, generates the data there and runs one passing check."""
    from benchmarks.gpu_proof import proof as gpu_proof

    def prove(proof, plan, device, work, sizes):
        calls.append(work)
        gpu_proof.make_data(work, plan)
        proof.check("ops", "stub", lambda: verdict(True, "ok"))
    return prove


def test_a_proof_cut_by_its_budget_is_incomplete_and_exits_3(tmp_path, monkeypatch, capsys):
    """Issue 23 finding 3: a budget cut wrote complete: true and exit 0; issue 37 finding 3: then exit 1, a FAIL."""
    from benchmarks.gpu_proof import proof as gpu_proof

    monkeypatch.setattr(gpu_proof, "prove", stub_prove([]))
    out = tmp_path / "p.json"
    code = gpu_proof.main(["--device", "cpu", "--quick", "--budget", "1e-9", "--out", str(out),
                           "--workdir", str(tmp_path / "work")])
    record = json.loads(out.read_text())
    assert record["rows"][0]["status"] == "INCOMPLETE" and "time budget" in record["rows"][0]["detail"]
    assert code == 3 and record["complete"] is False and record["undecided"] == ["stub"]
    assert record["exit_code"] == 3 and "INCOMPLETE (exit 3), no verdict: ops/stub: time budget" in capsys.readouterr().out


def test_the_work_folder_is_kept_by_default_and_printed(tmp_path, monkeypatch, capsys):
    """Issue 37 finding 3: without --workdir every log was deleted when the proof exited."""
    from benchmarks.gpu_proof import proof as gpu_proof

    calls = []
    monkeypatch.setattr(gpu_proof, "prove", stub_prove(calls))
    monkeypatch.setattr(gpu_proof, "DEFAULT_WORKDIR", tmp_path / "kept")
    assert gpu_proof.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "p.json")]) == 0
    [work] = calls
    assert work.parent == tmp_path / "kept" and (work / "shapes.yaml").is_file()
    out = capsys.readouterr().out
    assert f"work folder (kept): {work}" in out and f"Runs and logs: {work}" in out
    assert json.loads((tmp_path / "p.json").read_text())["workdir"] == str(work)


# runpy warns that the module is loaded already: running its top level again on purpose is the point
@pytest.mark.filterwarnings("ignore:'benchmarks.gpu_proof.proof' found in sys.modules:RuntimeWarning")
def test_the_proof_replaces_a_non_deterministic_cublas_setting(monkeypatch):
    """Issue 37 finding 8: os.environ.setdefault kept a pre-set ':0:0', which voids every CUDA claim.

    The module's top level runs afresh (runpy, its imports already loaded) under each pre-set value."""
    for found, kept in ((":0:0", ":4096:8"), (":16:8", ":16:8")):
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", found)
        module = runpy.run_module("benchmarks.gpu_proof.proof", run_name="gpu_proof_top_level")
        assert (os.environ["CUBLAS_WORKSPACE_CONFIG"], module["CUBLAS_FOUND"]) == (kept, found)


def test_preflight_refuses_an_exclusive_gpu_and_a_small_dev_shm():
    """Issue 37 finding 8: nothing checked /dev/shm (Docker: 64 MB) or exclusive-process mode before 6 children."""
    from benchmarks.gpu_proof import preflight
    from utils.errors import UserError

    with pytest.raises(UserError, match="Exclusive_Process compute mode.*nvidia-smi -c DEFAULT"):
        preflight.check((20000.0, 20000.0), "Exclusive_Process", 6, 1)
    with pytest.raises(UserError, match="/dev/shm has 64 MiB free of 64 MiB.*--shm-size"):
        preflight.check((64.0, 64.0), "Default", 6, 1)
    line = preflight.check((20000.0, 24000.0), "Default", 6, 1)
    assert "/dev/shm 20000 MiB free of 24000 MiB" in line and "compute mode Default" in line


def test_worker_counts_follow_the_cores():
    """Issue 37 finding 3: 6 runs x (4 train + 8 validation workers) on 16 cores."""
    from benchmarks.gpu_proof import preflight

    assert preflight.sizes(True, 4, None, cores=16) == (6, 1)
    assert preflight.sizes(True, 4, 2, cores=64) == (2, 4)
    assert preflight.sizes(False, 2, None, cores=2) == (2, 1)


@pytest.mark.slow
def test_the_same_workdir_twice_runs_twice(tmp_path, monkeypatch):
    """Finding 4: a second run in the same --workdir crashed with FileExistsError while generating data."""
    from benchmarks.gpu_proof import proof as gpu_proof

    calls = []
    monkeypatch.setattr(gpu_proof, "prove", stub_prove(calls))
    workdir = tmp_path / "work"
    for _ in range(2):
        assert gpu_proof.main(["--device", "cpu", "--quick", "--workdir", str(workdir),
                               "--out", str(tmp_path / "p.json")]) == 0
    assert len(set(calls)) == 2 and all(work.parent == workdir for work in calls)
    assert all((work / "shapes.yaml").is_file() for work in calls)


@pytest.mark.parametrize("args, message", [
    ((), "ERROR: --device '0': CUDA is not available"),
    (("--device", "cpu"), "ERROR: --device cpu: the full plan is sized for a GPU"),
    (("--device", ""), "ERROR: --device '': name the device to prove"),
])
def test_no_quiet_fall_back_to_the_cpu(tmp_path, monkeypatch, capsys, args, message):
    """Finding 5: without CUDA the default device used to run the full plan on the CPU."""
    from benchmarks.gpu_proof import proof as gpu_proof
    from utils import torch_utils

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # records the value to restore: select_device exports one
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch_utils, "_exported_mask", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_proof, "prove", lambda *a: pytest.fail("the proof ran"))
    with pytest.raises(SystemExit) as stop:
        gpu_proof.main(["--out", str(tmp_path / "p.json"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith(message) and "--device cpu --quick" in err[0]
    assert not (tmp_path / "p.json").exists()


class FakeRun:
    def __init__(self, name, log):
        self.name, self.log, self.timed_out = name, log, False


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def test_the_cublas_row_fails_only_on_the_too_late_warning(monkeypatch):
    """Finding 7: any log line with 'has no effect' used to fail the row."""
    from benchmarks.gpu_proof import proof as gpu_proof
    from utils import torch_utils
    from utils.logging import LOGGER

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    LOGGER.addHandler(handler)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    try:
        torch_utils._ensure_cublas_workspace()
    finally:
        LOGGER.removeHandler(handler)
    assert len(lines) == 1, lines  # the real warning, as train.py would log it
    harmless = "WARNING: --cache ram has no effect with --workers 0"
    for log, status in ((harmless, "PASS"), (harmless + "\n" + lines[0], "FAIL")):
        futures = {key: Done(FakeRun(key, log)) for key in ("first", "again", "workers0")}
        row = gpu_proof.log_row(futures, True, gpu_proof.CUBLAS_TOO_LATE, False, "no cuBLAS too-late warning")
        assert row.status == status, (log, row.detail)


def test_timing_names_the_mode_it_compares_with(tmp_path, monkeypatch):
    """Finding 8: with the off row failed, warn became the baseline but was labelled 'vs off'."""
    from benchmarks.gpu_proof import proof as gpu_proof

    seconds = {"warn": 0.2, "scoped": 0.3, "strict": 0.4}

    def timed(cfg, imgsz, batch, mode, *rest):
        if mode == "off":
            raise RuntimeError("off broke")
        return seconds[mode]

    class TimedDevice(LiveDevice):
        def time_fixed_batch(self, cfg, imgsz, batch, mode, *rest):
            return timed(cfg, imgsz, batch, mode), 0.5

    proof = Proof(tmp_path / "p.json", budget_s=60, meta={})
    gpu_proof.timing_section(proof, gpu_proof.QUICK, TimedDevice(torch.device("cpu")), tmp_path / "data.yaml")
    rows = {row.name.rsplit(" ", 1)[1]: row for row in proof.rows}
    assert rows["off"].status == "ERROR" and proof.exit_code() == 0  # an information row
    for mode in ("warn", "scoped", "strict"):
        ratio = seconds[mode] / seconds["warn"]
        assert f"x{ratio:.3f} vs warn" in rows[mode].detail and rows[mode].data["baseline"] == "warn"
        assert "vs off" not in rows[mode].detail


def test_the_fault_launcher_rejects_a_bad_batch(capsys):
    from benchmarks.gpu_proof import fault_train

    with pytest.raises(SystemExit) as exit_info:
        fault_train.main(["--kill-after-batch", "0", "--cfg", "x.yaml"])
    assert exit_info.value.code == 2
    assert "--kill-after-batch 0: must be at least 1" in capsys.readouterr().err


def test_no_product_code_holds_a_test_only_kill_switch():
    """The mid-epoch SIGKILL is a callback of the proof's own launcher, not a switch that train.py reads."""
    from tests.support.project_files import project_files

    root = Path(__file__).resolve().parents[1]
    product = [p for p in project_files(root, ".py") if p.relative_to(root).parts[0] not in ("tests", "benchmarks")]
    assert product, "no product sources found"
    for path in product:
        text = path.read_text(errors="replace")
        assert "SIGKILL_AFTER" not in text and "os.kill(os.getpid(), signal.SIGKILL)" not in text, path



def test_kill_and_resume_chains_start_first(tmp_path):
    """Finding 2: l-ffca-yolo's kill-and-resume chain was the 8th task of a 6-slot pool and could miss the deadline."""
    from benchmarks.gpu_proof import proof as gpu_proof

    class RecordingPool:
        def __init__(self):
            self.order = []

        def submit(self, func, settings, cfg, name, *rest):
            self.order.append(name)
            return Done(name)

    pool = RecordingPool()
    futures = gpu_proof.start_reruns(pool, LiveDevice(torch.device("cpu")), None, gpu_proof.FULL.rerun_models,
                                     deadline=0)
    stems = [cfg.stem for cfg in gpu_proof.FULL.rerun_models]
    assert pool.order[:len(stems)] == [f"{stem}-killed" for stem in stems]
    assert len(pool.order) == 4 * len(stems) and len(stems) <= 6  # both chains get a slot of the 6 at once
    assert {key for cfg in futures for key in futures[cfg]} == {"killed", "first", "again", "workers0"}
    assert futures[gpu_proof.FULL.rerun_models[1]]["killed"].result() == f"{stems[1]}-killed"


def test_help_names_the_cpu_check(capsys):
    from benchmarks.gpu_proof import proof as gpu_proof

    with pytest.raises(SystemExit):
        gpu_proof.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "The quick plan is the CPU check" in text and "--device cpu --quick" in text


def test_a_run_cut_at_the_deadline_leaves_the_scam_and_log_rows_undecided(tmp_path):
    """Issue 37 finding 3, as the replay with a 45-s budget showed: the strict SCAM run killed at the deadline was a FAIL."""
    from benchmarks.gpu_proof import proof as gpu_proof
    from benchmarks.gpu_proof.runs import RunResult

    run = RunResult("scam-strict", -9, "AMP: checks passed", tmp_path, 45.0, timed_out=True)
    proof = Proof(tmp_path / "p.json", budget_s=60, meta={})
    row = proof.check("scam", "strict stops", lambda: gpu_proof.strict_stop_row(Done(run), "PutGradientSCAM"))
    assert row.status == "INCOMPLETE" and "deadline" in row.detail
    futures = {key: Done(run) for key in ("first", "again", "workers0")}
    row = proof.check("reruns", "AMP on", lambda: gpu_proof.log_row(futures, True, "AMP: checks passed", True, "AMP"))
    assert row.status == "INCOMPLETE" and proof.exit_code() == 3
