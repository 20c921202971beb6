"""Readers for a training run folder's outputs, shared by the end-to-end tests."""

import csv
from pathlib import Path


def weights_checksum(run_dir: Path) -> str:
    """The final EMA weights' SHA-256 that train.py writes to weights/sha256.txt."""
    return (Path(run_dir) / "weights" / "sha256.txt").read_text().split()[0]


def results_rows(run_dir: Path) -> list:
    """results.csv as a list of {column: text} rows."""
    with open(Path(run_dir) / "results.csv") as f:
        return list(csv.DictReader(f))
