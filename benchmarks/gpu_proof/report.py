"""The GPU proof's record: one row per check, two time budgets, a printed table and an atomic JSON file.

Every check runs through :meth:`Proof.check`, which turns any exception into an ERROR row with a
one-line reason, so one broken check never stops the others: an exception (out of memory, a
missing module, a training run that crashed) says the check could not be carried out, not that
the claim is false. A row is a claim (PASS or FAIL decides the verdict) or information (timings);
each kind has its own budget, and information rows start only after the claims' budget, so
cutting them never touches a claim. A claim that could not be decided (an ERROR, skipped for the
budget, or a run still going at the deadline) leaves the proof incomplete.

Exit codes (:meth:`Proof.exit_code`): 0 every claim decided and none FAILs; 1 a claim FAILs
(whatever else happened); 3 incomplete: no claim FAILs, but a claim row is ERROR or INCOMPLETE,
or the proof did not finish. Information rows never change it. The JSON file is rewritten
atomically after every row (a run cut short still leaves a readable record) and once at the end.
"""

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from utils.files import atomic_write_bytes

STATUSES = ("PASS", "FAIL", "ERROR", "INCOMPLETE", "SKIP", "INFO")
# What a row says, finer than its status: a FAIL is a MISMATCH (audit and device disagree) or a
# plain FAIL; an ERROR is a check that raised (its reason in the detail); an INCOMPLETE is a
# TIMEOUT (a run killed at the proof's deadline) or a claim skipped for the budget; a SKIP is an
# information row skipped for its budget or a row that does not apply.
KINDS = ("PASS", "FAIL", "MISMATCH", "ERROR", "TIMEOUT", "SKIP budget", "SKIP", "INFO")
EXIT_PASS, EXIT_FAIL, EXIT_INCOMPLETE = 0, 1, 3
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
    claim: bool = True


class Proof:
    """Collects rows under two wall-clock budgets and keeps ``out`` (JSON) up to date.

    Claims may start until ``budget_s`` has passed; information rows until ``budget_s + info_budget_s``.
    """

    def __init__(self, out: Path, budget_s: float, meta: dict, clock: Callable[[], float] = time.monotonic,
                 info_budget_s: float = 0.0):
        self.clock = clock  # a replay (benchmarks/gpu_proof/device.py) passes one that can jump to a budget cut
        self.out = Path(out)
        self.budget_s = budget_s
        self.info_budget_s = info_budget_s
        self.meta = dict(meta)
        self.rows: list[Row] = []
        self.started = clock()

    def elapsed(self) -> float:
        """Seconds since the proof started."""
        return self.clock() - self.started

    def remaining(self, claim: bool = True) -> float:
        """Seconds left in the claims' (or the information rows') budget; negative once it is spent."""
        return self.budget_s + (0 if claim else self.info_budget_s) - self.elapsed()

    def _run(self, func: Callable[[], Verdict], claim: bool, needs_s: float) -> Verdict:
        if self.remaining(claim) <= needs_s:
            budget = self.budget_s + (0 if claim else self.info_budget_s)
            why = f"less left than the {needs_s:.0f} s this check takes" if needs_s > 0 else "spent before this check"
            return Verdict("INCOMPLETE" if claim else "SKIP", f"{BUDGET_SKIP} of {budget:.0f} s: {why}")
        try:
            return func()
        except DeadlineExceeded as e:
            return Verdict("INCOMPLETE" if claim else "SKIP", one_line(e), {"timeout": True})
        except Exception as e:  # the check could not run: neither a pass nor a fail, and the others go on
            return Verdict("ERROR", one_line(e), {"error": type(e).__name__})

    def check(self, section: str, name: str, func: Callable[[], Verdict], claim: bool = True,
              needs_s: float = 0.0) -> Row:
        """Run ``func`` unless less than ``needs_s`` of its budget is left; any exception becomes an ERROR row."""
        t0 = time.monotonic()
        result = self._run(func, claim, needs_s)
        row = Row(section, name, result.status, result.detail, round(time.monotonic() - t0, 3), result.data, claim)
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.write(complete=False)
        return row

    def counts(self) -> dict:
        """``{status: number of rows}`` for every status."""
        return {status: sum(r.status == status for r in self.rows) for status in STATUSES}

    def undecided(self) -> list:
        """Claim rows without a verdict: errored, skipped for the budget, or a run still going at the deadline."""
        return [r for r in self.rows if r.claim and r.status in ("ERROR", "INCOMPLETE")]

    def info_cut(self) -> list:
        """Information rows skipped for their budget (never part of the verdict)."""
        return [r for r in self.rows if not r.claim and row_kind(r) in ("SKIP budget", "TIMEOUT")]

    def exit_code(self, finished: bool = True) -> int:
        """1 when a claim FAILs; else 3 when a claim is undecided (ERROR, INCOMPLETE) or the proof did not
        finish; else 0."""
        if any(r.claim and r.status == "FAIL" for r in self.rows):
            return EXIT_FAIL
        return EXIT_INCOMPLETE if self.undecided() or not finished else EXIT_PASS

    def write(self, complete: bool) -> None:
        """Write the whole record to ``out`` atomically; a proof with an undecided claim is never complete."""
        record = {**self.meta, "budget_s": self.budget_s, "info_budget_s": self.info_budget_s,
                  "elapsed_s": round(self.elapsed(), 1), "complete": complete and not self.undecided(),
                  "exit_code": self.exit_code(complete), "undecided": [r.name for r in self.undecided()],
                  "info_cut": [r.name for r in self.info_cut()],
                  "counts": self.counts(), "rows": [asdict(r) for r in self.rows]}
        atomic_write_bytes(self.out, (json.dumps(record, indent=1, default=str) + "\n").encode())

    def conclude(self, rows, work) -> int:
        """Run ``rows()`` (the checks), write the record (complete only when it returned), print the table, where
        the record and runs are, and the verdict line; returns the exit code."""
        finished = False
        try:
            rows()
            finished = True
        finally:
            self.write(complete=finished)
        print("\n" + self.table())
        print(f"Record: {self.out.resolve()}\nRuns and logs: {work}")
        print(self.verdict_line())
        return self.exit_code(finished)

    def verdict_line(self) -> str:
        """The last line printed: the exit code and, when incomplete, why."""
        code = self.exit_code()
        if code == EXIT_FAIL:
            return f"FAIL (exit 1): {sum(r.claim and r.status == 'FAIL' for r in self.rows)} claim row(s) failed"
        note = f"; {len(self.info_cut())} information row(s) cut by their budget" if self.info_cut() else ""
        if code == EXIT_INCOMPLETE:
            errors = sum(r.status == "ERROR" for r in self.undecided())
            counted = f"{errors} claim row(s) errored: " if errors else ""
            reasons = "; ".join(f"{r.section}/{r.name}: {r.detail}" for r in self.undecided())
            return f"INCOMPLETE (exit 3), no verdict: {counted}{reasons}{note}"
        return f"PASS (exit 0): every claim row passed or does not apply here{note}"

    def table(self) -> str:
        """The final table: every row, then the counts."""
        lines = [f"{'status':<11}{'section':<10}{'check':<{NAME_WIDTH}} detail"]
        lines += [format_row(r) for r in self.rows]
        for status in ("FAIL", "ERROR"):
            listed = [r for r in self.rows if r.status == status]
            if listed:
                lines.append(f"\n{len(listed)} {status} row(s):")
                lines += [f"  {r.section}/{r.name}: {r.detail}" for r in listed]
        lines.append(", ".join(f"{n} {status}" for status, n in self.counts().items())
                     + f" in {self.elapsed():.0f} s (budgets: claims {self.budget_s:.0f} s, "
                       f"information {self.info_budget_s:.0f} s)")
        return "\n".join(lines)


def row_kind(row) -> str:
    """The row's kind from :data:`KINDS` (``row`` is a :class:`Row` or its JSON dict)."""
    row = row if isinstance(row, dict) else asdict(row)
    if row["status"] == "FAIL" and row["detail"].startswith("MISMATCH"):
        return "MISMATCH"
    if row["data"].get("timeout"):
        return "TIMEOUT"
    if row["status"] in ("SKIP", "INCOMPLETE") and row["detail"].startswith(BUDGET_SKIP):
        return "SKIP budget"
    return row["status"]


def format_row(row: Row) -> str:
    """``PASS   ops       adaptive_max_pool2d(1)      audit: raises on cuda; cuda strict: raises``."""
    return f"{row.status:<11}{row.section:<10}{row.name:<{NAME_WIDTH}} {row.detail}"
