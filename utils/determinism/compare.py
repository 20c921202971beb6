"""Whether two training runs gave the same result, and if not, why: ``python -m utils.determinism.compare A B``.

It judges results, not settings. The results are each run's results.csv and the final EMA checksum:
the same give "identical" and exit code 0, and every setting that differs is listed as a change that did not
alter the result (e.g. ``--workers``, documented not to change the weights). Runs whose results differ exit
with 1 and get every difference, causes in this order, the first one named in the verdict: the machine
(thread count, CPU capability, torch, CUDA, cuDNN, device, also a resume on another setup midway), the options,
the hyperparameters, the rest of the environment (Python and torchvision versions, world size, workers,
determinism mode and audit, seed...) and the training data (``data_fingerprint``). Exit code 2: a run folder
cannot be read, its determinism.json is not a record train.py writes, or neither run has a result yet (one
line naming the file or folder).
"""

import argparse
import csv
import json
import sys
from pathlib import Path

from utils.determinism.machine import MACHINE_FACTS, machine_changes, recorded_changes
from utils.errors import UserError, exit_on_user_error
from utils.files import yaml_load

# Options that name the run folder, not what is computed.
RUN_NAMING_OPTIONS = {"name", "project", "save_dir", "exist_ok", "resume"}
# Settings that change no result (loader workers, when last.pt is written mid-epoch, trackers): listed when they
# differ, never named as the cause of a difference.
NEUTRAL_SETTINGS = {"workers", "save_interval", "logger"}
# determinism.json's fields besides the machine's (utils/determinism/machine.py) and the data's
ENVIRONMENT_FIELDS = ("versions", "world_size", "workers", "mode", "audit", "twins", "relaxed_backward",
                      "policy_state", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "seed")
MACHINE_VERSIONS = {key.split(".", 1)[1] for key, _ in MACHINE_FACTS if key.startswith("versions.")}
# What every determinism.json train.py writes holds, and the types compare relies on.
RECORD_FIELDS = {"mode": (str,), "world_size": (int,), "threads": (int,), "versions": (dict,),
                 "data_fingerprint": (str, type(None))}
OPTIONAL_FIELDS = {"final_ema_sha256": (str, type(None)), "policy_state": (dict, type(None)),
                   "cpu_capability": (str, type(None)), "machine_changes": (list, type(None))}
# Older determinism.json files repeat these inside policy_state; their top-level copies are what is compared.
REPEATED_IN_POLICY_STATE = ("audit", "nondeterministic_ops")


def check_record(report, path: Path) -> None:
    """A determinism.json that is not a record train.py writes is one UserError naming the file: a crash
    must never read as compare's "the runs differ"."""
    if not isinstance(report, dict):
        raise UserError(f"{path}: not a determinism record (a JSON {type(report).__name__}, expected an object "
                        "written by train.py)")
    missing = [key for key in RECORD_FIELDS if key not in report]
    if missing:
        raise UserError(f"{path}: not a determinism record (no {', '.join(missing)}); was it written by train.py?")
    for key, kinds in {**RECORD_FIELDS, **OPTIONAL_FIELDS}.items():
        if key in report and (not isinstance(report[key], kinds) or isinstance(report[key], bool)):
            raise UserError(f"{path}: '{key}' is a {type(report[key]).__name__}, expected "
                            f"{' or '.join(kind.__name__ for kind in kinds)}")
    for change in report.get("machine_changes") or []:
        if not (isinstance(change, dict) and _is_position(change.get("resumed_at"))
                and isinstance(change.get("changes"), dict)
                and all(isinstance(pair, list) and len(pair) == 2 for pair in change["changes"].values())):
            raise UserError(f"{path}: 'machine_changes' holds {json.dumps(change)[:80]}, not a change train.py "
                            "records (resumed_at [epoch, batch] and changes {fact: [before, after]})")


def _is_position(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _read_run(run_dir: Path) -> dict:
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a run folder; pass two folders written by train.py (e.g. runs/train/exp)")
    report_path = run_dir / "determinism.json"
    if not report_path.is_file():
        raise UserError(f"{report_path}: file not found; compare needs run folders written by train.py")
    try:
        report = json.loads(_utf8_text(report_path))
    except json.JSONDecodeError as e:
        raise UserError(f"{report_path}: not valid JSON ({e})") from None
    check_record(report, report_path)
    if isinstance(report.get("policy_state"), dict):
        report["policy_state"] = {k: v for k, v in report["policy_state"].items() if k not in REPEATED_IN_POLICY_STATE}
    results = run_dir / "results.csv"
    rows = []
    if results.is_file():
        try:
            rows = [[cell.strip() for cell in row] for row in csv.reader(_utf8_text(results).splitlines())]
        except csv.Error as e:
            raise UserError(f"{results}: not a CSV file train.py wrote ({e})") from None
    return {"opt": _settings(run_dir / "opt.yaml"), "hyp": _settings(run_dir / "hyp.yaml"),
            "report": report, "rows": rows}


def _utf8_text(path: Path) -> str:
    """The text of a file train.py wrote (UTF-8; a byte-order mark, as a spreadsheet's "CSV UTF-8" adds, is
    dropped); other encodings are one UserError naming the file, not a UnicodeDecodeError."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text (re-saved in another encoding, e.g. UTF-16 by a spreadsheet?); "
                        "compare needs the file as train.py wrote it") from None


def _settings(path: Path) -> dict:
    """opt.yaml or hyp.yaml of a run: an empty one is an unreadable run folder, not a run whose options all
    differ."""
    if path.is_file():
        _utf8_text(path)  # another encoding is named as such, not parsed into options that differ
    settings = yaml_load(path)
    if not settings:
        raise UserError(f"{path}: empty; compare needs the file as train.py wrote it")
    return settings


def _differences(a: dict, b: dict, keys, prefix: str = "") -> list:
    """Lines ``key: A -> B`` for every key whose values differ (nested mappings are walked)."""
    lines = []
    for key in keys:
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            lines += _differences(va, vb, sorted(set(va) | set(vb)), f"{prefix}{key}.")
        elif va != vb:
            lines.append(f"{prefix}{key}: {va!r} -> {vb!r}")
    return lines


def _machine(a: dict, b: dict) -> list:
    """The machine setups' differences, then each run's resumes on another setup."""
    lines = [f"{words}: {old!r} -> {new!r}" for words, old, new in machine_changes(a, b)]
    for run, report in (("A", a), ("B", b)):
        lines += [f"{run} {change}" for change in recorded_changes(report)]
    return lines


def _environment(report: dict) -> dict:
    """The environment fields, without the versions that are the machine's."""
    versions = {k: v for k, v in report.get("versions", {}).items() if k not in MACHINE_VERSIONS}
    return {**{key: report.get(key) for key in ENVIRONMENT_FIELDS}, "versions": versions}


def _causes(a: dict, b: dict) -> list:
    """``[(title, difference lines)]`` in the order a cause is looked for."""
    options = sorted((set(a["opt"]) | set(b["opt"])) - RUN_NAMING_OPTIONS)
    fa, fb = a["report"].get("data_fingerprint"), b["report"].get("data_fingerprint")
    return [("machine", _machine(a["report"], b["report"])),
            ("options", _differences(a["opt"], b["opt"], options)),
            ("hyperparameters", _differences(a["hyp"], b["hyp"], sorted(set(a["hyp"]) | set(b["hyp"])))),
            ("environment", _differences(_environment(a["report"]), _environment(b["report"]), ENVIRONMENT_FIELDS)),
            ("data", [] if fa == fb else [f"data_fingerprint: {fa} -> {fb} (image list or label files differ)"])]


def _results(a: dict, b: dict, run_a, run_b) -> tuple:
    """(lines on results.csv and the final checksums, whether both are the same)."""
    rows_a, rows_b = a["rows"], b["rows"]
    ca, cb = a["report"].get("final_ema_sha256"), b["report"].get("final_ema_sha256")
    if not rows_a and not rows_b and ca is None and cb is None:
        raise UserError(f"{run_a}, {run_b}: neither run has a result yet (no results.csv row, no final checksum); "
                        "compare judges results: compare them once an epoch has ended")
    first = next((i for i, (ra, rb) in enumerate(zip(rows_a[1:], rows_b[1:])) if ra != rb), None)
    if bool(rows_a) != bool(rows_b):
        lines = [f"results.csv: DIFFER: only {'A' if rows_a else 'B'} has one"]
    elif rows_a[:1] != rows_b[:1]:
        lines = ["results.csv: DIFFER: the columns differ"]
    elif first is not None:
        epoch = rows_a[first + 1][0] if rows_a[first + 1] else first
        lines = [f"results.csv: DIFFER from epoch {epoch}", f"  A: {','.join(rows_a[first + 1])}",
                 f"  B: {','.join(rows_b[first + 1])}"]
    elif len(rows_a) != len(rows_b):
        lines = [f"results.csv: DIFFER: the same first {min(len(rows_a), len(rows_b)) - 1} epochs; "
                 f"A has {max(len(rows_a) - 1, 0)}, B has {max(len(rows_b) - 1, 0)}"]
    else:
        lines = [f"results.csv: same ({max(len(rows_a) - 1, 0)} epochs{'' if rows_a else ', no file'})"]
    same = not lines[0].startswith("results.csv: DIFFER") and ca == cb
    lines.append(f"final checksums: same: {ca}" if ca == cb else f"final checksums: DIFFER: A {ca}, B {cb}")
    return lines, same


def compare_runs(run_a, run_b) -> tuple:
    """(report lines, identical) for two run folders: the results, then the settings that differ."""
    a, b = _read_run(Path(run_a)), _read_run(Path(run_b))
    result_lines, identical = _results(a, b, run_a, run_b)
    causes = _causes(a, b)
    lines = [f"A: {run_a}", f"B: {run_b}", *result_lines]
    if identical:
        unchanged = [f"  {line} ({title})" for title, found in causes for line in found]
        if unchanged:
            lines += ["changes that did not alter the result:", *unchanged]
        return [*lines, "verdict: identical"], True
    for title, found in causes:
        lines += [f"{title}: {'DIFFER' if found else 'same'}", *(f"  {line}" for line in found)]
    cause = next((f"{title}: {line}" for title, found in causes for line in found
                  if line.split(":", 1)[0] not in NEUTRAL_SETTINGS), None)
    if cause is None:
        lines.append("verdict: the runs differ, and nothing that changes a result differs (machine, options, "
                     "hyperparameters, environment, data); see 'Honest limits' in docs/determinism.md")
    else:
        lines.append(f"verdict: the runs differ; first cause found: {cause}")
    return lines, False


@exit_on_user_error
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Say where two training runs diverged, causes first.")
    parser.add_argument("run_a", help="first run folder (e.g. runs/train/exp)")
    parser.add_argument("run_b", help="second run folder")
    opt = parser.parse_args(argv)
    lines, identical = compare_runs(opt.run_a, opt.run_b)
    print("\n".join(lines))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
