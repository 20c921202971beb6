"""The GPU proof's device layer: every place where the proof touches the device it proves.

:class:`LiveDevice` does it for real. :class:`ReplayDevice` replays a table of device outcomes
(JSON, e.g. ``benchmarks/gpu_proof/replay/cuda-torch-2.14.json``) through the same proof code on a CPU, so
the proof's branches for a GPU run before a GPU sees them (only :class:`LiveDevice`'s own CUDA
calls, e.g. the peak-memory statistics, do not):

- ``torch``: the torch release the outcomes are for (e.g. ``"2.11"``); the audit predicts with
  the op table's rows for it, while the meta trace runs the installed torch's Python code (with
  the branches a release predates switched off, ``utils/determinism/cuda_trace.py``);
- ``ops``: per battery case, what the device does under ``use_deterministic_algorithms(True)``
  (``{"outcome": "raises" | "runs" | "unsupported", "message": PyTorch's first line,
  "holds_for": the torch releases this outcome holds for and why}``, and ``"silent": true`` where
  the op runs without an alert but is expected to vary);
- ``control``: the number of distinct ``index_add_`` hashes under ``strict`` and ``off``;
- ``log_lines``: lines a run on that device logs and a CPU run does not (e.g. the AMP check),
  added to each training run's log;
- ``killed_at_deadline``: names of training runs that reach the proof's deadline: they start for
  real and are killed by the proof's own deadline handling;
- ``budget_cut_after_timing_rows``: after that many timing measurements both budgets are spent;
- ``compute_mode``: the GPU's compute mode the preflight sees (default ``Default``).

A live CUDA run reads ``replay/cuda-torch-<its release>.json`` as the expected outcomes that each
ops row names (NO DATA where there is no table for its torch).

Training runs, the audit, the raw strict loop and the timing run on the CPU for real; the SCAM
rows use the block that fails on the CPU (``PutGradientSCAM``), which the audit flags for CUDA too.

Once a GPU proof has run, ``python -m benchmarks.gpu_proof.device proof.json > table.json`` turns its
record into a table of that device's measured outcomes (:func:`table_from_record`).
"""

import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu_proof import ops as proof_ops
from benchmarks.gpu_proof import preflight
from benchmarks.gpu_proof import runs as proof_runs
from benchmarks.speed.harness import peak_rss_gib, time_fixed_batch
from utils.determinism.op_table import VERIFIED_TORCH, release_name, verified
from utils.errors import UserError, exit_on_user_error
from utils.options import OneLineErrorParser

REPLAY_DIR = Path(__file__).resolve().parent / "replay"
BUDGET_SPENT_S = 10 ** 9  # what a replayed budget cut adds to the proof's clock


class LiveDevice:
    """The device under proof, used for real: ``device`` is both what is proved and where work runs."""

    def __init__(self, device: torch.device):
        self.device = device
        self.run_device = device
        self.offset = 0.0
        self.torch_version = torch.__version__

    def table_name(self) -> str | None:
        """The replay table of this torch release's CUDA outcomes, when there is one (None on a CPU)."""
        path = REPLAY_DIR / f"cuda-torch-{release_name(self.torch_version)}.json"
        return str(path.relative_to(REPLAY_DIR.parents[2])) if self.device.type == "cuda" and path.is_file() else None

    def expected_outcomes(self) -> dict | None:
        """The table's outcome per battery case: ``{}`` on CUDA without a table (NO DATA), None on a CPU."""
        if self.device.type != "cuda":
            return None
        name = self.table_name()
        return json.loads((REPLAY_DIR.parents[2] / name).read_text())["ops"] if name else {}

    def table_line(self) -> str:
        """The torch the proof proves, the table it names and whether the op table was checked for that torch."""
        name = self.table_name() or ("no table for this torch: every ops row says NO DATA"
                                     if self.device.type == "cuda" else "none (CPU)")
        checked = ", ".join(VERIFIED_TORCH)
        coverage = (f"op table checked for torch {checked}" if verified(self.torch_version)
                    else f"op table NOT checked for torch {release_name(self.torch_version)} (only {checked})")
        return (f"proving {self.device} with torch {self.torch_version} (running torch {torch.__version__}); "
                f"table: {name}; {coverage}")

    def compute_mode(self) -> str:
        """The GPU's compute mode (the preflight refuses Exclusive_Process)."""
        return preflight.compute_mode(self.run_device.index or 0) if self.run_device.type == "cuda" else "none (CPU)"

    def clock(self) -> float:
        """The proof's clock (seconds, monotonic)."""
        return time.monotonic() + self.offset

    def child_device(self) -> str:
        """``--device`` of the training runs."""
        return str(self.run_device.index or 0) if self.run_device.type == "cuda" else "cpu"

    def strict_outcome(self, name: str, op, device: torch.device) -> tuple:
        """``('raises' | 'runs' | 'unsupported', message)`` of battery case ``name`` under strict."""
        return proof_ops.strict_outcome(op, device)

    def index_add_hashes(self, device: torch.device, deterministic: bool) -> set:
        """The control's distinct hashes."""
        return proof_ops.index_add_hashes(device, deterministic)

    def run_named(self, settings, cfg: Path, name: str, timeout_at: float, *overrides: str):
        """One training run (see :func:`proof_runs.run_named`)."""
        return proof_runs.run_named(settings, cfg, name, timeout_at, *overrides)

    def kill_and_resume(self, settings, cfg: Path, name: str, timeout_at: float) -> tuple:
        """A run SIGKILLed mid-epoch, then resumed (see :func:`proof_runs.kill_and_resume`)."""
        return proof_runs.kill_and_resume(settings, cfg, name, timeout_at)

    def time_fixed_batch(self, cfg: Path, imgsz: int, batch: int, mode: str, data_yaml: Path, warmup: int,
                         batches: int) -> tuple:
        """``(seconds per training step, peak GiB)``: CUDA memory allocated, or the process's RSS on a CPU."""
        cuda = self.run_device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.run_device)
        seconds = time_fixed_batch(cfg, imgsz, batch, mode, self.run_device, data_yaml, warmup, batches)
        return seconds, torch.cuda.max_memory_allocated(self.run_device) / 2**30 if cuda else peak_rss_gib()


class ReplayDevice(LiveDevice):
    """Proves ``cuda:0`` (or the table's device) from a table of its outcomes, doing the real work on the CPU."""

    def __init__(self, table: dict, budget_s: float, name: str = "the replay table"):
        super().__init__(torch.device(table.get("device", "cuda:0")))
        self.run_device = torch.device("cpu")
        self.table = table
        self.budget_s = budget_s
        self.timing_rows = 0
        self.torch_version = table["torch"]
        self.name = name

    @classmethod
    def from_file(cls, path, budget_s: float) -> "ReplayDevice":
        """The replay of the JSON table in ``path``; a missing or malformed file is a UserError."""
        try:
            table = json.loads(Path(path).read_text())
            if not isinstance(table.get("ops"), dict) or not isinstance(table.get("control"), dict):
                raise ValueError("needs 'ops' and 'control' mappings")
            release_name(table["torch"])
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
            raise UserError(f"--replay {path}: not a replay table ({type(e).__name__}: {e}); needs 'torch', 'ops' "
                            "and 'control', see benchmarks/gpu_proof/replay/") from None
        return cls(table, budget_s, str(path))

    def table_name(self) -> str:
        return self.name

    def expected_outcomes(self) -> dict:
        return self.table["ops"]

    def compute_mode(self) -> str:
        return self.table.get("compute_mode", "Default")

    def strict_outcome(self, name: str, op, device: torch.device) -> tuple:
        recorded = self.table["ops"].get(name)
        if recorded is None:
            raise KeyError(f"the replay table records no outcome for the battery case {name!r}")
        return recorded["outcome"], recorded.get("message", "")

    def index_add_hashes(self, device: torch.device, deterministic: bool) -> set:
        count = self.table["control"]["strict" if deterministic else "off"]
        return {f"replayed hash {i}" for i in range(count)}

    def _on_device(self, run):
        """The run as the proven device would have logged it: the table's device-only lines added."""
        run.log += "".join(f"\n{line}" for line in self.table.get("log_lines", []))
        return run

    def _timeout_at(self, name: str, timeout_at: float) -> float:
        return time.monotonic() if name in self.table.get("killed_at_deadline", []) else timeout_at

    def run_named(self, settings, cfg: Path, name: str, timeout_at: float, *overrides: str):
        return self._on_device(super().run_named(settings, cfg, name, self._timeout_at(name, timeout_at), *overrides))

    def kill_and_resume(self, settings, cfg: Path, name: str, timeout_at: float) -> tuple:
        position, run = super().kill_and_resume(settings, cfg, name, self._timeout_at(name, timeout_at))
        return position, self._on_device(run)

    def time_fixed_batch(self, *args) -> tuple:
        result = super().time_fixed_batch(*args)
        self.timing_rows += 1
        if self.timing_rows == self.table.get("budget_cut_after_timing_rows"):
            self.offset = BUDGET_SPENT_S  # the proof's clock jumps past both budgets: every later check is skipped
        return result


def table_from_record(record: dict) -> dict:
    """A replay table from a GPU proof's ``proof.json``: the device's own outcomes, no faults.

    Each ops row gives its battery case's ``actual`` and ``torch_message`` (and keeps the expected
    ``silent``, which a strict run cannot measure); each control row its number of distinct hashes;
    the AMP line is added when the record's AMP rows passed.
    """
    rows = record["rows"]
    version = record.get("proved_torch") or record["environment"]["torch"]
    ops = {row["name"]: {"outcome": row["data"]["actual"], "message": row["data"].get("torch_message", ""),
                         "holds_for": f"measured with torch {version}",
                         **({"silent": True} if row["data"].get("table_silent") else {})}
           for row in rows if row["section"] == "ops" and "actual" in row["data"]}
    control = {row["name"].rsplit(" ", 1)[1]: len(row["data"]["hashes"])
               for row in rows if row["section"] == "control" and "hashes" in row["data"]}
    amp = [row for row in rows if row["name"].endswith(": AMP on")]
    return {"source": f"recorded by: {record.get('command', '?')} on {record.get('device', '?')}",
            "torch": release_name(version), "device": record.get("device", "cuda:0"),
            "ops": ops, "control": control,
            "log_lines": ["AMP: checks passed"] if amp and all(r["status"] == "PASS" for r in amp) else [],
            "killed_at_deadline": [], "budget_cut_after_timing_rows": None}


@exit_on_user_error
def main(argv=None) -> int:
    """Print the replay table of a GPU proof record (``python -m benchmarks.gpu_proof.device proof.json > t.json``)."""
    parser = OneLineErrorParser(prog="python -m benchmarks.gpu_proof.device",
                                description="Turn a GPU proof record into a replay table of its device's outcomes.")
    parser.add_argument("record", type=Path, help="proof.json written by python -m benchmarks.gpu_proof.proof")
    record = parser.parse_args(argv).record
    try:
        table = table_from_record(json.loads(record.read_text()))
    except (OSError, ValueError) as e:
        raise UserError(f"{record}: cannot read it as JSON ({e})") from None
    except (KeyError, TypeError) as e:
        raise UserError(f"{record}: not a GPU proof record (field {e} missing or malformed); "
                        "pass the --out file of python -m benchmarks.gpu_proof.proof") from None
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
