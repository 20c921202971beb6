"""The five pictures: detections, learning curves, AP per size band, sliced inference, data set sizes."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import cv2
import numpy as np
from matplotlib.ticker import MaxNLocator

from benchmarks.figures import draw, runs
from utils import __version__

MODELS = ("yolov5n", "yolov5n-p2", "ffca-yolo-n")
MODEL_COLOURS = {"yolov5n": "tab:gray", "yolov5n-p2": "tab:blue", "ffca-yolo-n": "tab:red"}
BAND_NAMES = {"very_tiny": "very tiny\n< 8 px", "tiny": "tiny\n8-16 px", "aitod_small": "small\n16-32 px"}
CONF = 0.25  # detect.py's default confidence threshold


def detections(run_dir: Path, out: Path, count: int = 3) -> int:
    """Labels (top row) above predictions (bottom row) of the trained FFCA-YOLO-n on the first ``count``
    embedded validation images (three keep the PNG under the size limit at full colour)."""
    from models import Detector
    from utils.dataset.data_config import check_dataset

    val_dir = Path(check_dataset(runs.ROOT / "data" / "shapes.yaml")["val"])
    detector = Detector(run_dir / "weights" / "best.pt", imgsz=runs.DETECTOR["imgsz"], conf=CONF)
    fig = draw.figure(9.6, 6.9)
    axes = fig.subplots(2, count)
    for column, path in enumerate(sorted(val_dir.glob("*.jpg"))[:count]):
        rgb = cv2.imread(str(path))[:, :, ::-1]
        xyxy, classes = draw.labels_xyxy(path.parent.parent.parent / "labels" / "val" / f"{path.stem}.txt",
                                         rgb.shape[1], rgb.shape[0])
        result = detector(rgb)
        for ax, title, (found, kinds) in ((axes[0][column], f"{path.name}: {len(classes)} labels", (xyxy, classes)),
                                          (axes[1][column], f"{len(result.scores)} predictions, conf >= {CONF}",
                                           (result.boxes, result.classes))):
            ax.imshow(rgb)
            draw.boxes(ax, found, kinds)
            ax.set_title(title, fontsize=9)
            ax.set_axis_off()
    draw.legend(fig, detector.names)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.9, bottom=0.02, wspace=0.04, hspace=0.12)
    draw.caption(fig, draw.trained(runs.DETECTOR_TEXT, runs.trained_at(run_dir)), __version__)
    return draw.save_png(fig, out)


def curve(run_dir: Path, column: str) -> list[float]:
    with open(run_dir / "results.csv", newline="") as f:
        return [float(row[column]) for row in csv.DictReader(f)]


def learning_curves(rows: list[dict], out: Path) -> int:
    """mAP50 and mAP50-95 per epoch: median over training seeds, shaded from lowest to highest."""
    fig = draw.figure(11, 4)
    for ax, (column, label) in zip(fig.subplots(1, 2), (("metrics/mAP_0.5", "mAP50"),
                                                        ("metrics/mAP_0.5:0.95", "mAP50-95"))):
        for model in MODELS:
            curves = np.array([curve(r["run_dir"], column) for r in rows if r["model"] == model])
            epochs = np.arange(1, curves.shape[1] + 1)
            ax.plot(epochs, np.median(curves, 0), color=MODEL_COLOURS[model],
                    label=f"{model} (median of {len(curves)})")
            ax.fill_between(epochs, curves.min(0), curves.max(0), color=MODEL_COLOURS[model], alpha=0.2)
        ax.set(xlabel="epoch", ylabel=f"validation {label}", title=f"{label}: median line, range shaded")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    draw.caption(fig, draw.trained(runs.MATRIX_TEXT, stamps(rows)), __version__)
    return draw.save_png(fig, out)


def size_bands(rows: list[dict], out: Path) -> int:
    """AP50-95 of each model's last.pt per AI-TOD size band: median bar, lowest-to-highest whisker."""
    fig = draw.figure(8, 4)
    ax = fig.subplots()
    width = 0.8 / len(MODELS)
    for k, model in enumerate(MODELS):
        per_band = [[r["bands"][b]["map"] for r in rows if r["model"] == model] for b in BAND_NAMES]
        median = np.array([statistics.median(v) for v in per_band])
        low, high = median - [min(v) for v in per_band], [max(v) for v in per_band] - median
        x = np.arange(len(BAND_NAMES)) + (k - (len(MODELS) - 1) / 2) * width
        bars = ax.bar(x, median, width, yerr=[low, high], capsize=3, color=MODEL_COLOURS[model], label=model)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)  # a zero bar is otherwise invisible
    counts = rows[0]["bands"]
    ax.set_xticks(range(len(BAND_NAMES)), [f"{n}\n({counts[b]['instances']} objects)" for b, n in BAND_NAMES.items()])
    ax.set(ylabel="AP50-95 of last.pt", title="AP per object-size band (AI-TOD bands), median and range over seeds")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    draw.caption(fig, draw.trained(runs.MATRIX_TEXT, stamps(rows)), __version__)
    return draw.save_png(fig, out)


def stamps(rows: list[dict]) -> str:
    return ", ".join(sorted({runs.trained_at(r["run_dir"]) for r in rows}))


def scene_scores(weights: Path, data_yaml: Path) -> dict:
    """mAP50 of the four scenes: ``{"whole": ..., "sliced": ...}`` (val.py without and with --slice)."""
    import val
    from utils.dataset.data_config import check_dataset

    imgsz = runs.DETECTOR["imgsz"]
    return {mode: val.run(check_dataset(data_yaml), weights=str(weights), batch_size=1, imgsz=imgsz, device="cpu",
                          workers=0, project=str(runs.CACHE / "val"), name=mode, exist_ok=True, plots=False,
                          slice_size=imgsz if mode == "sliced" else 0).map50
            for mode in ("whole", "sliced")}


def busiest_window(xyxy: np.ndarray, crop: int, size: int, step: int = 64) -> tuple[int, int]:
    """Top-left corner (x, y) of the ``crop``-px window, on a ``step``-px grid, holding the most box centres."""
    cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
    corners = [(x, y) for x in range(0, size - crop + 1, step) for y in range(0, size - crop + 1, step)]
    def inside(corner):
        x, y = corner
        return int(((cx >= x) & (cx < x + crop) & (cy >= y) & (cy < y + crop)).sum())

    return max(corners, key=inside)


def sliced(run_dir: Path, out: Path, crop: int = 448) -> int:
    """Labels, whole-image and sliced predictions on the first scene, shown on its ``crop``-px window with the
    most objects."""
    from models import Detector
    from utils.slicing import sliced_predictor

    imgsz, weights, data_yaml = runs.DETECTOR["imgsz"], run_dir / "weights" / "best.pt", runs.scene_yaml()
    scores = scene_scores(weights, data_yaml)
    path = sorted((data_yaml.parent / "scenes" / "images" / "val").glob("*.jpg"))[0]
    bgr = cv2.imread(str(path))
    detector = Detector(weights, imgsz=imgsz, conf=CONF)
    slicer = sliced_predictor(detector.model, imgsz, 0.2, conf_thres=CONF, imgsz=imgsz, stride=detector.stride)
    whole, tiled = detector(bgr[:, :, ::-1]), slicer(bgr).cpu().numpy()
    truth = draw.labels_xyxy(path.parent.parent.parent / "labels" / "val" / f"{path.stem}.txt", *bgr.shape[1::-1])
    panels = ((f"labels: {len(truth[1])} objects of 6-16 px", truth),
              (f"whole image at --imgsz {imgsz}: {len(whole.scores)} found\nmAP50 {scores['whole']:.3f} on 4 scenes",
               (whole.boxes, whole.classes)),
              (f"--slice {imgsz} --imgsz {imgsz}: {len(tiled)} found\nmAP50 {scores['sliced']:.3f} on 4 scenes",
               (tiled[:, :4], tiled[:, 5])))
    x0, y0 = busiest_window(truth[0], crop, bgr.shape[0])
    fig = draw.figure(12, 4.8)
    for ax, (title, (xyxy, classes)) in zip(fig.subplots(1, 3), panels):
        ax.imshow(bgr[:, :, ::-1])
        draw.boxes(ax, xyxy, classes)
        ax.set(xlim=(x0, x0 + crop), ylim=(y0 + crop, y0), title=title)
        ax.title.set_fontsize(9)
        ax.set_axis_off()
    draw.legend(fig, detector.names)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.83, bottom=0.02, wspace=0.04)
    source = (f"Scene: {path.name} of four generated 1024-px scenes (data/shapes_large.yaml's recipe); the {crop}-px "
              f"window at ({x0}, {y0}) with the most objects is shown, counts are over the whole scene. "
              + draw.trained(runs.DETECTOR_TEXT, runs.trained_at(run_dir)))
    draw.caption(fig, source, __version__)
    return draw.save_png(fig, out)


def size_histogram(out: Path, imgsz: int = 256) -> int:
    """The data set report's figure for the embedded data set, band edges marked."""
    from utils.dataset.dataset_stats import dataset_report, report_figure

    fig = report_figure(dataset_report(runs.ROOT / "data" / "shapes.yaml", imgsz))
    fig.set_size_inches(15, 3.6)
    source = (f"Data: data/shapes.yaml, train split, sizes at --imgsz {imgsz}; the same figure as "
              f"`python -m utils.dataset.dataset_stats --data data/shapes.yaml --imgsz {imgsz} --plot sizes.png`.")
    draw.caption(fig, source, __version__)
    return draw.save_png(fig, out)
