"""Converged accuracy: the matrix's models trained until they stop improving, resumable across interruptions.

Every (kind, seed, model) run trains from scratch with the matrix's recipe for at most ``--max-epochs``
epochs and stops earlier once its best fitness (0.1 mAP50 + 0.9 mAP50-95, train.py's) has not improved
for ``--patience`` epochs (train.py's early stopping). The learning rate decays over ``--max-epochs``, so
a run that stops early stops before its schedule ends. Per run the table gives the epochs run, the epoch
of the best checkpoint, its mAP50-95 and AP50-95 per AI-TOD band (from results.csv, where train.py
validates the EMA weights it saves as best.pt), and the area under the mAP50-95 curve over the first
``--auc-epochs`` epochs divided by that count (a run that stopped earlier holds its last value).
Per cell a line follows: whether ffca-yolo-n meets issue 38's target at this budget (mAP50-95 at or above
yolov5n-p2's and at least 1.1x yolov5n's), and whether the cell converged (its best model's best epoch lies
at least ``--patience`` epochs before its last).

    python -m benchmarks.accuracy.long_matrix --out runs/long-matrix-160            # 1.5 h on 2 cores; rerun to continue
    python -m benchmarks.accuracy.long_matrix --out runs/long-matrix-160 --report-only

An interrupted matrix continues where it stopped: a run with a resumable ``last.pt`` continues through
train.py's ``--resume``, a finished run is only reported, and ``--report-only`` also shows the runs
still training (marked "running").
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

from benchmarks.accuracy.matrix import BANDS, DEFAULT_MODELS, KINDS, check_image_sizes, compared_cells, make_data
from benchmarks.accuracy.variants import VARIANTS, variant_yaml
from benchmarks.cli import map_in_workers, parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
MAP, MAP50 = "metrics/mAP_0.5:0.95", "metrics/mAP_0.5"


def run_dir(job: dict) -> Path:
    return Path(job["out"]) / "runs" / f"{job['kind']}-{job['size']}-s{job['seed']}-{job['model']}"


def read_rows(results_csv: Path) -> list[dict]:
    with open(results_csv, newline="") as f:
        return list(csv.DictReader(f))


def summarise(rows: list[dict], auc_epochs: int) -> dict:
    """Epochs run, best epoch (0-based, train.py's fitness; the last of ties, as for its best.pt), its mAP50-95 and band APs,
    and the mean mAP50-95 over the first ``auc_epochs`` epochs (the last value held after the run's end)."""
    fitness = [0.1 * float(r[MAP50]) + 0.9 * float(r[MAP]) for r in rows]
    best = max(range(len(rows)), key=lambda i: (fitness[i], i))
    curve = [float(r[MAP]) for r in rows[:auc_epochs]]
    curve += [curve[-1]] * (auc_epochs - len(curve))
    return {"epochs": len(rows), "best_epoch": int(rows[best]["epoch"]), "map": float(rows[best][MAP]),
            "bands": {b: float(rows[best].get(f"metrics/mAP50-95_{b}", "nan")) for b in BANDS},
            "auc": sum(curve) / auc_epochs}


def resumable(last: Path) -> bool:
    """Whether ``last.pt`` holds an unfinished run train.py's ``--resume`` continues (it refuses finished ones)."""
    from utils.training.checkpoints import load_checkpoint

    ckpt = load_checkpoint(last)
    return not ckpt.get("finished") and ckpt.get("optimizer") is not None


def train_or_resume(job: dict) -> None:
    """Start the run, or continue it from its last.pt; a finished run is left as it is."""
    import train

    folder, opt = run_dir(job), job["opt"]
    last = folder / "weights" / "last.pt"
    if last.exists() and not resumable(last):
        return
    if last.exists():
        train.run(resume=str(last))
        return
    shutil.rmtree(folder, ignore_errors=True)  # a run killed before its first checkpoint: nothing to keep
    train.run(data=job["data"], cfg=job["cfg"], weights="", imgsz=job["size"], epochs=opt["max_epochs"],
              patience=opt["patience"], batch_size=opt["batch_size"], workers=0, seed=job["seed"],
              project=str(folder.parent), name=folder.name, exist_ok=True, noplots=True, hyp=opt["hyp"])


def run_one(job: dict) -> dict:
    """Train (or continue) one run in a worker process and return its row; a finished row is reused."""
    import torch

    row_file = run_dir(job) / "row.json"
    if row_file.exists():
        return json.loads(row_file.read_text())
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    train_or_resume(job)
    row = {**{k: job[k] for k in ("kind", "size", "seed", "model")}, "state": "done",
           **summarise(read_rows(run_dir(job) / "results.csv"), job["opt"]["auc_epochs"]),
           "session_s": time.perf_counter() - t0}
    row_file.write_text(json.dumps(row))
    return row


def report_row(job: dict) -> dict | None:
    """A finished run's row, or a row of the epochs a running (or interrupted) run has logged; None if none."""
    folder = run_dir(job)
    if (folder / "row.json").exists():
        return json.loads((folder / "row.json").read_text())
    if not (folder / "results.csv").exists() or not read_rows(folder / "results.csv"):
        return None
    return {**{k: job[k] for k in ("kind", "size", "seed", "model")}, "state": "running",
            **summarise(read_rows(folder / "results.csv"), job["opt"]["auc_epochs"]), "session_s": None}


def format_table(rows: list[dict], opt) -> str:
    head = ["kind", "size", "seed", "model", "epochs run", "best epoch", "mAP50-95 (best)",
            *(f"AP50-95 {v} px" for v in BANDS.values()), f"mean mAP50-95, epochs 1-{opt.auc_epochs}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        stopped = "running" if r["state"] == "running" else ("max" if r["epochs"] >= opt.max_epochs else "stopped")
        cells = [r["kind"], str(r["size"]), str(r["seed"]), r["model"], f"{r['epochs']} ({stopped})",
                 str(r["best_epoch"] + 1), f"{r['map']:.4f}", *(f"{r['bands'][b]:.3f}" for b in BANDS), f"{r['auc']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def converged_verdicts(rows: list[dict], patience: int) -> list[str]:
    """Per (kind, size, seed) with all three models: issue 38's converged target (ffca-yolo-n's best
    mAP50-95 at or above yolov5n-p2's and at least 1.1x yolov5n's), and whether the cell has converged
    (the best of the three has not improved in its last ``patience`` epochs); a running cell is marked."""
    lines = []
    for (kind, size, seed), ffca, p2, v5 in compared_cells(rows, lambda r: (r["kind"], r["size"], r["seed"])):
        leader = max((ffca, p2, v5), key=lambda r: r["map"])
        if any(r["state"] == "running" for r in (ffca, p2, v5)):
            state = "running"
        elif leader["epochs"] - 1 - leader["best_epoch"] >= patience:
            state = "converged"
        else:
            state = f"not converged: {leader['model']} still improved within {patience} epochs of its end"
        misses = [what for what, ok in (("p2", ffca["map"] >= p2["map"]), ("1.1x yolov5n", ffca["map"] >= 1.1 * v5["map"])) if not ok]
        ratio = f"{ffca['map'] / v5['map']:.2f}x yolov5n" if v5["map"] else "yolov5n at 0"
        lines.append(f"{kind} {size} px seed {seed} ({state}): ffca-yolo-n {ffca['map']:.4f} vs yolov5n-p2 "
                     f"{p2['map']:.4f}, {ratio}: " + ("meets" if not misses else "misses " + " and ".join(misses)))
    return lines


def jobs_for(opt, out: Path, generate: bool = True) -> list[dict]:
    """One job per (kind, seed, model); with ``generate`` each cell's data is made first (else not needed)."""
    plain = {"max_epochs": opt.max_epochs, "patience": opt.patience, "batch_size": opt.batch_size,
             "hyp": str(opt.hyp), "auc_epochs": opt.auc_epochs}
    jobs = []
    for kind in opt.kinds:
        for seed in opt.seeds:
            data = make_data(kind, opt.size, seed, opt.n_train, opt.n_val, out) if generate else None
            jobs += [{"kind": kind, "size": opt.size, "seed": seed, "model": m, "data": str(data), "out": str(out),
                      "cfg": str(variant_yaml(m, out / "models")), "opt": plain} for m in opt.models]
    return jobs


RULES = OptionRules(positive=("size", "max_epochs", "patience", "auc_epochs", "batch_size", "n_train", "n_val", "jobs"),
                    non_negative=("seeds",))


def parse_opt(argv=None):
    p = parser_for("benchmarks.accuracy.long_matrix", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=VARIANTS)
    p.add_argument("--kinds", nargs="+", default=["glyphs", "photos"], choices=KINDS, help="object kinds")
    # 160 px and 100 epochs: the 12 runs take about 1.5 h on 2 cores; 256 px and 300 epochs would take 10+ h
    p.add_argument("--size", type=int, default=160, help="image size (data and training)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds (data and training)")
    p.add_argument("--max-epochs", type=int, default=100, help="epochs of the schedule; a run stops here at the latest")
    p.add_argument("--patience", type=int, default=20, help="stop a run when its best has not improved for this many epochs")
    p.add_argument("--auc-epochs", type=int, default=100, help="epochs the area under the mAP50-95 curve spans")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--hyp", type=Path, default=ROOT / "data" / "hyps" / "hyp.scratch-low.yaml")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--out", type=Path, required=True, help="data and runs; the same --out continues the matrix")
    p.add_argument("--report-only", action="store_true", help="train nothing: report finished and running runs")
    opt = parse_checked(p, RULES, argv)
    check_image_sizes("--size", [opt.size])
    return opt


@exit_on_user_error
def main(argv=None) -> str:
    opt = parse_opt(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the worker processes
    out = opt.out.resolve()
    jobs = jobs_for(opt, out, generate=not opt.report_only)
    if opt.report_only:
        rows = [row for row in map(report_row, jobs) if row is not None]
    else:
        rows = map_in_workers(run_one, jobs, opt.jobs)
    report = "\n".join([format_table(rows, opt), "", *converged_verdicts(rows, opt.patience)])
    print(f"\npython -m benchmarks.accuracy.long_matrix --size {opt.size} --kinds {' '.join(opt.kinds)} "
          f"--seeds {' '.join(map(str, opt.seeds))} --max-epochs {opt.max_epochs} --patience {opt.patience} "
          f"--n-train {opt.n_train} --n-val {opt.n_val}\n{report}")
    return report


if __name__ == "__main__":
    main()
