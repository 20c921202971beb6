"""Which twins a run uses: the audit's findings that a twin resolves, confirmed by an audit with the twins on.

Only ``scoped`` and ``strict`` use twins (:data:`TWIN_MODES`): ``warn`` and ``off`` keep the native
ops, the fastest. A finding counts as replaced when a twin resolves its op and the audit with the
twins routed no longer has it; a finding a twin should resolve but that is still there (a call the
router does not see) stays a finding, and the policy treats it as it treats any other.
"""

from dataclasses import dataclass
from typing import Callable

from utils.determinism.twins.registry import routing, twins_resolving

TWIN_MODES = ("scoped", "strict")


def _key(finding) -> tuple:
    return finding.op, finding.phase, finding.module


@dataclass(frozen=True)
class TwinPlan:
    """The twins a run routes its training forward through, and the native findings they replaced."""

    twins: tuple  # Twin entries, table order
    replaced: tuple  # the native audit's Findings that are gone with the twins routed

    @classmethod
    def candidates(cls, native_report) -> tuple:
        """The twins that resolve any op of ``native_report``'s findings (an ``AuditReport``)."""
        return twins_resolving(f.op for f in native_report.findings)

    @classmethod
    def confirmed(cls, twins: tuple, native_report, twinned_report) -> "TwinPlan":
        """``twins`` with the findings of ``native_report`` they resolve and ``twinned_report`` no longer has."""
        remaining = {_key(f) for f in twinned_report.findings}
        resolvable = {op for twin in twins for op in twin.resolves}
        replaced = tuple(sorted((f for f in native_report.findings if f.op in resolvable and _key(f) not in remaining),
                                key=lambda f: (f.module, f.op)))
        used = {f.op for f in replaced}
        return cls(tuple(t for t in twins if used & set(t.resolves)), replaced)

    @property
    def names(self) -> list:
        return [twin.name for twin in self.twins]

    def routing(self):
        """A fresh router for one forward pass (a context manager)."""
        return routing(self.twins)

    def twin_of(self, op: str) -> str:
        return next(twin.name for twin in self.twins if op in twin.resolves)

    def describe(self) -> str:
        """One line: ``deterministic twins replace 2 op(s): model.7.max_pool (AdaptiveMaxPool2d) ...``."""
        parts = [f"{f.module} {f.op} -> twin {self.twin_of(f.op)}" for f in self.replaced]
        return f"deterministic twins replace {len(parts)} op(s): {'; '.join(parts)}"

    def to_dict(self) -> dict:
        """Plain data for determinism.json."""
        return {"twins": self.names,
                "replaced": [{"module": f.module, "op": f.op, "phase": f.phase, "twin": self.twin_of(f.op)}
                             for f in self.replaced]}


def twinned_audit(native_report, audit: Callable) -> tuple:
    """``(plan, report)``: ``audit(forward_scope)`` run again with the twins that resolve ``native_report``'s
    findings routed, or ``(None, native_report)`` when no twin applies or none removed a finding.

    ``audit(forward_scope)`` returns an ``AuditReport`` (``forward_scope`` as ``audit_model`` takes it).
    """
    twins = TwinPlan.candidates(native_report)
    if not twins:
        return None, native_report
    twinned = audit(lambda: routing(twins))
    plan = TwinPlan.confirmed(twins, native_report, twinned)
    return (plan, twinned) if plan.replaced else (None, native_report)
