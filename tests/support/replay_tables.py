"""The GPU proof's replay tables (benchmarks/gpu_proof/replay/) and the faults the tests add to them."""

import json
from pathlib import Path

REPLAY = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_proof" / "replay"
RELEASES = ("2.9", "2.11", "2.14")
FAULTS = {"mismatch_case": "gather", "killed_run": "tiny-workers0", "timing_rows_before_cut": 2}


def recorded(release: str = "2.14") -> dict:
    """The replay table of CUDA's outcomes on torch ``release``."""
    return json.loads((REPLAY / f"cuda-torch-{release}.json").read_text())


def with_faults(table: dict) -> dict:
    """One fault of each kind: a device that raises where the audit says 'runs', a control that never varies,
    a run still going at the deadline and a budget spent during the timing section."""
    table["ops"][FAULTS["mismatch_case"]] = {"outcome": "raises", "message": "gather_cuda does not have a "
                                             "deterministic implementation (injected)"}
    table["control"]["off"] = 1
    table["killed_at_deadline"] = [FAULTS["killed_run"]]
    table["budget_cut_after_timing_rows"] = FAULTS["timing_rows_before_cut"]
    return table
