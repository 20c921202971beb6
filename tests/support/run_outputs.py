"""Readers for a training run folder's outputs, and a bit-identity check of two runs, shared by the end-to-end tests."""

import csv
from pathlib import Path

import torch


def weights_checksum(run_dir: Path) -> str:
    """The final EMA weights' SHA-256 that train.py writes to weights/sha256.txt."""
    return (Path(run_dir) / "weights" / "sha256.txt").read_text().split()[0]


def results_rows(run_dir: Path) -> list:
    """results.csv as a list of {column: text} rows."""
    with open(Path(run_dir) / "results.csv") as f:
        return list(csv.DictReader(f))


def final_weights(run_dir: Path) -> dict:
    """The model state dict in the run's weights/last.pt."""
    return torch.load(Path(run_dir) / "weights" / "last.pt", weights_only=True)["model"]


def assert_identical(run_dir: Path, reference: Path) -> None:
    """Two runs are bit-identical: same weights checksum, same results.csv, equal final tensors."""
    assert weights_checksum(run_dir) == weights_checksum(reference)
    assert results_rows(run_dir) == results_rows(reference)
    ours, theirs = final_weights(run_dir), final_weights(reference)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
