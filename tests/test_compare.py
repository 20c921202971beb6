"""utils.determinism.compare names the cause of two runs' difference; data_fingerprint sees label edits."""

import json

import pytest

from utils.determinism.compare import compare_runs, main
from utils.determinism.machine import check_resumed_machine
from utils.files import yaml_save
from utils.determinism.reproducibility import data_fingerprint

ROWS = "epoch,train/box_loss,metrics/mAP_0.5\n0,0.1,0.2\n1,0.09,0.3\n"


def _run(folder, opt=None, threads=2, fingerprint="f" * 64, rows=ROWS, checksum="c" * 64, report_extra=None):
    folder.mkdir(parents=True)
    yaml_save(folder / "opt.yaml", {"epochs": 2, "imgsz": 64, "name": folder.name, **(opt or {})})
    yaml_save(folder / "hyp.yaml", {"lr0": 0.01})
    report = {"mode": "scoped", "threads": threads, "world_size": 1, "versions": {"torch": "2.x"},
              "data_fingerprint": fingerprint, "final_ema_sha256": checksum, **(report_extra or {})}
    (folder / "determinism.json").write_text(json.dumps(report))
    (folder / "results.csv").write_text(rows)
    return folder


def test_identical_runs_say_so_and_exit_0(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    lines, identical = compare_runs(a, b)
    assert identical and lines[-1] == "verdict: identical"
    assert main([str(a), str(b)]) == 0
    assert "DIFFER" not in capsys.readouterr().out


def test_settings_that_did_not_change_the_result_are_listed_and_the_runs_are_identical(tmp_path, capsys):
    """--workers 0 and 2 give one checksum and one results.csv: identical, with workers named as a change."""
    a = _run(tmp_path / "a", opt={"workers": 0}, report_extra={"workers": 0})
    b = _run(tmp_path / "b", opt={"workers": 2}, report_extra={"workers": 2})
    assert main([str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4:] == ["changes that did not alter the result:", "  workers: 0 -> 2 (options)",
                          "  workers: 0 -> 2 (environment)", "verdict: identical"]


def test_one_changed_option_is_named_as_the_cause(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", opt={"imgsz": 96}, rows=ROWS.replace("0.3", "0.4"), checksum="d" * 64)
    lines, identical = compare_runs(a, b)
    assert not identical
    assert lines[2:5] == ["results.csv: DIFFER from epoch 1", "  A: 1,0.09,0.3", "  B: 1,0.09,0.4"]
    assert lines[5].startswith("final checksums: DIFFER")
    assert lines[lines.index("options: DIFFER") + 1] == "  imgsz: 64 -> 96"
    assert lines[-1] == "verdict: the runs differ; first cause found: options: imgsz: 64 -> 96"


def test_the_machine_is_named_first_when_results_differ(tmp_path):
    a = _run(tmp_path / "a", report_extra={"cpu_capability": "AVX512"})
    b = _run(tmp_path / "b", threads=1, opt={"imgsz": 96}, checksum="d" * 64, report_extra={"cpu_capability": "AVX2"})
    lines, identical = compare_runs(a, b)
    assert not identical
    machine = lines[lines.index("machine: DIFFER") + 1:][:2]
    assert machine == ["  thread count: 2 -> 1", "  CPU capability: 'AVX512' -> 'AVX2'"]
    assert lines[-1] == "verdict: the runs differ; first cause found: machine: thread count: 2 -> 1"


def test_a_resume_on_another_machine_setup_is_named_as_the_cause(tmp_path):
    change = {"resumed_at": [1, 0], "changes": {"thread count": [2, 1]}}
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", checksum="d" * 64, report_extra={"machine_changes": [change]})
    lines, identical = compare_runs(a, b)
    assert not identical and "environment: same" in lines and "options: same" in lines
    assert lines[-1] == ("verdict: the runs differ; first cause found: machine: B resumed at epoch 1 batch 0 "
                         "under thread count 2 -> 1")


def test_results_that_differ_with_nothing_else_differing_say_so(tmp_path):
    lines, identical = compare_runs(_run(tmp_path / "a"), _run(tmp_path / "b", checksum="d" * 64))
    assert not identical and lines[-1].startswith("verdict: the runs differ, and nothing that changes a result")


def test_a_setting_that_changes_no_result_is_listed_but_not_named_as_the_cause(tmp_path):
    a = _run(tmp_path / "a", opt={"workers": 0}, report_extra={"workers": 0})
    b = _run(tmp_path / "b", opt={"workers": 2}, report_extra={"workers": 2, "mode": "off"}, checksum="d" * 64)
    lines, identical = compare_runs(a, b)
    assert not identical and lines[lines.index("options: DIFFER") + 1] == "  workers: 0 -> 2"
    assert lines[-1] == "verdict: the runs differ; first cause found: environment: mode: 'scoped' -> 'off'"
    lines, _ = compare_runs(a, _run(tmp_path / "c", opt={"workers": 2}, report_extra={"workers": 2}, checksum="d" * 64))
    assert lines[-1].startswith("verdict: the runs differ, and nothing that changes a result differs")


def test_a_report_repeating_the_audit_in_policy_state_compares_by_the_top_level_copy(tmp_path):
    audit, state = {"clean": True, "findings": []}, {"mode": "scoped", "warn_only": False}
    repeated = {**state, "audit": audit, "nondeterministic_ops": {}}
    older = _run(tmp_path / "older",
                 report_extra={"audit": audit, "nondeterministic_ops": {}, "policy_state": repeated})
    newer = _run(tmp_path / "newer", report_extra={"audit": audit, "nondeterministic_ops": {}, "policy_state": state})
    lines, identical = compare_runs(older, newer)
    assert identical and "changes that did not alter the result:" not in lines
    flagged = _run(tmp_path / "flagged", checksum="d" * 64,
                   report_extra={"audit": {**audit, "clean": False}, "policy_state": state})
    lines, identical = compare_runs(newer, flagged)
    assert not identical and "  audit.clean: True -> False" in lines


def test_one_changed_label_file_changes_the_fingerprint_and_compare_names_the_data(tmp_path):
    images = [tmp_path / f"{i}.jpg" for i in range(3)]
    labels = [tmp_path / f"{i}.txt" for i in range(3)]
    for label in labels:
        label.write_text("0 0.5 0.5 0.1 0.1\n")
    before = data_fingerprint(images, labels)
    assert data_fingerprint(images, labels) == before
    labels[1].write_text("1 0.5 0.5 0.1 0.1\n")
    after = data_fingerprint(images, labels)
    assert after != before
    lines, identical = compare_runs(_run(tmp_path / "a", fingerprint=before),
                                    _run(tmp_path / "b", fingerprint=after, checksum="d" * 64))
    assert not identical and "environment: same" in lines and "data: DIFFER" in lines
    assert lines[-1].startswith("verdict: the runs differ; first cause found: data: data_fingerprint:")


def test_runs_without_any_result_are_exit_2(tmp_path, capsys):
    a, b = _run(tmp_path / "a", rows="", checksum=None), _run(tmp_path / "b", rows="", checksum=None)
    for run in (a, b):
        (run / "results.csv").unlink()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a), str(b)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "neither run has a result yet" in err[0]


@pytest.mark.parametrize("missing", ["folder", "determinism.json"])
def test_unreadable_run_is_one_error_line_exit_2(tmp_path, capsys, missing):
    a = _run(tmp_path / "a")
    b = tmp_path / "nope" if missing == "folder" else _run(tmp_path / "b")
    if missing == "determinism.json":
        (b / "determinism.json").unlink()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a), str(b)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("ERROR:") and str(b) in err[0]


BROKEN_RECORDS = {
    "a list": "[1, 2, 3]", "null": "null", "a string": '"report"',
    "no mode": json.dumps({"threads": 2, "world_size": 1, "versions": {}, "data_fingerprint": "f"}),
    "a list of versions": json.dumps({"mode": "scoped", "threads": 2, "world_size": 1, "versions": [],
                                      "data_fingerprint": "f"}),
    "a text thread count": json.dumps({"mode": "scoped", "threads": "2", "world_size": 1, "versions": {},
                                       "data_fingerprint": "f"}),
    "a checksum number": json.dumps({"mode": "scoped", "threads": 2, "world_size": True, "versions": {},
                                     "data_fingerprint": "f", "final_ema_sha256": 7}),
}


@pytest.mark.parametrize("broken", BROKEN_RECORDS, ids=list(BROKEN_RECORDS))
def test_a_record_that_is_not_one_is_exit_2_naming_the_file_not_a_verdict(tmp_path, capsys, broken):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / "determinism.json").write_text(BROKEN_RECORDS[broken])
    for argv in ([str(a), str(b)], [str(b), str(a)]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert exit_info.value.code == 2 and captured.out == "", (broken, err)
        assert len(err) == 1 and err[0].startswith(f"ERROR: {b / 'determinism.json'}: "), err


@pytest.mark.parametrize("damage", ["utf-16 results.csv", "empty opt.yaml", "empty hyp.yaml", "utf-16 opt.yaml",
                                    "utf-16 determinism.json"])
def test_a_run_file_in_another_encoding_or_empty_is_exit_2_naming_it(tmp_path, capsys, damage):
    """A results.csv re-saved as UTF-16 ended in a UnicodeDecodeError traceback; an empty opt.yaml was reported
    as "options DIFFER"."""
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    kind, name = damage.split()
    target = b / name
    target.write_bytes(b"" if kind == "empty" else target.read_text().encode("utf-16"))
    with pytest.raises(SystemExit) as exit_info:
        main([str(a), str(b)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert exit_info.value.code == 2 and captured.out == "", err
    assert len(err) == 1 and err[0].startswith(f"ERROR: {target}: "), err
    assert ("UTF-8" if kind == "utf-16" else "empty") in err[0]


def test_a_results_csv_saved_with_a_byte_order_mark_compares_as_the_same(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / "results.csv").write_bytes(ROWS.encode("utf-8-sig"))
    assert compare_runs(a, b)[1]


def test_a_resume_on_another_setup_warns_once_naming_both_values_and_is_recorded(tmp_path, log_lines):
    record = tmp_path / "determinism.json"
    before = {"threads": 2, "cpu_capability": "AVX512", "versions": {"torch": "2.14.1", "cuda": None},
              "devices": ["cpu (2 cores)"]}
    record.write_text(json.dumps(before))
    after = {**before, "threads": 1, "cpu_capability": "AVX2", "devices": ["cpu (16 cores)"]}
    report = check_resumed_machine(record, after, (1, 3))
    warnings = [line for line in log_lines if "another machine setup" in line]
    assert len(warnings) == 1 and "thread count 2 -> 1, CPU capability AVX512 -> AVX2. " in warnings[0]
    assert "will not match an uninterrupted run bit for bit" in warnings[0] and "cores" not in warnings[0]
    assert report["machine_changes"] == [{"resumed_at": [1, 3],
                                          "changes": {"thread count": [2, 1], "CPU capability": ["AVX512", "AVX2"]}}]
    record.write_text(json.dumps(report))
    again = check_resumed_machine(record, after, (2, 0))  # the same setup as the last part: no new warning
    assert len([line for line in log_lines if "another machine setup" in line]) == 1
    assert again["machine_changes"] == report["machine_changes"]
    assert "machine_changes" not in check_resumed_machine(tmp_path / "missing.json", after, (1, 0))
