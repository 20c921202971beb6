"""Small-object accuracy benchmark: same recipe, same budget, one table.

Generates the embedded tiny-shapes data set (objects 6-24 px on cluttered 160-px images, see
data/scripts/make_tiny_shapes.py), trains each model from scratch with ``train.run`` and prints
mAP50, mAP50-95, AP50 per size band (sqrt of box area: very tiny < 8 px, tiny 8-16, small 16-32),
the first epoch with a non-zero mAP50 and the wall time per epoch (training + per-epoch val).

    python benchmarks/accuracy.py                      # 4 models, 30 epochs (sized for ~30 min on 2 idle cores)
    python benchmarks/accuracy.py --models yolov5n ffca-yolo-n --epochs 10
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "data" / "scripts"))

import argparse  # noqa: E402
import csv  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import train  # noqa: E402
import val  # noqa: E402
from benchmarks.accuracy_variants import ABLATIONS, MODELS, variant_yaml  # noqa: E402
from make_tiny_shapes import make_tiny_shapes  # noqa: E402
from utils.dataset.data_config import check_dataset  # noqa: E402

BANDS = {"very_tiny": "<8", "tiny": "8-16", "aitod_small": "16-32"}  # AI-TOD bands by sqrt(area), px

DEFAULT_MODELS = ("yolov5n", "yolov5n-p2", "ffca-yolo-n", "l-ffca-yolo")


def first_nonzero_epoch(results_csv: Path) -> int | None:
    """1-based first epoch whose mAP50 in ``results.csv`` is above zero, or None."""
    with open(results_csv, newline="") as f:
        for row in csv.DictReader(f):
            if float(row["metrics/mAP_0.5"]) > 0:
                return int(row["epoch"]) + 1
    return None


def size_band_ap(weights: Path, data_yaml: Path, imgsz: int, batch_size: int, out: Path) -> dict:
    """``{band key: {"instances", "map50", "map", "ar"}}`` of a checkpoint on the val split (val.py's bands)."""
    *_, bands = val.run(check_dataset(data_yaml), weights=str(weights), batch_size=batch_size, imgsz=imgsz,
                        device="cpu", workers=0, project=str(out / "val"), name=weights.parent.parent.name,
                        exist_ok=True, plots=False, size_bands=True)
    return bands


def train_one(name: str, cfg: Path, data_yaml: Path, out: Path, opt) -> dict:
    """Train one model with the shared recipe; return its row of the table."""
    t0 = time.perf_counter()
    results = train.run(data=str(data_yaml), cfg=str(cfg), weights="", imgsz=opt.imgsz, epochs=opt.epochs,
                        batch_size=opt.batch_size, workers=opt.workers, seed=opt.seed, project=str(out / "runs"),
                        name=name, exist_ok=True, noplots=True, hyp=str(opt.hyp))
    seconds = time.perf_counter() - t0
    run_dir = out / "runs" / name
    bands = size_band_ap(run_dir / "weights" / "last.pt", data_yaml, opt.imgsz, opt.batch_size, out)
    return {"model": name, "map50": results[2], "map": results[3], "bands": bands,
            "first": first_nonzero_epoch(run_dir / "results.csv"), "s_per_epoch": seconds / opt.epochs}


def format_table(rows: list[dict]) -> str:
    """Markdown table of the benchmark rows."""
    head = ["model", "mAP50", "mAP50-95", *(f"AP50 {label} px" for label in BANDS.values()),
            *(f"AP50-95 {label} px" for label in BANDS.values()), "first mAP>0 epoch", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['map50']:.3f}", f"{r['map']:.3f}",
                 *(f"{r['bands'][b]['map50']:.3f}" for b in BANDS), *(f"{r['bands'][b]['map']:.3f}" for b in BANDS),
                 str(r["first"] or "-"), f"{r['s_per_epoch']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    counts = ", ".join(f"{label} px: {rows[0]['bands'][b]['instances']}" for b, label in BANDS.items()) if rows else ""
    return "\n".join(lines) + f"\n\nval labels per band: {counts}"


def parse_opt(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   choices=sorted(MODELS) + sorted(ABLATIONS), help="models to train, in order")
    p.add_argument("--epochs", type=int, default=30, help="epochs per model (same for all)")
    p.add_argument("--imgsz", type=int, default=160, help="train/val image size (the data is 160 px)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-train", type=int, default=256, help="generated training images")
    p.add_argument("--n-val", type=int, default=64, help="generated validation images")
    p.add_argument("--hyp", type=Path, default=ROOT / "data" / "hyps" / "hyp.scratch-low.yaml")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="keep data and runs here (default: a temporary folder)")
    return p.parse_args(argv)


def main(argv=None) -> str:
    """Run the benchmark; print and return the table."""
    opt = parse_opt(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = (opt.out or Path(tmp)).resolve()
        data_yaml = out / "tiny-shapes.yaml"
        if not data_yaml.exists():
            data_yaml = make_tiny_shapes(out / "tiny-shapes", opt.n_train, opt.n_val, opt.seed)
        rows = []
        for name in opt.models:
            rows.append(train_one(name, variant_yaml(name, out / "models"), data_yaml, out, opt))
            print(format_table(rows), flush=True)
    table = format_table(rows)
    print(f"\nbenchmarks/accuracy.py --epochs {opt.epochs} --imgsz {opt.imgsz} --batch-size {opt.batch_size} "
          f"(tiny-shapes {opt.n_train} train / {opt.n_val} val, seed {opt.seed})\n{table}")
    return table


if __name__ == "__main__":
    main()
