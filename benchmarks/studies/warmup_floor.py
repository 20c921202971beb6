"""Is a short run on a small data set mostly warm-up? Default warm-up vs no 100-iteration floor.

train.py warms up for ``max(warmup_epochs * batches_per_epoch, 100)`` iterations: with 128
images at batch 16 (8 batches per epoch) that is 100 iterations = 12.5 epochs, not 3. This study
trains each model twice, once as train.py does and once with the floor removed (3 epochs = 24
iterations; train.py itself is not changed: the run's loop is adjusted before its first epoch),
runs interleaved (model A, model B, then the same without the floor), and prints the first epoch
with a non-zero mAP50, the first with mAP50 >= 0.01 and the final mAP50 / mAP50-95 of each.

    python -m benchmarks.studies.warmup_floor --out runs/warmup-study               # yolov5n, ffca-yolo-n, 12 epochs
    python -m benchmarks.studies.warmup_floor --models yolov5n-p2 ffca-yolo-n --epochs 20
"""

from __future__ import annotations

import argparse
import csv
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import train
from benchmarks.accuracy.variants import MODELS
from utils.dataset.synthetic.tiny_shapes import make_tiny_shapes
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

USEFUL_MAP50 = 0.01  # a non-zero mAP50 of ~1e-5 is a lucky box, not a detector


@contextmanager
def warmup_without_floor():
    """While active, train.py's loop warms up for exactly ``warmup_epochs`` epochs (no 100-iteration floor)."""
    announce = train.TrainLoop.announce

    def announce_without_floor(loop):
        epochs = loop.hyp["warmup_epochs"]
        loop.n_warmup = round(epochs * len(loop.ctx.train_loader)) if epochs > 0 else 0
        announce(loop)

    train.TrainLoop.announce = announce_without_floor
    try:
        yield
    finally:
        train.TrainLoop.announce = announce


def mAP_per_epoch(results_csv: Path) -> list[tuple[float, float]]:
    """``(mAP50, mAP50-95)`` of every epoch in ``results.csv``."""
    with open(results_csv, newline="") as f:
        return [(float(r["metrics/mAP_0.5"]), float(r["metrics/mAP_0.5:0.95"])) for r in csv.DictReader(f)]


RULES = OptionRules(positive=("epochs", "imgsz", "n_train", "n_val", "batch_size"), folders=("out",))


@exit_on_user_error
def main(argv=None) -> None:
    p = parser_for("benchmarks.studies.warmup_floor",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["yolov5n", "ffca-yolo-n"], choices=sorted(MODELS))
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--imgsz", type=int, default=128)
    p.add_argument("--n-train", type=int, default=128)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, required=True, help="folder for the generated data and the runs")
    opt = parse_checked(p, RULES, argv)
    data = opt.out / "tiny-shapes.yaml"
    if not data.exists():
        data = make_tiny_shapes(opt.out / "tiny-shapes", n_train=opt.n_train, n_val=opt.n_val, seed=0)
    rows = []
    for floor in (True, False):
        for model in opt.models:
            name = f"{model}-{'floor' if floor else 'nofloor'}"
            t0 = time.perf_counter()
            with nullcontext() if floor else warmup_without_floor():
                train.run(data=str(data), cfg=str(MODELS[model]), weights="", imgsz=opt.imgsz, epochs=opt.epochs,
                          batch_size=opt.batch_size, workers=0, seed=0, project=str(opt.out / "runs"), name=name,
                          exist_ok=True, noplots=True)
            results = opt.out / "runs" / name / "results.csv"
            per_epoch = mAP_per_epoch(results)
            useful = next((i + 1 for i, (m50, _) in enumerate(per_epoch) if m50 >= USEFUL_MAP50), None)
            first = next((i + 1 for i, (m50, _) in enumerate(per_epoch) if m50 > 0), None)
            rows.append((name, first, useful, per_epoch[-1], time.perf_counter() - t0))
            print(f"{name}: mAP50 per epoch {' '.join(f'{m:.1e}' for m, _ in per_epoch)}", flush=True)
    print(f"| run | first epoch mAP50 > 0 | first epoch mAP50 >= {USEFUL_MAP50} | final mAP50 | final mAP50-95 "
          "| wall s |\n"
          "|---|---|---|---|---|---|")
    for name, first, useful, (m50, m), seconds in rows:
        print(f"| {name} | {first or '-'} | {useful or '-'} | {m50:.2e} | {m:.2e} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
