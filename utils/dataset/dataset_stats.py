"""Data set report: images, objects per image, object sizes at the training size, classes, and advice.

    python -m utils.dataset.dataset_stats --data data/VisDrone.yaml --imgsz 640 [--plot sizes.png]

An object's size is ``sqrt(w * h)`` in pixels after the image's long side is resized to ``--imgsz`` (as
training does), sorted into the AI-TOD bands: very tiny < 8, tiny 8-16, small 16-32, medium >= 32 px. The
advice (image size, slicing, a stride-4 model) is derived from the training split, each with its reason.
Labels are read straight from the label files (``/images/`` -> ``/labels/``, ``.txt``); rows that are
not five numbers are counted as unreadable, not fixed.
"""

import argparse
import io
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from utils.dataset.data_config import SPLITS, check_dataset
from utils.dataset.label_cache import is_polygon_row, polygon_box
from utils.errors import UserError, exit_on_user_error
from utils.files import atomic_write_bytes
from utils.logging import LOGGER

IMAGE_SUFFIXES = {".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp"}
BANDS = (("very tiny <8", 0, 8), ("tiny 8-16", 8, 16), ("small 16-32", 16, 32), ("medium >=32", 32, math.inf))
STRIDE4_SHARE = 0.3  # share of objects under 16 px from which a stride-4 head is advised
VERY_TINY_SHARE = 0.2  # share under 8 px from which a larger input (or slicing) is advised


def split_images(entry) -> list:
    """Image paths of a split entry: a folder (searched recursively), a .txt list, an image, or a list of these."""
    if isinstance(entry, list):
        return [p for e in entry for p in split_images(e)]
    path = Path(entry)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if path.suffix == ".txt":
        lines = [s.strip() for s in path.read_text().splitlines() if s.strip()]
        return [p if p.is_absolute() else (path.parent / p).resolve() for p in map(Path, lines)]
    return [path]


def label_path(image: Path) -> Path:
    """The label file of an image: the last ``/images/`` becomes ``/labels/``, the suffix ``.txt``."""
    parts = str(image).rsplit(f"{os.sep}images{os.sep}", 1)
    return Path(f"{os.sep}labels{os.sep}".join(parts)).with_suffix(".txt")


def read_labels(path: Path) -> tuple:
    """``((n, 5) float array [cls, x, y, w, h], unreadable row count)``; no file is an empty array."""
    if not path.is_file():
        return np.zeros((0, 5)), 0
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            values = [float(v) for v in line.split()]
        except ValueError:
            values = []
        if is_polygon_row(len(values)):  # a polygon row counts as its enclosing box, as in training
            values = polygon_box(values)
        if len(values) == 5 and all(math.isfinite(v) for v in values):
            rows.append(values)
        elif line.strip():
            bad += 1
    return np.array(rows, dtype=float).reshape(-1, 5), bad


def split_stats(images: list, imgsz: int) -> dict:
    """Counts and per-object arrays of one split: sizes in px at ``imgsz``, classes, native long sides."""
    per_image, sizes, classes, long_sides, unreadable, bad_rows = [], [], [], [], 0, 0
    for image in images:
        try:
            with Image.open(image) as im:
                width, height = im.size
        except (OSError, UnidentifiedImageError, ValueError):
            unreadable += 1
            continue
        labels, bad = read_labels(label_path(image))
        bad_rows += bad
        scale = imgsz / max(width, height)
        per_image.append(len(labels))
        long_sides.append(max(width, height))
        sizes.append(np.sqrt(labels[:, 3] * width * labels[:, 4] * height) * scale)
        classes.append(labels[:, 0].astype(int))
    return {"images": len(per_image), "unreadable_images": unreadable, "unreadable_rows": bad_rows,
            "per_image": np.array(per_image, dtype=int), "long_sides": np.array(long_sides, dtype=float),
            "sizes": np.concatenate(sizes) if sizes else np.zeros(0),
            "classes": np.concatenate(classes) if classes else np.zeros(0, dtype=int)}


def band_counts(sizes: np.ndarray) -> dict:
    """``{band name: number of objects}`` over the AI-TOD size bands."""
    return {name: int(((sizes >= lo) & (sizes < hi)).sum()) for name, lo, hi in BANDS}


def recommend(stats: dict, imgsz: int) -> list:
    """``[(advice, reason)]`` from the training split's statistics."""
    sizes = stats["sizes"]
    if not len(sizes):
        return [("label the training images first", "the training split has no objects")]
    very_tiny, tiny = float((sizes < 8).mean()), float((sizes < 16).mean())
    long_side = float(np.median(stats["long_sides"]))
    native = sizes * long_side / imgsz  # sizes at the images' own resolution (median scale)
    advice = []
    if very_tiny >= VERY_TINY_SHARE and long_side >= 2 * imgsz:
        advice.append((f"slice the images into tiles of about {imgsz} px (with overlap) before training",
                       f"the median image is {long_side:.0f} px, so --imgsz {imgsz} shrinks it {long_side / imgsz:.1f}x "
                       f"and {very_tiny:.0%} of objects end under 8 px (at full resolution "
                       f"{float((native < 8).mean()):.0%} are)"))
    elif very_tiny >= VERY_TINY_SHARE and long_side > imgsz:
        larger = int(math.ceil(long_side / 32) * 32)
        advice.append((f"train at --imgsz {larger}",
                       f"{very_tiny:.0%} of objects are under 8 px at {imgsz}; the images are {long_side:.0f} px"))
    if tiny >= STRIDE4_SHARE:
        advice.append(("use a stride-4 model: models/ffca-yolo.yaml (FFCA-YOLO) or models/yolov5s-p2.yaml",
                       f"{tiny:.0%} of objects are under 16 px at {imgsz}, i.e. under 2 cells of a stride-8 "
                       f"output, the finest of the standard YOLOv5 models"))
    else:
        advice.append(("the standard stride 8/16/32 models (e.g. models/yolov5s.yaml) fit",
                       f"only {tiny:.0%} of objects are under 16 px at {imgsz}"))
    counts = np.bincount(stats["classes"]) if len(stats["classes"]) else np.zeros(0)
    present = counts[counts > 0]
    if len(present) > 1 and present.max() > 10 * present.min():
        advice.append(("expect weak results on the rare classes (more data for them helps most)",
                       f"the largest class has {present.max() / present.min():.0f}x the objects of the smallest"))
    return advice


def dataset_report(data_yaml, imgsz: int) -> dict:
    """``{'names', 'splits': {split: stats}, 'advice': [(advice, reason)]}`` of a data set YAML."""
    if imgsz < 1:
        raise UserError(f"--imgsz must be a positive int, got {imgsz}")
    data = check_dataset(data_yaml)
    splits = {s: split_stats(split_images(data[s]), imgsz) for s in SPLITS if s in data}
    return {"names": data["names"], "imgsz": imgsz, "splits": splits, "advice": recommend(splits["train"], imgsz)}


def format_report(report: dict) -> str:
    """The report as text lines."""
    imgsz, names = report["imgsz"], report["names"]
    lines = [f"Object size = sqrt(w*h) in pixels after resizing the long side to {imgsz}",
             f"{'split':<6}{'images':>8}{'background':>12}{'objects':>9}{'per image mean/median/max':>28}"
             f"{'long side median':>18}"]
    for split, st in report["splits"].items():
        n = st["per_image"]
        per = f"{n.mean():.1f}/{np.median(n):.0f}/{n.max()}" if len(n) else "-"
        side = f"{np.median(st['long_sides']):.0f}" if len(n) else "-"
        lines.append(f"{split:<6}{st['images']:>8}{int((n == 0).sum()):>12}{len(st['sizes']):>9}{per:>28}{side:>18}")
        if st["unreadable_images"] or st["unreadable_rows"]:
            lines.append(f"  {split}: {st['unreadable_images']} unreadable images, "
                         f"{st['unreadable_rows']} label rows that are not 5 numbers")
    for split, st in report["splits"].items():
        total = max(len(st["sizes"]), 1)
        bands = ", ".join(f"{k}: {v} ({v / total:.0%})" for k, v in band_counts(st["sizes"]).items())
        lines.append(f"Sizes {split}: {bands}")
        counts = np.bincount(st["classes"], minlength=len(names)) if len(st["classes"]) else np.zeros(len(names))
        lines.append(f"Classes {split}: " + ", ".join(
            f"{names[i] if i < len(names) else f'id {i} (not in names)'} {int(c)} ({c / total:.0%})"
            for i, c in enumerate(counts) if c))
    lines.append("Advice (from the train split):")
    lines += [f"  - {advice}: {reason}" for advice, reason in report["advice"]]
    return "\n".join(lines)


def report_figure(report: dict):
    """The train split as a matplotlib Figure: the object-size histogram (log bins) with the AI-TOD band
    edges drawn, objects per image, and objects per class."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: only --plot needs matplotlib
    from matplotlib.figure import Figure

    st, names = report["splits"]["train"], report["names"]
    fig = Figure(figsize=(18, 4), tight_layout=True)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    sizes = st["sizes"][st["sizes"] > 0]
    bins = np.geomspace(1, max(float(sizes.max()) if len(sizes) else 64, 64), 40)
    counts, _, _ = ax1.hist(sizes, bins=bins, color="tab:blue")
    ax1.set_xscale("log")
    ax1.set_ylim(0, 1.35 * max(counts.max(), 1))  # headroom: the band labels sit above the bars
    for _, lo, _ in BANDS[1:]:
        ax1.axvline(lo, color="tab:red", linestyle="--", linewidth=1)
    for row, (label, lo, hi) in enumerate(BANDS):  # neighbouring labels on alternate rows, so they never overlap
        ax1.text(math.sqrt(max(lo, 1) * min(hi, bins[-1])), 0.98 - 0.09 * (row % 2), label,
                 transform=ax1.get_xaxis_transform(), ha="center", va="top", fontsize=7, color="tab:red")
    ax1.set(xlabel=f"object size sqrt(w*h), px at imgsz {report['imgsz']}", ylabel="objects",
            title="train object sizes (bands 8 / 16 / 32 px)")
    per_image = st["per_image"]
    ax2.hist(per_image, bins=np.arange(int(per_image.max()) + 2 if len(per_image) else 2) - 0.5, color="tab:orange")
    ax2.set(xlabel="objects in the image", ylabel="images", title="train objects per image")
    counts = np.bincount(st["classes"], minlength=len(names))[:len(names)]
    ax3.barh(range(len(names)), counts, color="tab:green")
    ax3.set_yticks(range(len(names)), names)
    ax3.set(xlabel="objects", title="train classes")
    return fig


def plot_report(report: dict, path) -> None:
    """Write :func:`report_figure` as a PNG (atomically)."""
    buffer = io.BytesIO()
    report_figure(report).savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())


def parse_opt(argv=None) -> argparse.Namespace:
    """Command-line options of ``python -m utils.dataset.dataset_stats``."""
    parser = argparse.ArgumentParser(description="Report a data set's object sizes, classes and advice.")
    parser.add_argument("--data", required=True, help="data set YAML")
    parser.add_argument("--imgsz", type=int, default=640, help="training image size in pixels")
    parser.add_argument("--plot", default="", help="also write a PNG: sizes, objects per image, classes")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> None:
    """Print the report of ``--data`` (and write ``--plot``)."""
    opt = parse_opt(argv)
    report = dataset_report(opt.data, opt.imgsz)
    LOGGER.info(format_report(report))
    if opt.plot:
        try:
            plot_report(report, opt.plot)
        except OSError as e:  # written atomically: a failed write leaves no partial PNG behind
            raise UserError(f"--plot {opt.plot}: cannot write it ({e.strerror or e}); the report above is "
                            "complete; free disk space or choose a writable --plot path") from None
        LOGGER.info(f"Plot written to {opt.plot}")


if __name__ == "__main__":
    main()
