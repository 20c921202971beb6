"""The determinism policy's messages: what an audit's findings mean for a run, in one line each.

Kept apart from :mod:`utils.torch_utils` (which applies the policy) so that module stays small;
only plain text is built here, from ``utils.determinism.op_audit`` findings and reports.
"""


def finding_text(f) -> str:
    """``adaptive_max_pool2d_backward (backward, model.9 (SCAM))``."""
    return f"{f.op} ({f.phase}, {f.module})"


def strict_failure_message(device: str, failing: list) -> str:
    """One line: what fails under strict on ``device`` and the ways out."""
    return (f"--deterministic strict: {_listed(failing, 'of this model', device)}. "
            f"{_ways_out('--deterministic scoped (relaxes only the backward pass), ')}")


def scoped_failure_message(device: str, forward: list) -> str:
    """One line: ops outside the backward that scoped cannot relax on ``device``, and the ways out."""
    return (f"--deterministic scoped: {_listed(forward, 'outside the backward pass', device)}. scoped relaxes "
            f"only the backward, so training would stop at the first batch. {_ways_out('')}")


def unverified_text(ops: list) -> str:
    """``mylib::blur (forward, model.3 (Blur)); ...`` for an audit's ops outside the table."""
    return "; ".join(f"{op['op']} ({op['phase']}, {op['module']})" for op in ops)


def strict_unverified_message(ops: list) -> str:
    """One line: strict cannot promise determinism through ops the table does not know."""
    return (f"--deterministic strict: {len(ops)} op(s) of this model are outside the determinism table, so "
            f"nothing says they are deterministic: {unverified_text(ops)}. "
            f"{_ways_out('--deterministic scoped (warns about them and records them), ')}")


def unverified_warning(mode: str, ops: list) -> str:
    """The warning scoped and warn log for ops outside the table."""
    return (f"determinism audit ({mode}): {len(ops)} op(s) not verified (outside the determinism table; "
            f"recorded in determinism.json): {unverified_text(ops)}")


def _listed(findings: list, where: str, device: str) -> str:
    ops = "; ".join(finding_text(f) for f in findings)
    return f"{len(findings)} op(s) {where} have no deterministic implementation on {device}: {ops}"


def _ways_out(first: str) -> str:
    return (f"Ways out: {first}--deterministic warn (reports and continues), or replace the module with a "
            "deterministic one; see docs/determinism.md")


def adoption_summary(mode: str, report, backward: list, forward: list, relax: bool, silent: tuple = (),
                     twins=None) -> str:
    """The line train.py logs after adopting an audit (``silent``: findings on this device without an alert;
    ``twins``: the run's ``TwinPlan`` when the audit ran with deterministic twins routed)."""
    where = report.device
    unverified = getattr(report, "unverified", [])
    if not report.findings and unverified:
        return f"determinism audit ({mode}) on {where}: no op flagged, but {len(unverified)} not verified: " \
               f"{unverified_text(unverified)}."
    if not report.findings:
        with_twins = f" with twins ({', '.join(twins.names)})" if twins is not None else ""
        return f"determinism audit ({mode}): clean{with_twins} on {where}; full determinism kept"
    elsewhere = [f for f in report.findings if f not in backward and f not in forward and f not in silent]
    parts = [f"determinism audit ({mode}) on {where}:"]
    if backward:
        verb = "backward relaxed because of" if relax else "non-deterministic backward ops:"
        parts.append(f"{verb} {', '.join(finding_text(f) for f in backward)}.")
    if forward:
        parts.append(f"forward/step ops the backward scope cannot fix (use --deterministic warn or replace the "
                     f"module): {', '.join(finding_text(f) for f in forward)}.")
    if silent:
        parts.append(f"not deterministic on {where} without torch raising (nothing relaxes them): "
                     f"{', '.join(finding_text(f) for f in silent)}.")
    if elsewhere:
        parts.append(f"would fail on {'/'.join(sorted({d for f in elsewhere for d in f.devices}))} only: "
                     f"{', '.join(finding_text(f) for f in elsewhere)}.")
    if not backward and not forward and not silent:
        parts.append("nothing to relax here; full determinism kept.")
    return " ".join(parts)
