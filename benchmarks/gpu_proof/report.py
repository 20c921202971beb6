"""The GPU proof's record: one row per check, a time budget, a printed table and an atomic JSON file.

Every check runs through :meth:`Proof.check`, which turns any exception into a FAIL row with a
one-line reason, so one broken check never stops the others. The JSON file is rewritten
atomically after every row (a run cut short still leaves a readable record) and once at the end
with ``"complete": true`` unless a check was skipped because the budget was spent.
"""

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from utils.files import atomic_write_bytes

STATUSES = ("PASS", "FAIL", "SKIP", "INFO")
# What a row says, finer than its status: a FAIL is a MISMATCH (audit and device disagree), a
# TIMEOUT (a run killed at the proof's deadline) or a plain FAIL; a SKIP is for the budget or not.
KINDS = ("PASS", "FAIL", "MISMATCH", "TIMEOUT", "SKIP budget", "SKIP", "INFO")
BUDGET_SKIP = "time budget"
NAME_WIDTH = 56


@dataclass
class Verdict:
    """What a check concluded: a status from :data:`STATUSES`, one line of detail, and plain data."""

    status: str
    detail: str = ""
    data: dict = field(default_factory=dict)


def verdict(ok: bool, detail: str = "", **data) -> Verdict:
    """PASS when ``ok``, else FAIL."""
    return Verdict("PASS" if ok else "FAIL", detail, data)


def skip(detail: str, **data) -> Verdict:
    """A check that does not apply here (e.g. CUDA-only on a CPU run)."""
    return Verdict("SKIP", detail, data)


def info(detail: str, **data) -> Verdict:
    """A measurement or an observation that is not a pass/fail claim."""
    return Verdict("INFO", detail, data)


class DeadlineExceeded(RuntimeError):
    """A training run was still going at the proof's deadline and was killed."""


def one_line(error: BaseException) -> str:
    """``'TypeName: first line of the message'``."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


@dataclass
class Row:
    """One line of the table."""

    section: str
    name: str
    status: str
    detail: str
    seconds: float
    data: dict


class Proof:
    """Collects rows under a wall-clock budget and keeps ``out`` (JSON) up to date."""

    def __init__(self, out: Path, budget_s: float, meta: dict, clock: Callable[[], float] = time.monotonic):
        self.clock = clock  # a replay (benchmarks/gpu_proof/device.py) passes one that can jump to a budget cut
        self.out = Path(out)
        self.budget_s = budget_s
        self.meta = dict(meta)
        self.rows: list[Row] = []
        self.budget_skips = 0  # checks not run because the budget was spent: the proof is then incomplete
        self.started = clock()

    def elapsed(self) -> float:
        """Seconds since the proof started."""
        return self.clock() - self.started

    def remaining(self) -> float:
        """Seconds left in the budget (negative once it is spent)."""
        return self.budget_s - self.elapsed()

    def check(self, section: str, name: str, func: Callable[[], Verdict]) -> Row:
        """Run ``func`` unless the budget is spent; any exception becomes a FAIL row with its reason."""
        t0 = time.monotonic()
        if self.remaining() <= 0:
            result = skip(f"{BUDGET_SKIP} of {self.budget_s:.0f} s spent before this check")
            self.budget_skips += 1
        else:
            try:
                result = func()
            except DeadlineExceeded as e:
                result = Verdict("FAIL", one_line(e), {"timeout": True})
            except Exception as e:  # one failing check must not stop the proof
                result = Verdict("FAIL", one_line(e))
        row = Row(section, name, result.status, result.detail, round(time.monotonic() - t0, 3), result.data)
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.write(complete=False)
        return row

    def counts(self) -> dict:
        """``{status: number of rows}`` for every status."""
        return {status: sum(r.status == status for r in self.rows) for status in STATUSES}

    def write(self, complete: bool) -> None:
        """Write the whole record to ``out`` atomically; a proof cut short by its budget is never complete."""
        record = {**self.meta, "budget_s": self.budget_s, "elapsed_s": round(self.elapsed(), 1),
                  "complete": complete and not self.budget_skips, "budget_skips": self.budget_skips,
                  "counts": self.counts(), "rows": [asdict(r) for r in self.rows]}
        atomic_write_bytes(self.out, (json.dumps(record, indent=1, default=str) + "\n").encode())

    def table(self) -> str:
        """The final table: every row, then the counts."""
        lines = [f"{'status':<7}{'section':<10}{'check':<{NAME_WIDTH}} detail"]
        lines += [format_row(r) for r in self.rows]
        failed = [r for r in self.rows if r.status == "FAIL"]
        if failed:
            lines.append(f"\n{len(failed)} FAIL row(s):")
            lines += [f"  {r.section}/{r.name}: {r.detail}" for r in failed]
        lines.append(", ".join(f"{n} {status}" for status, n in self.counts().items())
                     + f" in {self.elapsed():.0f} s (budget {self.budget_s:.0f} s)")
        return "\n".join(lines)


def row_kind(row) -> str:
    """The row's kind from :data:`KINDS` (``row`` is a :class:`Row` or its JSON dict)."""
    row = row if isinstance(row, dict) else asdict(row)
    if row["status"] == "FAIL" and row["detail"].startswith("MISMATCH"):
        return "MISMATCH"
    if row["status"] == "FAIL" and row["data"].get("timeout"):
        return "TIMEOUT"
    if row["status"] == "SKIP" and row["detail"].startswith(BUDGET_SKIP):
        return "SKIP budget"
    return row["status"]


def format_row(row: Row) -> str:
    """``PASS   ops       adaptive_max_pool2d(1)      audit: raises on cuda; cuda strict: raises``."""
    return f"{row.status:<7}{row.section:<10}{row.name:<{NAME_WIDTH}} {row.detail}"
