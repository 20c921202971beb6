"""The GPU proof's device layer: every place where the proof touches the device it proves.

:class:`LiveDevice` does it for real. :class:`ReplayDevice` replays a table of device outcomes
(JSON, e.g. ``benchmarks/gpu_proof/replay/cuda-torch-2.14.json``) through the same proof code on a CPU, so
the proof's branches for a GPU run before a GPU sees them (only :class:`LiveDevice`'s own CUDA
calls, e.g. the peak-memory statistics, do not):

- ``ops``: per battery case, what the device does under ``use_deterministic_algorithms(True)``
  (``{"outcome": "raises" | "runs" | "unsupported", "message": PyTorch's first line}``);
- ``control``: the number of distinct ``index_add_`` hashes under ``strict`` and ``off``;
- ``log_lines``: lines a run on that device logs and a CPU run does not (e.g. the AMP check),
  added to each training run's log;
- ``killed_at_deadline``: names of training runs that reach the proof's deadline: they start for
  real and are killed by the proof's own deadline handling;
- ``budget_cut_after_timing_rows``: after that many timing measurements the budget is spent.

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
from benchmarks.gpu_proof import runs as proof_runs
from benchmarks.speed.harness import peak_rss_gib, time_fixed_batch
from utils.errors import UserError, exit_on_user_error
from utils.options import OneLineErrorParser


class LiveDevice:
    """The device under proof, used for real: ``device`` is both what is proved and where work runs."""

    def __init__(self, device: torch.device):
        self.device = device
        self.run_device = device
        self.offset = 0.0

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

    def __init__(self, table: dict, budget_s: float):
        super().__init__(torch.device(table.get("device", "cuda:0")))
        self.run_device = torch.device("cpu")
        self.table = table
        self.budget_s = budget_s
        self.timing_rows = 0

    @classmethod
    def from_file(cls, path, budget_s: float) -> "ReplayDevice":
        """The replay of the JSON table in ``path``; a missing or malformed file is a UserError."""
        try:
            table = json.loads(Path(path).read_text())
            if not isinstance(table.get("ops"), dict) or not isinstance(table.get("control"), dict):
                raise ValueError("needs 'ops' and 'control' mappings")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"--replay {path}: not a replay table ({e}); see benchmarks/gpu_proof/replay/") from None
        return cls(table, budget_s)

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
            self.offset = self.budget_s  # the proof's clock jumps a whole budget: every later check is skipped
        return result


def table_from_record(record: dict) -> dict:
    """A replay table from a GPU proof's ``proof.json``: the device's own outcomes, no faults.

    Each ops row gives its battery case's ``actual`` and ``torch_message``; each control row its
    number of distinct hashes; the AMP line is added when the record's AMP rows passed.
    """
    rows = record["rows"]
    ops = {row["name"]: {"outcome": row["data"]["actual"], "message": row["data"].get("torch_message", "")}
           for row in rows if row["section"] == "ops" and "actual" in row["data"]}
    control = {row["name"].rsplit(" ", 1)[1]: len(row["data"]["hashes"])
               for row in rows if row["section"] == "control" and "hashes" in row["data"]}
    amp = [row for row in rows if row["name"].endswith(": AMP on")]
    return {"source": f"recorded by: {record.get('command', '?')} on {record.get('device', '?')}",
            "device": record.get("device", "cuda:0"), "ops": ops, "control": control,
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
