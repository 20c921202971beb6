"""utils.determinism.compare names the cause of two runs' difference; data_fingerprint sees label edits."""

import json

import pytest

from utils.determinism.compare import compare_runs, main
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


def test_one_changed_option_is_named_first(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", opt={"imgsz": 96}, rows=ROWS.replace("0.3", "0.4"), checksum="d" * 64)
    lines, identical = compare_runs(a, b)
    assert not identical
    assert lines[2:4] == ["options: DIFFER", "  imgsz: 64 -> 96"]
    assert "results.csv: first differing row is epoch 1" in lines
    assert any(line.startswith("final checksums: DIFFER") for line in lines)


def test_a_different_thread_count_is_an_environment_difference(tmp_path):
    lines, identical = compare_runs(_run(tmp_path / "a"), _run(tmp_path / "b", threads=1))
    assert not identical and "options: same" in lines
    assert lines[lines.index("environment: DIFFER") + 1] == "  threads: 2 -> 1"


def test_a_report_repeating_the_audit_in_policy_state_compares_by_the_top_level_copy(tmp_path):
    audit, state = {"clean": True, "findings": []}, {"mode": "scoped", "warn_only": False}
    repeated = {**state, "audit": audit, "nondeterministic_ops": {}}
    older = _run(tmp_path / "older",
                 report_extra={"audit": audit, "nondeterministic_ops": {}, "policy_state": repeated})
    newer = _run(tmp_path / "newer", report_extra={"audit": audit, "nondeterministic_ops": {}, "policy_state": state})
    assert compare_runs(older, newer)[1]
    flagged = _run(tmp_path / "flagged", report_extra={"audit": {**audit, "clean": False}, "policy_state": state})
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
    lines, identical = compare_runs(_run(tmp_path / "a", fingerprint=before), _run(tmp_path / "b", fingerprint=after))
    assert not identical and "environment: same" in lines and "data: DIFFER" in lines


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
