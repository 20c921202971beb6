"""One set of GPU-proof training runs for two proofs of the same plan: the CPU proof, then its replay.

A replay (``--quick --replay TABLE``) trains on the CPU exactly what the CPU proof trains: the same
plan, the same ``train.py`` flags, the same device. :class:`SharedRuns` records the first proof's runs
and hands the second proof a copy of the run it asks for, after checking that it asked with the same
flags (the work folder aside). A run the second proof starts already past its deadline (a replay
table's ``killed_at_deadline``) starts for real, so the deadline handling runs as it would.
"""

import dataclasses
import time
from pathlib import Path

import pytest

from benchmarks.gpu_proof import runs as proof_runs


def _flags(settings: proof_runs.RunSettings, cfg: Path, name: str, *overrides: str) -> tuple:
    """The run's flags, its proof's work folder (the parent of ``--project``) replaced by ``<work>``."""
    work = str(Path(settings.project).parent)
    return (settings.custom_modules, settings.threads,
            *(flag.replace(work, "<work>") for flag in settings.flags(cfg, name, *overrides)))


class SharedRuns:
    """Records the runs of one proof (:meth:`record`), serves copies of them to the next (:meth:`reuse`)."""

    def __init__(self):
        self.runs = {}  # run name -> (flags, what the proof's run function returned)
        self.reused = []
        self.started = []

    def record(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """From now on every run trains for real and is kept under its name."""
        real_run, real_chain = proof_runs.run_named, proof_runs.kill_and_resume

        def run_named(settings, cfg, name, timeout_at, *overrides):
            self.runs[name] = (_flags(settings, cfg, name, *overrides),
                               real_run(settings, cfg, name, timeout_at, *overrides))
            return self.runs[name][1]

        def kill_and_resume(settings, cfg, name, timeout_at):
            self.runs[name] = (_flags(settings, cfg, name), real_chain(settings, cfg, name, timeout_at))
            return self.runs[name][1]

        monkeypatch.setattr(proof_runs, "run_named", run_named)
        monkeypatch.setattr(proof_runs, "kill_and_resume", kill_and_resume)

    def reuse(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """From now on a run asked with a recorded run's flags gets a copy of it; a run past its deadline starts."""
        real_run, real_chain = proof_runs.run_named, proof_runs.kill_and_resume

        def kept(flags: tuple, name: str):
            recorded_flags, result = self.runs[name]
            assert flags == recorded_flags, f"{name}: asked with {flags}, recorded with {recorded_flags}"
            self.reused.append(name)
            if isinstance(result, tuple):  # kill_and_resume: (position, the resumed run)
                return list(result[0]), dataclasses.replace(result[1])
            return dataclasses.replace(result)

        def run_named(settings, cfg, name, timeout_at, *overrides):
            if timeout_at <= time.monotonic():
                self.started.append(name)
                return real_run(settings, cfg, name, timeout_at, *overrides)
            return kept(_flags(settings, cfg, name, *overrides), name)

        def kill_and_resume(settings, cfg, name, timeout_at):
            if timeout_at <= time.monotonic():
                self.started.append(name)
                return real_chain(settings, cfg, name, timeout_at)
            return kept(_flags(settings, cfg, name), name)

        monkeypatch.setattr(proof_runs, "run_named", run_named)
        monkeypatch.setattr(proof_runs, "kill_and_resume", kill_and_resume)
