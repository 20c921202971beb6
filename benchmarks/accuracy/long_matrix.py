"""Converged accuracy: the matrix's models compared at the budget where the best of them stops improving.

Every (kind, seed, model) run trains from scratch with the matrix's recipe over the whole ``--max-epochs``
schedule, with no early stop of its own: a run stopped by its own patience would be compared at a
different budget, before its learning rate had decayed (a spike of its validation curve is enough to stop
it). The cell's budget is found afterwards from the curves: the first epoch at which the best of the
cell's runs, by train.py's fitness (0.1 mAP50 + 0.9 mAP50-95), has gone ``--patience`` epochs without a
new best. Each model is then judged by its best epoch within that budget, or within the whole schedule
where the cell never stopped improving.

Per run the table gives the epochs run, the epoch of the best checkpoint, its mAP50-95 and AP50-95 per
AI-TOD band (from results.csv, where train.py validates the EMA weights it saves as best.pt), and the area
under the mAP50-95 curve over the first ``--auc-epochs`` epochs divided by that count (a run that stopped
earlier holds its last value). Per cell a line follows: its budget, and whether ffca-yolo-n meets issue
38's target there (mAP50-95 at or above yolov5n-p2's and at least 1.1x yolov5n's). Where the budget came
before the schedule's end and every run has trained the whole schedule, a second line compares the cell at
the schedule's end: a plateau under a still-high learning rate can fire the rule while learning goes on.

    python -m benchmarks.accuracy.long_matrix --out runs/long-matrix-160            # 1.5 h on 2 cores; rerun to continue
    python -m benchmarks.accuracy.long_matrix --out runs/long-matrix-160 --report-only

An interrupted matrix continues where it stopped: a run with a resumable ``last.pt`` continues through
train.py's ``--resume`` (with ``--patience 0``), a finished run is only reported, and ``--report-only``
also shows the runs still training (marked "running"). A finished run that its own patience stopped before
the schedule's end (the rule of this command before issue 38's third round) cannot be continued: it is
reported as "stopped early" and, unless its cell's budget already lies within the epochs its runs logged,
the cell is not judged and training moves the run's folder aside (``-stopped-early``) and trains it again
over the whole schedule.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

from benchmarks.accuracy.matrix import (BANDS, COMPARED_MODELS, DEFAULT_MODELS, KINDS, check_image_sizes,
                                       cell_data_yaml, check_report_folder, compared_cells, make_data,
                                       resumable)
from benchmarks.accuracy.variants import VARIANTS, variant_yaml
from benchmarks.cli import map_in_workers, parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules
from utils.training.run_folder import check_run_folder_free

ROOT = Path(__file__).resolve().parents[2]
MAP, MAP50 = "metrics/mAP_0.5:0.95", "metrics/mAP_0.5"


def run_dir(job: dict) -> Path:
    return Path(job["out"]) / "runs" / f"{job['kind']}-{job['size']}-s{job['seed']}-{job['model']}"


def read_rows(results_csv: Path) -> list[dict]:
    with open(results_csv, newline="") as f:
        return list(csv.DictReader(f))


def fitness(row: dict) -> float:
    """train.py's fitness of one results.csv row."""
    return 0.1 * float(row[MAP50]) + 0.9 * float(row[MAP])


def summarise(rows: list[dict], auc_epochs: int) -> dict:
    """Epochs run, best epoch (0-based, train.py's fitness; the last of ties, as for its best.pt), its mAP50-95 and band APs,
    and the mean mAP50-95 over the first ``auc_epochs`` epochs (the last value held after the run's end)."""
    best = max(range(len(rows)), key=lambda i: (fitness(rows[i]), i))
    curve = [float(r[MAP]) for r in rows[:auc_epochs]]
    curve += [curve[-1]] * (auc_epochs - len(curve))
    return {"epochs": len(rows), "best_epoch": int(rows[best]["epoch"]), "map": float(rows[best][MAP]),
            "bands": {b: float(rows[best].get(f"metrics/mAP50-95_{b}", "nan")) for b in BANDS},
            "auc": sum(curve) / auc_epochs}


def train_or_resume(job: dict) -> None:
    """Start the run, or continue it from its last.pt. A run finished over the whole schedule is left as it is;
    one that its own patience ended early is too if its cell is settled, and is set aside and trained again
    otherwise."""
    import train

    folder, opt = run_dir(job), job["opt"]
    check_run_folder_free(folder, f"--out {job['out']}")  # before a resume, a set-aside or a delete
    last = folder / "weights" / "last.pt"
    if last.exists() and resumable(last):
        train.run(resume=str(last), patience=0)
        return
    logged = read_rows(folder / "results.csv") if (folder / "results.csv").exists() else []
    if last.exists() and (len(logged) >= opt["max_epochs"] or cell_settled(job)):
        return
    if last.exists():
        set_aside(folder)
    shutil.rmtree(folder, ignore_errors=True)  # a run killed before its first checkpoint: nothing to keep
    train.run(data=job["data"], cfg=job["cfg"], weights="", imgsz=job["size"], epochs=opt["max_epochs"],
              patience=0, batch_size=opt["batch_size"], workers=0, seed=job["seed"],
              project=str(folder.parent), name=folder.name, exist_ok=True, noplots=True, hyp=opt["hyp"])


def run_one(job: dict) -> dict:
    """Train (or continue) one run in a worker process and return its row; a finished row is reused."""
    import torch

    row_file = run_dir(job) / "row.json"
    saved = json.loads(row_file.read_text()) if row_file.exists() else None
    if saved and (not stopped_early(saved, job["opt"]["max_epochs"]) or cell_settled(job)):
        return saved
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    train_or_resume(job)
    row = {**{k: job[k] for k in ("kind", "size", "seed", "model")}, "state": "done",
           **summarise(read_rows(run_dir(job) / "results.csv"), job["opt"]["auc_epochs"]),
           "session_s": time.perf_counter() - t0}
    row_file.write_text(json.dumps(row))
    return row


def stopped_early(row: dict, max_epochs: int) -> bool:
    """A finished run that its own patience ended before the schedule did (this command's earlier rule)."""
    return row["state"] == "done" and row["epochs"] < max_epochs


def cell_settled(job: dict) -> bool:
    """Whether the job's cell already has its budget within the epochs its compared runs have logged: the verdict
    is final then, and a run of it that stopped early (past the budget) needs no training again."""
    curves = [run_dir({**job, "model": m}) / "results.csv" for m in COMPARED_MODELS]
    return (all(path.exists() for path in curves)
            and cell_budget([read_rows(path) for path in curves], job["opt"]["patience"]) is not None)


def set_aside(folder: Path) -> None:
    """Rename a run folder to ``<name>-stopped-early`` (``-2``, ``-3`` ... if taken), keeping what it holds."""
    target, n = folder.with_name(folder.name + "-stopped-early"), 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}-stopped-early-{n}")
    folder.rename(target)


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
        stopped = "running" if r["state"] == "running" else ("max" if r["epochs"] >= opt.max_epochs else "stopped early")
        cells = [r["kind"], str(r["size"]), str(r["seed"]), r["model"], f"{r['epochs']} ({stopped})",
                 str(r["best_epoch"] + 1), f"{r['map']:.4f}", *(f"{r['bands'][b]:.3f}" for b in BANDS), f"{r['auc']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell_budget(curves: list[list[dict]], patience: int) -> int | None:
    """Epochs after which the best of a cell's runs had gone ``patience`` epochs without a new best (train.py's
    fitness; a tie counts as new, as in its early stopping); None if that did not happen within the epochs
    every run has logged."""
    best, best_epoch = float("-inf"), 0
    for epoch in range(min(len(curve) for curve in curves)):
        top = max(fitness(curve[epoch]) for curve in curves)
        if top >= best:
            best, best_epoch = top, epoch
        if epoch - best_epoch >= patience:
            return epoch + 1
    return None


def compare_at(runs: tuple, budget: int, opt) -> str:
    """Issue 38's target (at or above yolov5n-p2, at least 1.1x yolov5n) on each model's best within ``budget``
    epochs; ``runs`` are one cell's (ffca-yolo-n, yolov5n-p2, yolov5n) rows, each with its results.csv as ``curve``."""
    ffca, p2, v5 = (summarise(r["curve"][:budget], opt.auc_epochs)["map"] for r in runs)
    misses = [what for what, ok in (("p2", ffca >= p2), ("1.1x yolov5n", ffca >= 1.1 * v5)) if not ok]
    ratio = f"{ffca / v5:.3f}x yolov5n" if v5 else "yolov5n at 0"
    return (f"ffca-yolo-n {ffca:.4f} vs yolov5n-p2 {p2:.4f}, {ratio}: "
            + ("meets" if not misses else "misses " + " and ".join(misses)))


def cell_verdicts(runs: tuple, opt) -> list[str]:
    """``(state): comparison`` for one cell (see :func:`compare_at`) at the cell's budget. A cell that converged
    by the rule while its runs went on over the whole schedule is compared at the schedule's end too: a plateau
    under a still-high learning rate fires the rule, and learning can resume after it."""
    budget = cell_budget([r["curve"] for r in runs], opt.patience)
    end = min(len(r["curve"]) for r in runs)  # as far as every run has got
    early = next((r for r in runs if stopped_early(r, opt.max_epochs)), None)
    if budget is not None:
        state = f"converged: compared at {budget} epochs"
    elif any(r["state"] == "running" for r in runs):
        budget = end
        state = f"running: compared at {budget} epochs, as far as every run has got"
    elif early:
        return [f"(not judged: {early['model']} stopped early at epoch {early['epochs']}, by the per-run patience "
                "this command used before; training again sets it aside and trains it over the whole schedule)"]
    else:
        budget = end
        state = f"not converged: the best run still improved within {opt.patience} epochs of the schedule's end"
    verdicts = [f"({state}): " + compare_at(runs, budget, opt)]
    if end > budget and all(r["state"] == "done" and r["epochs"] == opt.max_epochs for r in runs):
        verdicts.append(f"(at the schedule's end, {end} epochs): " + compare_at(runs, end, opt))
    return verdicts


def converged_verdicts(rows: list[dict], opt) -> list[str]:
    """The :func:`cell_verdicts` lines of each (kind, size, seed) with all three models."""
    return [f"{kind} {size} px seed {seed} " + verdict
            for (kind, size, seed), *runs in compared_cells(rows, lambda r: (r["kind"], r["size"], r["seed"]))
            for verdict in cell_verdicts(runs, opt)]


def jobs_for(opt, out: Path, generate: bool = True) -> list[dict]:
    """One job per (kind, seed, model); with ``generate`` each cell's data is made first (a report needs none)."""
    plain = {"max_epochs": opt.max_epochs, "patience": opt.patience, "batch_size": opt.batch_size,
             "hyp": str(opt.hyp), "auc_epochs": opt.auc_epochs}
    jobs = []
    for kind in opt.kinds:
        for seed in opt.seeds:
            data = (make_data(kind, opt.size, seed, opt.n_train, opt.n_val, out) if generate
                    else cell_data_yaml(kind, opt.size, seed, out))
            jobs += [{"kind": kind, "size": opt.size, "seed": seed, "model": m, "data": str(data), "out": str(out),
                      "cfg": str(variant_yaml(m, out / "models")), "opt": plain} for m in opt.models]
    return jobs


RULES = OptionRules(positive=("size", "max_epochs", "patience", "auc_epochs", "batch_size", "n_train", "n_val", "jobs"),
                    non_negative=("seeds",), folders=("out",), files=("hyp",))


def parse_opt(argv=None):
    p = parser_for("benchmarks.accuracy.long_matrix", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=VARIANTS)
    p.add_argument("--kinds", nargs="+", default=["glyphs", "photos"], choices=KINDS, help="object kinds")
    # 160 px and 100 epochs: the 12 runs take about 1.5 h on 2 cores; 256 px and 300 epochs would take 10+ h
    p.add_argument("--size", type=int, default=160, help="image size (data and training)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds (data and training)")
    p.add_argument("--max-epochs", type=int, default=100, help="epochs of the schedule; a run stops here at the latest")
    p.add_argument("--patience", type=int, default=20, help="a cell has converged once the best of its runs has not improved for this many epochs; the runs "
                   "themselves train the whole schedule")
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
    if opt.report_only:
        check_report_folder(opt.out)
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
    for row in rows:
        row["curve"] = read_rows(run_dir({**row, "out": out}) / "results.csv")
    report = "\n".join([format_table(rows, opt), "", *converged_verdicts(rows, opt)])
    print(f"\npython -m benchmarks.accuracy.long_matrix --size {opt.size} --kinds {' '.join(opt.kinds)} "
          f"--seeds {' '.join(map(str, opt.seeds))} --max-epochs {opt.max_epochs} --patience {opt.patience} "
          f"--n-train {opt.n_train} --n-val {opt.n_val}\n{report}")
    return report


if __name__ == "__main__":
    main()
