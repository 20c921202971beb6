"""What a tracker records about a run, read from the files train.py writes in the run folder.

The run folder is the single source: ``opt.yaml`` and ``hyp.yaml`` become parameters,
``determinism.json`` (mode, audit, relaxed ops, versions, data fingerprint, final EMA checksum)
becomes tags, and the checkpoints, plots and records become artifacts. A tracker therefore
shows exactly what the folder holds, and a folder without a tracker loses nothing.
"""

import json
import math
import subprocess
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD_FILES = ("opt.yaml", "hyp.yaml", "determinism.json", "environment.yaml", "results.csv")
WEIGHT_FILES = ("best.pt", "last.pt")
PLOT_SUFFIXES = (".png", ".jpg")
MAX_PARAM_CHARS = 500  # MLflow caps parameter values; long lists are cut, the full text is in opt.yaml


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(errors="replace"))
    return data if isinstance(data, dict) else {}


def read_determinism(save_dir) -> dict:
    """The run's determinism.json as a dict ({} when absent or unreadable)."""
    path = Path(save_dir) / "determinism.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_params(save_dir) -> dict:
    """``{"opt/<flag>": text, "hyp/<name>": text}`` from opt.yaml and hyp.yaml (values as strings)."""
    save_dir = Path(save_dir)
    params = {}
    for group in ("opt", "hyp"):
        for key, value in _read_yaml(save_dir / f"{group}.yaml").items():
            params[f"{group}/{key}"] = str(value)[:MAX_PARAM_CHARS]
    return params


def git_commit(repo=REPO_ROOT) -> str | None:
    """The commit the code was run from, or None outside a git checkout (or without git)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def audit_words(audit) -> str:
    """The start-up audit in a few words: 'not run', 'clean', or the ops it found."""
    if not audit:
        return "not run"
    found = [f.get("op", "?") for f in audit.get("findings", [])] + [f.get("op", "?") for f in
                                                                      audit.get("torch_flagged", [])]
    return "clean" if not found else f"{len(found)} finding(s): {', '.join(sorted(set(found)))}"


def run_tags(save_dir) -> dict:
    """Searchable facts of the run (strings): determinism, audit, relaxed ops, EMA checksum, data, versions."""
    report = read_determinism(save_dir)
    versions = report.get("versions", {})
    relaxed = report.get("nondeterministic_ops") or {}
    tags = {
        "determinism.mode": report.get("mode"),
        "determinism.audit": audit_words(report.get("audit")),
        "determinism.relaxed_ops": ", ".join(f"{op} x{n}" for op, n in relaxed.items()) or "none",
        "determinism.guarantee": report.get("guarantee"),
        "seed": report.get("seed"),
        "data_fingerprint": report.get("data_fingerprint"),
        "ema_sha256": report.get("final_ema_sha256"),
        "git_commit": git_commit(),
        "torch": versions.get("torch"),
        "cuda": versions.get("cuda"),
        "cudnn": versions.get("cudnn"),
        "devices": ", ".join(report.get("devices", [])) or None,
        "world_size": report.get("world_size"),
    }
    return {key: str(value) for key, value in tags.items() if value is not None}


def finite_metrics(values: dict) -> dict:
    """The entries of ``values`` that are finite numbers (a size band without labels is NaN: left out)."""
    return {k: float(v) for k, v in values.items() if math.isfinite(float(v))}


def run_artifacts(save_dir) -> list:
    """``[(file, folder in the artifact store)]``: weights, records and plots the run folder holds."""
    save_dir = Path(save_dir)
    files = [(save_dir / "weights" / name, "weights") for name in WEIGHT_FILES]
    files += [(save_dir / name, "") for name in RECORD_FILES]
    if save_dir.is_dir():
        files += [(path, "plots") for path in sorted(save_dir.iterdir()) if path.suffix in PLOT_SUFFIXES]
    return [(path, folder) for path, folder in files if path.is_file()]
