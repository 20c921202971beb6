"""Does ``--reduced-decode`` change accuracy? The same model, data and seeds trained with and without it on a
data set whose JPEGs are several times the training size.

    python -m benchmarks.accuracy.reduced_decode --jobs 2 --out runs/reduced-decode
    python -m benchmarks.accuracy.reduced_decode --source-size 2048 --train-seeds 0 1 2 --out runs/reduced-decode

The data is the ``photos`` kind generated at ``--source-size`` px with objects scaled by the same factor
(``sides`` 8-24 px times source-size / imgsz), so at ``--imgsz`` the objects are the matrix's 8-24 px and
every image is decoded at reduced size when the flag is on (1024 -> 256: 1/4). Each run is
``train.run(..., epochs, imgsz, batch 16, workers 0, seed)`` with one thread; its validation during training
decodes as it trains. The table gives, per run, mAP50-95 at the last epoch and the best, and the first epoch
with mAP50 > 0.001, then per flag the median over training seeds. Finished runs under ``--out`` are reused.
"""

import statistics
from pathlib import Path

from benchmarks.accuracy.matrix import results_rows
from benchmarks.cli import map_in_workers, parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
RULES = OptionRules(positive=("source_size", "imgsz", "epochs", "n_train", "n_val", "jobs"),
                    non_negative=("data_seed", "train_seeds"), folders=("out",))
START_MAP50 = 0.001


def make_data(out: Path, source_size: int, imgsz: int, n_train: int, n_val: int, seed: int) -> Path:
    """The photos data set at ``source_size`` px (objects scaled to keep 8-24 px at ``imgsz``); its YAML."""
    from utils.dataset.synthetic.photos import MAX_SIDE, MIN_SIDE, make_photos

    root = out / "data" / f"photos-{source_size}-s{seed}"
    if not root.with_suffix(".yaml").exists():
        scale = source_size / imgsz
        make_photos(root, n_train, n_val, seed, size=source_size, sides=(MIN_SIDE * scale, MAX_SIDE * scale))
    return root.with_suffix(".yaml")


def run_name(job: dict) -> str:
    return f"{job['model']}-s{job['seed']}-{'reduced' if job['reduced'] else 'full'}"


def curve(results_csv: Path) -> dict:
    """Last and best mAP50-95 and the first epoch with mAP50 > START_MAP50 (None if never) from results.csv."""
    rows = results_rows(results_csv)
    maps = [float(r["metrics/mAP_0.5:0.95"]) for r in rows]
    first = next((int(r["epoch"]) for r in rows if float(r["metrics/mAP_0.5"]) > START_MAP50), None)
    return {"last": maps[-1], "best": max(maps), "first": first, "epochs": len(rows)}


def train_one(job: dict) -> dict:
    """One training run (in a worker process), or the finished one under ``--out``; its table row."""
    import torch

    import train

    run_dir = Path(job["out"]) / "runs" / run_name(job)
    results_csv = run_dir / "results.csv"
    if not (results_csv.exists() and curve(results_csv)["epochs"] == job["epochs"]):
        torch.set_num_threads(1)
        train.run(data=job["data"], cfg=str(ROOT / "models" / f"{job['model']}.yaml"), weights="",
                  imgsz=job["imgsz"], epochs=job["epochs"], batch_size=16, workers=0, seed=job["seed"],
                  project=str(run_dir.parent), name=run_dir.name, exist_ok=True, noplots=True,
                  reduced_decode=job["reduced"])
    return {**job, **curve(results_csv)}


def table(rows: list) -> str:
    lines = ["| model | training seed | decode | mAP50-95 last epoch | best | first epoch mAP50 > 0.001 |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['seed']} | {'reduced' if r['reduced'] else 'full'} | {r['last']:.4f} | "
              f"{r['best']:.4f} | {r['first'] if r['first'] is not None else 'never'} |" for r in rows]
    for reduced in (False, True):
        mine = [r for r in rows if r["reduced"] == reduced]
        firsts = [r["first"] for r in mine if r["first"] is not None]
        lines.append(f"| median | {len(mine)} seeds | {'reduced' if reduced else 'full'} | "
                     f"{statistics.median(r['last'] for r in mine):.4f} | "
                     f"{statistics.median(r['best'] for r in mine):.4f} | "
                     f"{statistics.median(firsts) if len(firsts) == len(mine) else 'not all started'} |")
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.accuracy.reduced_decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="yolov5n-p2", help="a model YAML name under models/")
    p.add_argument("--source-size", type=int, default=1024, help="px of the generated JPEGs")
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    p.add_argument("--out", required=True, help="data and runs; finished runs there are reused")
    args = parse_checked(p, RULES, argv)
    out = Path(args.out).resolve()
    data = make_data(out, args.source_size, args.imgsz, args.n_train, args.n_val, args.data_seed)
    jobs = [{"out": str(out), "data": str(data), "model": args.model, "imgsz": args.imgsz, "epochs": args.epochs,
             "seed": seed, "reduced": reduced} for seed in args.train_seeds for reduced in (False, True)]
    rows = map_in_workers(train_one, jobs, args.jobs)
    print(f"\n{args.model}, photos data at {args.source_size} px (seed {args.data_seed}), trained at {args.imgsz} px "
          f"for {args.epochs} epochs\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    main()
