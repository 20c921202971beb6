"""The runs behind the pictures, trained once and cached under ``runs/figures`` (git-ignored).

Every run uses one thread, one at a time, so the figures can be remade on a shared 2-core machine;
a run that finished before is reused, so redrawing costs seconds.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from utils import __version__
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "runs" / "figures"
STAMP = "trained-at.txt"  # the project version a run was trained at, written when it finishes

# The README's first command, into the cache (workers 0: same weights, one process).
DETECTOR = {"cfg": "models/ffca-yolo-n.yaml", "imgsz": 128, "epochs": 40, "workers": 0, "noplots": True,
            "project": str(CACHE), "name": "shapes-ffca-yolo-n", "exist_ok": True}
DETECTOR_TEXT = "FFCA-YOLO-n, data/shapes.yaml, --imgsz 128, 40 epochs, seed 0, one CPU thread"

MATRIX_ARGV = ["--kinds", "shapes", "--sizes", "128", "--seeds", "0", "--train-seeds", "0", "1", "2",
               "--epochs", "20", "--n-train", "256", "--n-val", "64", "--jobs", "1", "--out", str(CACHE / "matrix")]
MATRIX_TEXT = ("accuracy matrix cell shapes, 128 px, data seed 0, training seeds 0/1/2, 20 epochs, "
               "256 train / 64 val images, one CPU thread")

# A large scene in data/shapes_large.yaml's recipe (1024 px, 30-60 objects of 6-16 px), four of them.
SCENE = {"n_train": 1, "n_val": 4, "seed": 0, "size": 1024, "sides": (6, 16), "objects": (30, 60)}
SHAPE_NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "cross"}


def trained_at(run_dir: Path) -> str:
    stamp = run_dir / STAMP
    return stamp.read_text().strip() if stamp.exists() else "unknown"


def finished(run_dir: Path, epochs: int) -> bool:
    """All epochs in results.csv and last.pt written."""
    csv_path = run_dir / "results.csv"
    if not (csv_path.exists() and (run_dir / "weights" / "last.pt").exists()):
        return False
    with open(csv_path, newline="") as f:
        return len(list(csv.DictReader(f))) >= epochs


def stamp(run_dir: Path) -> None:
    if not (run_dir / STAMP).exists():
        (run_dir / STAMP).write_text(__version__ + "\n")


def detector_run(train: bool) -> Path:
    """The first command's FFCA-YOLO-n run folder, trained here if missing and ``train``."""
    run_dir = CACHE / DETECTOR["name"]
    if not finished(run_dir, DETECTOR["epochs"]):
        if not train:
            raise UserError(f"{run_dir} is not a finished run; run without --draw-only to train it")
        import torch

        import train as train_script

        torch.set_num_threads(1)
        train_script.run(**DETECTOR)
    stamp(run_dir)
    return run_dir


def matrix_rows(train: bool) -> list[dict]:
    """The matrix cell's rows (one per model and training seed), each with its ``run_dir``."""
    from benchmarks.accuracy import matrix

    opt = matrix.parse_opt(MATRIX_ARGV)
    opt.report_only = not train  # drawing generates no data: the jobs only locate the runs
    jobs = matrix.jobs_for(opt, opt.out.resolve())
    if train:
        matrix.main(MATRIX_ARGV)
    rows = []
    for job in jobs:
        run_dir = Path(job["out"]) / "runs" / matrix.run_name(job)
        if not (run_dir / "row.json").exists():
            raise UserError(f"{run_dir} has no row.json; run without --draw-only to train it")
        stamp(run_dir)
        rows.append({**json.loads((run_dir / "row.json").read_text()), "run_dir": run_dir})
    return rows


def scene_yaml() -> Path:
    """Data YAML of four generated 1024-px scenes (made once, offline)."""
    from utils.dataset.synthetic.shapes import make_shapes

    root = CACHE / "scenes"
    yaml_path = CACHE / "scenes.yaml"
    if not yaml_path.exists():
        make_shapes(root, **SCENE)
        names = "\n".join(f"  {i}: {n}" for i, n in SHAPE_NAMES.items())
        yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n")
    return yaml_path


def quiet_threads() -> None:
    """One thread for every run started from here (inherited by the matrix's worker processes)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
