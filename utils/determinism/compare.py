"""Where two training runs diverged: ``python -m utils.determinism.compare RUN_A RUN_B``.

Prints, in order of cause: differing options and hyperparameters, differing environment fields
(versions, devices, threads, world size, determinism mode and audit), whether the training data
differs (``data_fingerprint``), the first epoch whose results.csv row differs, and the final
checksums. Exit code 0: identical, 1: they differ, 2: a run folder cannot be read or its
determinism.json is not a record train.py writes (one line naming the file).
"""

import argparse
import csv
import json
import sys
from pathlib import Path

from utils.errors import UserError, exit_on_user_error
from utils.files import yaml_load

# Options that name the run folder, not what is computed.
RUN_NAMING_OPTIONS = {"name", "project", "save_dir", "exist_ok", "resume"}
ENVIRONMENT_FIELDS = ("versions", "devices", "threads", "world_size", "workers", "mode", "audit", "twins",
                      "relaxed_backward", "policy_state", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "seed")
# What every determinism.json train.py writes holds, and the types compare relies on.
RECORD_FIELDS = {"mode": (str,), "world_size": (int,), "threads": (int,), "versions": (dict,),
                 "data_fingerprint": (str, type(None))}
OPTIONAL_FIELDS = {"final_ema_sha256": (str, type(None)), "policy_state": (dict, type(None))}
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
            lines.append(f"  {prefix}{key}: {va!r} -> {vb!r}")
    return lines


def compare_runs(run_a, run_b) -> tuple:
    """(report lines, identical) for two run folders, causes first."""
    a, b = _read_run(Path(run_a)), _read_run(Path(run_b))
    sections = []
    options = sorted((set(a["opt"]) | set(b["opt"])) - RUN_NAMING_OPTIONS)
    sections.append(("options", _differences(a["opt"], b["opt"], options)))
    sections.append(("hyperparameters", _differences(a["hyp"], b["hyp"], sorted(set(a["hyp"]) | set(b["hyp"])))))
    sections.append(("environment", _differences(a["report"], b["report"], ENVIRONMENT_FIELDS)))
    fa, fb = a["report"].get("data_fingerprint"), b["report"].get("data_fingerprint")
    sections.append(("data", [] if fa == fb else [f"  data_fingerprint: {fa} -> {fb} (image list or label files differ)"]))
    lines, identical = [f"A: {run_a}", f"B: {run_b}"], True
    for title, found in sections:
        identical &= not found
        lines.append(f"{title}: {'same' if not found else 'DIFFER'}")
        lines += found
    header, rows_a, rows_b = a["rows"][:1], a["rows"][1:], b["rows"][1:]
    first = next((i for i, (ra, rb) in enumerate(zip(rows_a, rows_b)) if ra != rb), None)
    if first is not None:
        epoch = rows_a[first][0] if rows_a[first] else first
        lines.append(f"results.csv: first differing row is epoch {epoch}")
        lines += [f"  A: {','.join(rows_a[first])}", f"  B: {','.join(rows_b[first])}"]
    elif len(rows_a) != len(rows_b):
        lines.append(f"results.csv: same first {min(len(rows_a), len(rows_b))} epochs; "
                     f"A has {len(rows_a)}, B has {len(rows_b)}")
    else:
        lines.append(f"results.csv: same ({len(rows_a)} epochs{'' if header else ', no file'})")
    identical &= first is None and len(rows_a) == len(rows_b)
    ca, cb = a["report"].get("final_ema_sha256"), b["report"].get("final_ema_sha256")
    identical &= ca == cb
    lines.append(f"final checksums: {'same' if ca == cb else 'DIFFER'}: A {ca}, B {cb}")
    lines.append("verdict: identical" if identical else "verdict: the runs differ; the first DIFFER above is the likely cause")
    return lines, identical


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
