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

import torch  # noqa: E402

import train  # noqa: E402
from benchmarks.accuracy_bands import SIZE_BANDS, band_ap, band_image_stats  # noqa: E402
from benchmarks.accuracy_variants import ABLATIONS, MODELS, variant_yaml  # noqa: E402
from make_tiny_shapes import make_tiny_shapes  # noqa: E402
from models.experimental import attempt_load  # noqa: E402
from utils.data_config import check_dataset  # noqa: E402
from utils.dataloaders import create_dataloader  # noqa: E402
from utils.ops import non_max_suppression, xywh2xyxy  # noqa: E402

DEFAULT_MODELS = ("yolov5n", "yolov5n-p2", "ffca-yolo-n", "l-ffca-yolo")


def first_nonzero_epoch(results_csv: Path) -> int | None:
    """1-based first epoch whose mAP50 in ``results.csv`` is above zero, or None."""
    with open(results_csv, newline="") as f:
        for row in csv.DictReader(f):
            if float(row["metrics/mAP_0.5"]) > 0:
                return int(row["epoch"]) + 1
    return None


@torch.no_grad()
def size_band_ap(weights: Path, data: dict, imgsz: int, batch_size: int) -> dict[str, tuple[float, float, int]]:
    """``{band: (AP50, AP50-95, labels)}`` of a checkpoint on the val split (conf 0.001, NMS IoU 0.6)."""
    model = attempt_load(weights, device=torch.device("cpu"))
    loader, _ = create_dataloader(data["val"], imgsz, batch_size, int(model.stride.max()), pad=0.5, rect=True,
                                  workers=0, nc=int(data["nc"]))
    stats = {band: [] for band in SIZE_BANDS}
    for imgs, targets, _, _ in loader:
        imgs = imgs.float() / 255
        preds = non_max_suppression(model(imgs)[0], 0.001, 0.6, multi_label=True, max_det=300)
        h, w = imgs.shape[2:]
        boxes = xywh2xyxy(targets[:, 2:6] * torch.tensor((w, h, w, h)))
        for i, pred in enumerate(preds):
            labels = torch.cat((targets[:, 1:2], boxes), 1)[targets[:, 0] == i]
            for band, limits in SIZE_BANDS.items():
                stats[band].append(band_image_stats(pred, labels, limits))
    return {band: band_ap(s) for band, s in stats.items()}


def train_one(name: str, cfg: Path, data_yaml: Path, out: Path, opt) -> dict:
    """Train one model with the shared recipe; return its row of the table."""
    t0 = time.perf_counter()
    results = train.run(data=str(data_yaml), cfg=str(cfg), weights="", imgsz=opt.imgsz, epochs=opt.epochs,
                        batch_size=opt.batch_size, workers=opt.workers, seed=opt.seed, project=str(out / "runs"),
                        name=name, exist_ok=True, noplots=True, hyp=str(opt.hyp))
    seconds = time.perf_counter() - t0
    run_dir = out / "runs" / name
    bands = size_band_ap(run_dir / "weights" / "last.pt", check_dataset(data_yaml), opt.imgsz, opt.batch_size)
    return {"model": name, "map50": results[2], "map": results[3], "bands": bands,
            "first": first_nonzero_epoch(run_dir / "results.csv"), "s_per_epoch": seconds / opt.epochs}


def format_table(rows: list[dict]) -> str:
    """Markdown table of the benchmark rows."""
    bands = list(SIZE_BANDS)
    head = ["model", "mAP50", "mAP50-95", *(f"AP50 {b}" for b in bands), "first mAP>0 epoch", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['map50']:.3f}", f"{r['map']:.3f}",
                 *(f"{r['bands'][b][0]:.3f}" for b in bands), str(r["first"] or "-"), f"{r['s_per_epoch']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    counts = ", ".join(f"{b}: {n}" for b, (_, _, n) in rows[0]["bands"].items()) if rows else ""
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
