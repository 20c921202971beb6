"""The machine's part in a run's bits: what determinism.json records of it, and what changed at a resume.

The same command and seed repeat bit for bit on the same machine setup only: another thread count, vector width
of torch's CPU kernels (``cpu_capability``), torch, CUDA or cuDNN version, or GPU model rounds some sums
differently. ``--resume`` on another setup continues correctly but no longer bit-identically to an uninterrupted
run; it says so once and records the change in determinism.json (``machine_changes``), and
``python -m utils.determinism.compare`` names such a change first.
"""

import json
from pathlib import Path

from utils.logging import LOGGER

# (key in determinism.json, words); a dotted key is read from a nested mapping
MACHINE_FACTS = (("threads", "thread count"), ("cpu_capability", "CPU capability"), ("versions.torch", "torch"),
                 ("versions.cuda", "CUDA"), ("versions.cudnn", "cuDNN"), ("devices", "device"))


def machine_fact(report: dict, key: str):
    """One fact of a determinism record; None when the record predates it. The CPU counts as 'cpu': its core
    count, which determinism.json also records, changes no bit (the thread count does)."""
    value = report
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if key == "devices" and isinstance(value, list):
        gpus = [str(name) for name in value if not str(name).startswith("cpu")]
        return ", ".join(gpus) if gpus else "cpu"
    return value


def machine_changes(before: dict, after: dict) -> list:
    """``[(words, before, after)]`` for every fact both records hold and that differs."""
    changes = []
    for key, words in MACHINE_FACTS:
        old, new = machine_fact(before, key), machine_fact(after, key)
        if old is not None and new is not None and old != new:
            changes.append((words, old, new))
    return changes


def describe_changes(changes) -> str:
    """``thread count 2 -> 1, CPU capability AVX512 -> AVX2``."""
    return ", ".join(f"{words} {old} -> {new}" for words, old, new in changes)


def recorded_changes(report: dict) -> list:
    """A record's ``machine_changes`` as lines: ``resumed at epoch 1 batch 3 under thread count 2 -> 1``."""
    lines = []
    for change in report.get("machine_changes") or []:
        epoch, batch = change["resumed_at"]
        facts = [(words, old, new) for words, (old, new) in change["changes"].items()]
        lines.append(f"resumed at epoch {epoch} batch {batch} under {describe_changes(facts)}")
    return lines


def _previous_record(path: Path) -> dict:
    """The determinism.json a resumed run wrote before (empty when missing or unreadable: nothing to compare)."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def check_resumed_machine(path, report: dict, position) -> dict:
    """On ``--resume`` at ``position`` (epoch, batch): compare this run's new determinism ``report`` with the one
    at ``path`` that the run wrote before, warn once when the machine setup changed, and return ``report`` with
    every change so far in ``machine_changes``."""
    previous = _previous_record(path)
    history = list(previous.get("machine_changes") or [])
    changes = machine_changes(previous, report)
    if changes:
        LOGGER.warning(f"--resume on another machine setup: {describe_changes(changes)}. The run continues, but "
                       "from here on it will not match an uninterrupted run bit for bit.")
        history.append({"resumed_at": [int(position[0]), int(position[1])],
                        "changes": {words: [old, new] for words, old, new in changes}})
    return {**report, "machine_changes": history} if history else report
