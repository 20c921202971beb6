"""Small-object accuracy matrix: every model, same recipe and budget, in every (kind, size, seed) cell.

A cell is one generated data set: an object kind (``shapes``: drawn geometry from
make_tiny_shapes.py, 6-24 px; ``glyphs``: textured stroke characters among distractors from
make_glyphs.py, 8-20 px; ``photos``, only when asked for: objects cut from scikit-image's bundled
photographs, pasted onto other photographs, 8-24 px), an image size and a seed (the seed makes both
the data and the run; ``--train-seeds`` trains each model once per listed seed on the cell's data
instead, which measures how far a rerun moves the figures).
Each model trains from scratch with ``train.run`` and its ``last.pt`` is validated with val.py's
size bands (AI-TOD bands by sqrt(area)). Per run it prints mAP50, mAP50-95, AP50-95 per band,
the first epoch with mAP50 > 0.001, the train box loss at the first and the last epoch and the
wall time per epoch; then, per cell, whether ffca-yolo-n meets issue 22's target (first epoch no
later than yolov5n-p2's + 2, final mAP50-95 at or above yolov5n's), and, for a cell trained with
several training seeds, the same target on the medians over them, with issue 38's second start
condition (no later than yolov5n + 2 where yolov5n starts).

    python -m benchmarks.accuracy.matrix --jobs 2 --out runs/accuracy-matrix   # the full matrix (docs/research/)
    python -m benchmarks.accuracy.matrix --kinds glyphs --sizes 256 --seeds 1     # one cell
    python -m benchmarks.accuracy.matrix --kinds glyphs --sizes 256 --seeds 1 --train-seeds 2 3   # reruns of it

With ``--out DIR`` finished runs are kept and reused, and a run interrupted midway continues from its
``last.pt`` (train.py's ``--resume``, bit-identical to an uninterrupted run): the same command continues an
interrupted matrix, and ``--report-only`` prints the table of the runs finished so far without training, then one line
per run not finished (the epochs it has logged).

Runs go to separate processes with one thread each (``--jobs`` at a time): on a 2-core machine
two one-thread runs finish sooner than one two-thread run. Accuracy columns do not depend on
``--jobs`` or machine load; the s/epoch column does.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.accuracy.variants import VARIANTS, variant_yaml
from benchmarks.cli import map_in_workers, parse_checked, parser_for
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules
from utils.training.run_folder import check_run_folder_free

ROOT = Path(__file__).resolve().parents[2]
BANDS = {"very_tiny": "<8", "tiny": "8-16", "aitod_small": "16-32"}  # AI-TOD bands by sqrt(area), px
DEFAULT_MODELS = ("yolov5n", "yolov5n-p2", "ffca-yolo-n")
COMPARED_MODELS = ("ffca-yolo-n", "yolov5n-p2", "yolov5n")  # the targets' order: the model, then its yardsticks
KINDS = ("shapes", "glyphs", "photos")
DEFAULT_KINDS = ("shapes", "glyphs")  # the matrix of docs/research/; photos came later
MIN_SIZE = 64  # the smallest image every kind's generator can place its largest objects in
SIZE_STEP = 32  # the models' largest stride: train.py would round any other size, and the table would misname it
START_MAP50 = 0.001  # "has started to detect": mAP50 above this
NEVER = 10 ** 6  # first epoch of a run that never started: later than any real one


def make_data(kind: str, size: int, seed: int, n_train: int, n_val: int, out: Path) -> Path:
    """Generate (or reuse) the data set of one cell; returns its data YAML."""
    from utils.dataset.synthetic.glyphs import make_glyphs
    from utils.dataset.synthetic.photos import make_photos
    from utils.dataset.synthetic.tiny_shapes import make_tiny_shapes

    yaml_path = cell_data_yaml(kind, size, seed, out)
    if yaml_path.exists():
        return yaml_path
    make = {"shapes": make_tiny_shapes, "glyphs": make_glyphs, "photos": make_photos}[kind]
    return make(yaml_path.with_suffix(""), n_train, n_val, seed, size=size)


def cell_data_yaml(kind: str, size: int, seed: int, out: Path) -> Path:
    """Where the data YAML of one cell is (or will be) under ``out``."""
    return out / "data" / f"{kind}-{size}-s{seed}.yaml"


def check_report_folder(out: Path) -> None:
    """``--report-only`` reports runs that exist: a folder without any is one line, not an empty table."""
    if not (out / "runs").is_dir():
        raise UserError(f"--out {out}: no runs there to report; the same command without --report-only trains them")


def results_rows(results_csv: Path) -> list[dict]:
    """The rows of a results.csv, column names stripped (YOLOv5-family code pads them to a fixed width)."""
    with open(results_csv, newline="") as f:
        return [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]


def read_curve(results_csv: Path) -> dict:
    """First epoch (1-based) with mAP50 > START_MAP50 (None if never) and the first and last train box loss."""
    rows = results_rows(results_csv)
    first = next((int(r["epoch"]) + 1 for r in rows if float(r["metrics/mAP_0.5"]) > START_MAP50), None)
    return {"first": first, "box0": float(rows[0]["train/box_loss"]), "box1": float(rows[-1]["train/box_loss"])}


def size_band_ap(weights: Path, data_yaml: Path, imgsz: int, out: Path) -> dict:
    """``{band key: {"instances", "map50", "map", "ar"}}`` of a checkpoint on the val split (val.py's bands)."""
    import val
    from utils.dataset.data_config import check_dataset

    return val.run(check_dataset(data_yaml), weights=str(weights), batch_size=16, imgsz=imgsz,
                   device="cpu", workers=0, project=str(out / "val"), name=weights.parent.parent.name,
                   exist_ok=True, plots=False, size_bands=True).bands


def run_name(job: dict) -> str:
    """Folder name of a run; a training seed other than the data seed is appended (``-t2``)."""
    rerun = f"-t{job['train_seed']}" if job.get("train_seed", job["seed"]) != job["seed"] else ""
    return f"{job['kind']}-{job['size']}-s{job['seed']}{rerun}-{job['model']}"


def train_seed(row: dict) -> int:
    """The training seed of a job or row (rows saved before training seeds existed used the data seed)."""
    return row.get("train_seed", row["seed"])


def seed_label(row: dict) -> str:
    return str(row["seed"]) if train_seed(row) == row["seed"] else f"{row['seed']} (train {train_seed(row)})"


def row_keys(job: dict) -> dict:
    return {**{k: job[k] for k in ("kind", "size", "seed", "model")}, "train_seed": train_seed(job)}


def finished_row(job: dict) -> dict | None:
    """The row of a run that already finished under ``--out``: saved by :func:`train_one`, or rebuilt
    from a complete run folder (all epochs in results.csv, last.pt present) with s/epoch unknown."""
    run_dir = Path(job["out"]) / "runs" / run_name(job)
    if (run_dir / "row.json").exists():
        return json.loads((run_dir / "row.json").read_text())
    csv_path, last = run_dir / "results.csv", run_dir / "weights" / "last.pt"
    if not (csv_path.exists() and last.exists()):
        return None
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(rows) < job["opt"]["epochs"]:
        return None
    return {**row_keys(job), "map50": float(rows[-1]["metrics/mAP_0.5"]),
            "map": float(rows[-1]["metrics/mAP_0.5:0.95"]),
            "bands": size_band_ap(last, Path(job["data"]), job["size"], Path(job["out"])),
            **read_curve(csv_path), "s_per_epoch": None}


def train_one(job: dict) -> dict:
    """Train one model in one cell (runs in a worker process); return its row of the table.

    A run that already finished under the same ``--out`` is not trained again, and one interrupted midway
    continues from its ``last.pt`` through train.py's ``--resume`` (bit-identical to an uninterrupted run),
    so an interrupted matrix continues where it stopped. The folder of an interrupted run that cannot be
    resumed (no checkpoint yet, or one of other settings) is cleared first, since train.py would append the
    new epochs to its results.csv. s/epoch counts only the epochs this call trained.
    """
    import torch

    import train

    row = finished_row(job)
    if row is not None:
        return row
    torch.set_num_threads(1)
    out, opt = Path(job["out"]), job["opt"]
    run_dir = out / "runs" / run_name(job)
    last = run_dir / "weights" / "last.pt"
    # another matrix on this --out may be training it: deleting its folder would not stop that run, only its lock
    check_run_folder_free(run_dir, f"--out {out}")
    epochs_done = resumable_epochs(job, last)
    t0 = time.perf_counter()
    if epochs_done is not None:
        results = train.run(resume=str(last))
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        results = train.run(data=job["data"], cfg=job["cfg"], weights="", imgsz=job["size"], epochs=opt["epochs"],
                            batch_size=opt["batch_size"], workers=0, seed=train_seed(job), project=str(out / "runs"),
                            name=run_name(job), exist_ok=True, noplots=True, hyp=opt["hyp"])
    seconds = time.perf_counter() - t0
    row = {**row_keys(job), "map50": results[2], "map": results[3],
           "bands": size_band_ap(last, Path(job["data"]), job["size"], out),
           **read_curve(run_dir / "results.csv"), "s_per_epoch": seconds / (opt["epochs"] - (epochs_done or 0))}
    (run_dir / "row.json").write_text(json.dumps(row))
    return row


def resumable(last: Path) -> bool:
    """Whether ``last.pt`` holds an unfinished run train.py's ``--resume`` continues (it refuses finished ones)."""
    from utils.training.checkpoints import load_checkpoint

    return unfinished(load_checkpoint(last))


def unfinished(ckpt: dict) -> bool:
    return not ckpt.get("finished") and ckpt.get("optimizer") is not None


def resumable_epochs(job: dict, last: Path) -> int | None:
    """Whole epochs an interrupted run of this job saved in ``last.pt`` (0 for a checkpoint within its first
    epoch), or None where it must start again: no checkpoint, an unreadable or finished one, or one begun
    with another schedule, image size, batch or seed."""
    from utils.training.checkpoints import load_checkpoint

    if not last.is_file():
        return None
    try:
        ckpt = load_checkpoint(last)
    except UserError:  # unreadable: the run starts again
        return None
    began = {k: ckpt["opt"].get(k) for k in ("epochs", "imgsz", "batch_size", "seed")}
    wanted = {"epochs": job["opt"]["epochs"], "imgsz": job["size"], "batch_size": job["opt"]["batch_size"],
              "seed": train_seed(job)}
    return ckpt["epoch"] + 1 if unfinished(ckpt) and began == wanted else None


def progress_line(job: dict) -> str:
    """A run of the matrix that has not finished: its folder name and the epochs its results.csv holds."""
    csv_path = Path(job["out"]) / "runs" / run_name(job) / "results.csv"
    logged = len(results_rows(csv_path)) if csv_path.exists() else 0
    return f"not finished: {run_name(job)}, {logged} of {job['opt']['epochs']} epochs logged"


def format_table(rows: list[dict]) -> str:
    """Markdown table, one row per (cell, model)."""
    head = ["kind", "size", "seed", "model", "mAP50", "mAP50-95", *(f"AP50-95 {v} px" for v in BANDS.values()),
            f"first epoch mAP50 > {START_MAP50}", "box loss first → last", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["kind"], str(r["size"]), seed_label(r), r["model"], f"{r['map50']:.3f}", f"{r['map']:.4f}",
                 *(f"{r['bands'][b]['map']:.3f}" for b in BANDS), str(r["first"] or "never"),
                 f"{r['box0']:.3f} → {r['box1']:.3f}", "-" if r["s_per_epoch"] is None else f"{r['s_per_epoch']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compared_cells(rows: list[dict], key) -> list[tuple]:
    """``(key, ffca-yolo-n row, yolov5n-p2 row, yolov5n row)`` per ``key(row)`` group that has all three
    models, in key order."""
    cells: dict[tuple, dict] = {}
    for r in rows:
        cells.setdefault(key(r), {})[r["model"]] = r
    picked = [(k, *(by_model.get(m) for m in COMPARED_MODELS)) for k, by_model in sorted(cells.items())]
    return [cell for cell in picked if all(cell[1:])]


def target_verdicts(rows: list[dict]) -> list[str]:
    """Per cell and training seed: does ffca-yolo-n start no later than yolov5n-p2 + 2 epochs and end >=
    yolov5n in mAP50-95?"""
    lines = []
    for (kind, size, _, _), ffca, p2, v5 in compared_cells(rows, lambda r: (r["kind"], r["size"], r["seed"], train_seed(r))):
        cell = f"{kind} {size} px seed {seed_label(ffca)}"
        if not any(r["first"] for r in (ffca, p2, v5)):
            lines.append(f"{cell}: no model reached mAP50 > {START_MAP50}; the budget "
                         "decides nothing here")
            continue
        starts = (ffca["first"] or NEVER) <= (p2["first"] or NEVER) + 2
        ends = ffca["map"] >= v5["map"]
        verdict = "meets" if starts and ends else "misses" + (" start" if not starts else "") + (" end" if not ends else "")
        lines.append(f"{cell}: {verdict} (first epoch {ffca['first'] or 'never'} vs p2 {p2['first'] or 'never'}; "
                     f"mAP50-95 {ffca['map']:.4f} vs yolov5n {v5['map']:.4f})")
    return lines


def spread_verdicts(rows: list[dict]) -> list[str]:
    """Per data cell where ffca-yolo-n and yolov5n-p2 trained with several training seeds: every run's
    first epoch, and issue 38's start target applied to the medians (the upper median for an even count;
    "never" counts as latest): ffca-yolo-n starts no later than yolov5n-p2 + 2 epochs and, where yolov5n's
    median run starts, no later than yolov5n + 2. The end condition (mAP50-95 at or above yolov5n's) is
    judged only where yolov5n ran too."""
    runs: dict[tuple, dict[str, list]] = {}
    for r in rows:
        runs.setdefault((r["kind"], r["size"], r["seed"]), {}).setdefault(r["model"], []).append(r)
    lines = []
    for (kind, size, seed), by_model in sorted(runs.items()):
        ffca, p2, v5 = (sorted(by_model.get(m, []), key=train_seed) for m in COMPARED_MODELS)
        if min(len(ffca), len(p2)) < 2:
            continue
        start = {name: median_first(model_runs) for name, model_runs in (("ffca", ffca), ("p2", p2), ("v5", v5)) if model_runs}
        ffca_end = statistics.median_high(r["map"] for r in ffca)
        checks = [("start", start["ffca"][1] <= start["p2"][1] + 2)]
        end = "yolov5n not run, end not judged"
        if v5:
            v5_end = statistics.median_high(r["map"] for r in v5)
            if start["v5"][1] != NEVER:
                checks.append(("start vs yolov5n", start["ffca"][1] <= start["v5"][1] + 2))
            checks.append(("end", ffca_end >= v5_end))
            end = f"yolov5n {start['v5'][0]}; median mAP50-95 {ffca_end:.4f} vs yolov5n {v5_end:.4f}"
        misses = [what for what, ok in checks if not ok]
        lines.append(f"{kind} {size} px seed {seed} over {len(ffca)} training seeds: first epoch ffca-yolo-n "
                     f"{start['ffca'][0]} vs yolov5n-p2 {start['p2'][0]}; {end}: "
                     + ("meets on the medians" if not misses else "misses " + " and ".join(misses) + " on the medians"))
    return lines


def median_first(model_runs: list[dict]) -> tuple[str, int]:
    """``("23, 14, 19 (median 19)", 19)``: the runs' first epochs and their upper median; never = latest."""
    firsts = [r["first"] or NEVER for r in model_runs]
    median = statistics.median_high(firsts)

    def shown(e: int) -> str:
        return "never" if e == NEVER else str(e)

    return f"{', '.join(map(shown, firsts))} (median {shown(median)})", median


def jobs_for(opt: argparse.Namespace, out: Path) -> list[dict]:
    """One job per (kind, size, seed, training seed, model), data generated up front (cheap, and shared by
    the cell's runs); a report generates nothing."""
    jobs = []
    plain = {"epochs": opt.epochs, "batch_size": opt.batch_size, "hyp": str(opt.hyp)}
    for kind in opt.kinds:
        for size in opt.sizes:
            for seed in opt.seeds:
                data = (cell_data_yaml(kind, size, seed, out) if opt.report_only
                        else make_data(kind, size, seed, opt.n_train, opt.n_val, out))
                jobs += [{"kind": kind, "size": size, "seed": seed, "train_seed": t, "model": m, "data": str(data),
                          "out": str(out), "cfg": str(variant_yaml(m, out / "models")), "opt": plain}
                         for t in (opt.train_seeds or [seed]) for m in opt.models]
    return jobs


RULES = OptionRules(positive=("sizes", "epochs", "batch_size", "n_train", "n_val", "jobs"),
                    non_negative=("seeds", "train_seeds"), folders=("out",), files=("hyp",))


def check_image_sizes(flag: str, sizes: list) -> None:
    """One UserError line for the first size the generators or the models cannot take as it is."""
    for size in sizes:
        if size < MIN_SIZE or size % SIZE_STEP:
            raise UserError(f"{flag} {size}: must be a multiple of {SIZE_STEP} (the models' largest stride) and at "
                            f"least {MIN_SIZE} (room for the largest generated objects), e.g. 160")


def parse_opt(argv=None) -> argparse.Namespace:
    p = parser_for("benchmarks.accuracy.matrix", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   choices=VARIANTS, help="models to train in every cell")
    p.add_argument("--kinds", nargs="+", default=list(DEFAULT_KINDS), choices=KINDS, help="object kinds")
    p.add_argument("--sizes", nargs="+", type=int, default=[160, 256, 320], help="image sizes (data and training)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds (data, and training unless --train-seeds)")
    p.add_argument("--train-seeds", nargs="+", type=int, default=None,
                   help="train every model once per seed listed on each cell's data (default: the data seed)")
    p.add_argument("--epochs", type=int, default=30, help="epochs per run (same for all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-train", type=int, default=256, help="generated training images per cell")
    p.add_argument("--n-val", type=int, default=64, help="generated validation images per cell")
    p.add_argument("--hyp", type=Path, default=ROOT / "data" / "hyps" / "hyp.scratch-low.yaml")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--out", type=Path, default=None,
                   help="keep data and runs here (default: a temporary folder); finished runs there are reused")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: report the runs that finished under --out (an interrupted or running matrix)")
    opt = parse_checked(p, RULES, argv)
    check_image_sizes("--sizes", opt.sizes)
    if opt.report_only:
        if opt.out is None:
            p.error("--report-only needs --out, the folder of the matrix to report")
        check_report_folder(opt.out)
    return opt


@exit_on_user_error
def main(argv=None) -> str:
    """Run the matrix; print and return the table and the per-cell verdicts."""
    opt = parse_opt(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the worker processes
    with tempfile.TemporaryDirectory() as tmp:
        out = (opt.out or Path(tmp)).resolve()
        jobs = jobs_for(opt, out)
        if opt.report_only:
            found = [(job, finished_row(job)) for job in jobs]
            rows = [row for _, row in found if row is not None]
            pending = [progress_line(job) for job, row in found if row is None]
        else:
            rows, pending = map_in_workers(train_one, jobs, opt.jobs), []
    spread = spread_verdicts(rows)
    report = "\n".join([format_table(rows), "", *target_verdicts(rows), *([""] + spread if spread else []),
                        *([""] + pending if pending else [])])
    print(f"\npython -m benchmarks.accuracy.matrix --epochs {opt.epochs} --batch-size {opt.batch_size} "
          f"--n-train {opt.n_train} --n-val {opt.n_val} --kinds {' '.join(opt.kinds)} "
          f"--sizes {' '.join(map(str, opt.sizes))} --seeds {' '.join(map(str, opt.seeds))}"
          f"{' --train-seeds ' + ' '.join(map(str, opt.train_seeds)) if opt.train_seeds else ''}\n{report}")
    return report


if __name__ == "__main__":
    main()
