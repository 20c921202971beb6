"""results.csv: one row per epoch, YOLOv5's column names, the skipped-batch count, then the size-band mAPs.

It is written by an ``on_fit_epoch_end`` callback (utils/training/hooks.py), as the trackers are."""

from pathlib import Path

from utils.files import atomic_write_bytes
from utils.size_metrics import RESULT_COLUMNS as SIZE_BAND_COLUMNS

COLUMNS = (
    "epoch", "train/box_loss", "train/obj_loss", "train/cls_loss",
    "metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
    "val/box_loss", "val/obj_loss", "val/cls_loss", "x/lr0", "x/lr1", "x/lr2",
    "train/skipped",  # batches skipped for a non-finite loss (--nan-policy skip)
) + SIZE_BAND_COLUMNS  # NaN where a band has no labels or the epoch was not validated


class ResultsLog:
    """Append-only CSV of per-epoch results (plain CSV, full float precision)."""

    columns = COLUMNS

    def __init__(self, path):
        self.path = Path(path)

    def append(self, epoch: int, values) -> None:
        """Write the row for ``epoch``; ``values`` follow COLUMNS[1:]."""
        values = [float(v) for v in values]
        if len(values) != len(COLUMNS) - 1:
            raise ValueError(f"results row needs {len(COLUMNS) - 1} values, got {len(values)}")
        new_file = not self.path.exists()
        with open(self.path, "a") as f:
            if new_file:
                f.write(",".join(COLUMNS) + "\n")
            f.write(",".join([str(epoch), *(f"{v:.8g}" for v in values)]) + "\n")

    def truncate(self, start_epoch: int) -> None:
        """Drop rows of epochs >= ``start_epoch`` (a resumed run rewrites them)."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines()
        kept = lines[:1] + [ln for ln in lines[1:] if ln and int(ln.split(",", 1)[0]) < start_epoch]
        atomic_write_bytes(self.path, ("\n".join(kept) + "\n").encode())
