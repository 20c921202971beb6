"""All drawing: box annotation, batch mosaics, label statistics, training curves, metric plots.

Works offline: text uses OpenCV's Hershey font or matplotlib's bundled DejaVu Sans, and
figures are rendered with matplotlib's Agg canvas (no pyplot, no display, no global backend).
"""

import math
from pathlib import Path

import cv2
import matplotlib
import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from utils.errors import UserError
from utils.metrics import RECALL_POINTS, smooth
from utils.ops import clip_boxes, xywh2xyxy, xyxy2xywh
from utils.size_metrics import RESULT_COLUMNS as BAND_COLUMNS, SIZE_BANDS

DEJAVU_FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


class Colors:
    """Distinct colours per class index, from matplotlib's ``tab20`` map, as RGB or BGR int tuples."""

    def __init__(self):
        cmap = matplotlib.colormaps["tab20"]
        # even entries first: the saturated half of each pair, so neighbouring ids differ most
        order = list(range(0, 20, 2)) + list(range(1, 20, 2))
        self.palette = [tuple(int(255 * c) for c in cmap(i)[:3]) for i in order]
        self.n = len(self.palette)

    def __call__(self, i, bgr=False):
        r, g, b = self.palette[int(i) % self.n]
        return (b, g, r) if bgr else (r, g, b)


colors = Colors()


def _font(size):
    return ImageFont.truetype(str(DEJAVU_FONT), max(int(size), 8))


class Annotator:
    """Draw boxes and labels on an HWC uint8 image (BGR for OpenCV drawing, RGB when ``pil``).

    Non-ASCII labels need ``pil=True`` (DejaVu has the glyphs; Hershey fonts are ASCII only).
    """

    def __init__(self, im, line_width=None, font_size=None, pil=False):
        if not isinstance(im, np.ndarray) or im.ndim != 3:
            raise ValueError("Annotator needs an HWC numpy image")
        self.pil = pil
        self.lw = line_width or max(round(sum(im.shape[:2]) / 2 * 0.003), 2)
        if pil:
            self.im = Image.fromarray(np.ascontiguousarray(im))
            self.draw = ImageDraw.Draw(self.im)
            self.font = _font(font_size or max(round(sum(self.im.size) / 2 * 0.035), 12))
        else:
            self.im = np.ascontiguousarray(im)
            self.tf = max(self.lw - 1, 1)  # text thickness

    def box_label(self, box, label="", color=(128, 128, 128), txt_color=(255, 255, 255)):
        """Draw xyxy ``box`` (4,) and, when given, ``label`` on a filled strip above it."""
        x1, y1, x2, y2 = (int(v) for v in box[:4])
        if self.pil:
            self.draw.rectangle((x1, y1, x2, y2), width=self.lw, outline=color)
            if label:
                left, top, right, bottom = self.font.getbbox(label)
                w, h = right - left, bottom - top
                outside = y1 - h >= 0
                ty = y1 - h - 2 if outside else y1
                self.draw.rectangle((x1, ty, x1 + w + 1, ty + h + 2), fill=color)
                self.draw.text((x1, ty - top + 1), label, fill=txt_color, font=self.font)
            return
        cv2.rectangle(self.im, (x1, y1), (x2, y2), color, thickness=self.lw, lineType=cv2.LINE_AA)
        if label:
            (w, h), _ = cv2.getTextSize(label, 0, fontScale=self.lw / 3, thickness=self.tf)
            outside = y1 - h - 3 >= 0
            corner = (x1 + w, y1 - h - 3 if outside else y1 + h + 3)
            cv2.rectangle(self.im, (x1, y1), corner, color, -1, cv2.LINE_AA)
            cv2.putText(self.im, label, (x1, y1 - 2 if outside else y1 + h + 2), 0, self.lw / 3, txt_color,
                        thickness=self.tf, lineType=cv2.LINE_AA)

    def rectangle(self, xy, fill=None, outline=None, width=1):
        """Plain rectangle ``xy`` = (x1, y1, x2, y2)."""
        if self.pil:
            self.draw.rectangle(tuple(int(v) for v in xy), fill=fill, outline=outline, width=width)
            return
        p1, p2 = (int(xy[0]), int(xy[1])), (int(xy[2]), int(xy[3]))
        if fill is not None:
            cv2.rectangle(self.im, p1, p2, fill, -1)
        if outline is not None:
            cv2.rectangle(self.im, p1, p2, outline, width)

    def text(self, xy, text, txt_color=(255, 255, 255)):
        """Text with its top-left corner at ``xy``."""
        if self.pil:
            self.draw.text(tuple(xy), text, fill=txt_color, font=self.font)
            return
        (_, h), _ = cv2.getTextSize(text, 0, fontScale=self.lw / 3, thickness=self.tf)
        cv2.putText(self.im, text, (int(xy[0]), int(xy[1]) + h), 0, self.lw / 3, txt_color,
                    thickness=self.tf, lineType=cv2.LINE_AA)

    def result(self):
        """The annotated image as an HWC uint8 numpy array."""
        return np.asarray(self.im) if self.pil else self.im


def _new_figure(figsize):
    # imported here: matplotlib's figure machinery is a fifth of train.py's start-up, and most runs
    # (every DDP rank but one, every --noplots run) draw no figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, tight_layout=True)
    FigureCanvasAgg(fig)
    return fig


def _save_figure(fig, path, dpi=200):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)


def output_to_target(output, max_det=300):
    """NMS output (list of (n, 6) xyxy/conf/cls) -> (N, 7) [image_index, cls, x, y, w, h, conf] pixels."""
    rows = []
    for i, det in enumerate(output):
        det = det[:max_det].detach().cpu()
        box, conf, cls = det[:, :4], det[:, 4:5], det[:, 5:6]
        rows.append(torch.cat((torch.full_like(conf, i), cls, xyxy2xywh(box), conf), 1))
    return torch.cat(rows, 0).numpy() if rows else np.zeros((0, 7))


def _to_numpy(x):
    return x.detach().cpu().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def plot_images(images, targets, paths=None, fname="images.jpg", names=None, max_size=1920, max_subplots=16):
    """Write a mosaic of a batch with its boxes.

    ``images`` (bs, 3, h, w) RGB, uint8 or float 0..1; ``targets`` (n, 6) [image_index, cls, x, y, w, h]
    labels (xywh normalised, or pixels when any value exceeds 1) or (n, 7) predictions with a
    trailing confidence, drawn only when above 0.25. ``names`` maps class ids to names.
    """
    images, targets = _to_numpy(images), _to_numpy(targets)
    if images.size and images.max() <= 1:
        images = images * 255
    bs, _, h, w = images.shape
    bs = min(bs, max_subplots)
    ns = math.ceil(bs ** 0.5)  # tiles per side
    scale = min(1.0, max_size / (ns * max(h, w)))
    th, tw = math.ceil(h * scale), math.ceil(w * scale)
    mosaic = np.full((ns * th, ns * tw, 3), 255, dtype=np.uint8)
    for i in range(bs):
        x0, y0 = tw * (i % ns), th * (i // ns)
        tile = cv2.resize(images[i].transpose(1, 2, 0).astype(np.uint8), (tw, th))
        mosaic[y0:y0 + th, x0:x0 + tw] = tile

    annotator = Annotator(mosaic, line_width=max(round(tw / 200), 1), pil=True,
                          font_size=max(round(th / 30), 10))
    names = dict(enumerate(names)) if isinstance(names, (list, tuple)) else (names or {})
    for i in range(bs):
        x0, y0 = tw * (i % ns), th * (i // ns)
        annotator.rectangle((x0, y0, x0 + tw, y0 + th), outline=(255, 255, 255), width=2)
        if paths is not None and i < len(paths):
            annotator.text((x0 + 5, y0 + 5), Path(paths[i]).name[:40], txt_color=(220, 220, 220))
        _draw_tile_boxes(annotator, targets[targets[:, 0] == i], (x0, y0), (tw, th), scale, names)
    Path(fname).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(annotator.result()).save(fname)


def _draw_tile_boxes(annotator, rows, origin, tile_size, scale, names):
    """Boxes of one mosaic tile; ``rows`` (n, 6 or 7) as in :func:`plot_images`."""
    if not len(rows):
        return
    is_prediction = rows.shape[1] == 7
    boxes = xywh2xyxy(rows[:, 2:6])
    if boxes.max() <= 1.01:  # normalised
        boxes[:, [0, 2]] *= tile_size[0]
        boxes[:, [1, 3]] *= tile_size[1]
    else:
        boxes *= scale
    boxes[:, [0, 2]] += origin[0]
    boxes[:, [1, 3]] += origin[1]
    for row, box in zip(rows, boxes):
        cls = int(row[1])
        if is_prediction and row[6] <= 0.25:
            continue
        label = names.get(cls, str(cls))
        annotator.box_label(box, f"{label} {row[6]:.1f}" if is_prediction else label, color=colors(cls))


def plot_labels(labels, names=(), save_dir=Path("")):
    """Write labels.jpg: class histogram, box centres, box widths/heights, and box shapes.

    ``labels`` (n, 5) [cls, x, y, w, h] normalised, all labels of a data set.
    """
    labels = _to_numpy(labels).reshape(-1, 5)
    cls, boxes = labels[:, 0].astype(int), labels[:, 1:]
    nc = int(cls.max()) + 1 if len(cls) else max(len(names), 1)
    fig = _new_figure((8, 8))
    ax = fig.subplots(2, 2).ravel()

    counts = np.bincount(cls, minlength=nc)
    ax[0].bar(range(nc), counts, color=[np.array(colors(i)) / 255 for i in range(nc)])
    ax[0].set_ylabel("instances")
    if 0 < len(names) <= 30:
        ax[0].set_xticks(range(len(names)), labels=list(names), rotation=90, fontsize=8)
    else:
        ax[0].set_xlabel("classes")

    ax[1].hist2d(boxes[:, 0], boxes[:, 1], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    ax[1].set_xlabel("x")
    ax[1].set_ylabel("y")
    ax[2].hist2d(boxes[:, 2], boxes[:, 3], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    ax[2].set_xlabel("width")
    ax[2].set_ylabel("height")

    canvas = np.full((500, 500, 3), 255, dtype=np.uint8)
    shapes = xywh2xyxy(np.column_stack((np.full((len(boxes), 2), 0.5), boxes[:, 2:4]))) * 500
    annotator = Annotator(canvas, line_width=1)
    for c, box in zip(cls[:1000], shapes[:1000]):
        annotator.box_label(box, color=colors(c))
    ax[3].imshow(annotator.result())
    ax[3].axis("off")
    _save_figure(fig, Path(save_dir) / "labels.jpg")


def results_panels(data) -> list:
    """The panels of results.png as ``[(title, [(curve label, column)])]`` for a results.csv DataFrame.

    One panel per YOLOv5 column; the size-band columns share one panel per band family (COCO, AI-TOD),
    drawn only for bands with at least one value (a band without labels is NaN throughout).
    """
    band_of = {column: band for column, band in zip(BAND_COLUMNS, SIZE_BANDS)}
    panels, families = [], {}
    for name in data.columns[1:]:
        band = band_of.get(name)
        if band is None:
            panels.append((name, [("results", name)]))
        elif data[name].notna().any():
            families.setdefault(band.family, []).append((band.label, name))
    return panels + [(f"mAP50-95 by object size ({family}, px)", curves) for family, curves in families.items()]


def plot_results(file="results.csv", dir=""):
    """Write results.png beside ``file`` (or in ``dir``): each results.csv column against epoch, the
    size-band mAPs one panel per band family (see :func:`results_panels`)."""
    import pandas as pd

    file = Path(dir) / "results.csv" if dir else Path(file)
    if not file.is_file():
        raise UserError(f"{file}: results file not found; pass the results.csv written by train.py")
    data = pd.read_csv(file)
    data.columns = [c.strip() for c in data.columns]
    if data.shape[1] < 2 or not len(data):
        raise UserError(f"{file}: needs an epoch column, at least one metric column and one row")
    x = data.iloc[:, 0].to_numpy()
    panels = results_panels(data)
    n_cols = min(5, len(panels))
    n_rows = math.ceil(len(panels) / n_cols)
    fig = _new_figure((3 * n_cols, 2.5 * n_rows))
    axes = np.atleast_1d(fig.subplots(n_rows, n_cols)).ravel()
    for ax, (title, curves) in zip(axes, panels):
        for label, name in curves:
            y = data[name].to_numpy(dtype=float)
            ax.plot(x, y, marker=".", linewidth=2, markersize=6, label=label)
            if len(y) > 3 and len(curves) == 1:
                ax.plot(x, smooth(y, 0.1), ":", label="smooth", linewidth=2)
        if len(curves) > 1:
            ax.legend(fontsize=6)
        ax.set_title(title, fontsize=10)
    for ax in axes[len(panels):]:
        ax.axis("off")
    axes[0].legend()
    _save_figure(fig, file.with_name("results.png"))


def plot_band_pr(curves: dict, save_path, bands=SIZE_BANDS) -> None:
    """Precision-recall at IoU 0.5 per size band: ``curves`` {band key: precision (101,) or None} from
    :meth:`utils.size_metrics.SizeBandStats.pr_curves`; one panel per band family, empty bands left out."""
    families = list(dict.fromkeys(b.family for b in bands))
    fig = _new_figure((6 * len(families), 5))
    axes = np.atleast_1d(fig.subplots(1, len(families)))
    for ax, family in zip(axes, families):
        for band in (b for b in bands if b.family == family and curves.get(b.key) is not None):
            precision = curves[band.key]
            ax.plot(RECALL_POINTS, precision, linewidth=2, label=f"{band.label} {precision.mean():.3f} mAP@0.5")
        ax.set(xlabel="Recall", ylabel="Precision", xlim=(0, 1), ylim=(0, 1),
               title=f"Precision-Recall by object size ({family}, px)")
        if ax.get_lines():
            ax.legend(loc="lower left", fontsize=8)
    _save_figure(fig, save_path, dpi=150)


def plot_pr_curve(px, py, ap, save_path, names=()):
    """Precision-recall curves: ``px`` (k,) recall, ``py`` list of (k,) precision per class, ``ap`` (nc, T)."""
    fig = _new_figure((9, 6))
    ax = fig.subplots()
    py = np.stack(py, 1) if len(py) else np.zeros((len(px), 0))
    for i, y in enumerate(py.T):
        label = f"{names[i]} {ap[i, 0]:.3f}" if len(names) < 21 else None
        ax.plot(px, y, linewidth=1, label=label)
    if py.shape[1]:
        ax.plot(px, py.mean(1), linewidth=3, color="blue", label=f"all classes {ap[:, 0].mean():.3f} mAP@0.5")
    ax.set_xlabel("Recall")
    ax.set_ylabel("Precision")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
    ax.set_title("Precision-Recall Curve")
    _save_figure(fig, save_path, dpi=150)


def plot_ap_curves(curves, save_dir, prefix: str = "") -> None:
    """Write PR, F1, P and R curves from ``utils.metrics.APCurves`` to ``save_dir``."""
    save_dir = Path(save_dir)
    plot_pr_curve(curves.recall_points, curves.pr, curves.ap, save_dir / f"{prefix}PR_curve.png", curves.names)
    for values, ylabel, name in ((curves.f1, "F1", "F1"), (curves.precision, "Precision", "P"),
                                 (curves.recall, "Recall", "R")):
        plot_mc_curve(curves.confidence, values, save_dir / f"{prefix}{name}_curve.png", curves.names, ylabel=ylabel)


def plot_mc_curve(px, py, save_path, names=(), xlabel="Confidence", ylabel="Metric"):
    """Metric-confidence curves: ``px`` (k,) confidence, ``py`` (nc, k) metric per class."""
    fig = _new_figure((9, 6))
    ax = fig.subplots()
    for i, y in enumerate(py):
        ax.plot(px, y, linewidth=1, label=names[i] if len(names) < 21 else None)
    if len(py):
        mean = smooth(py.mean(0), 0.05)
        ax.plot(px, mean, linewidth=3, color="blue",
                label=f"all classes {mean.max():.2f} at {px[mean.argmax()]:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left")
    ax.set_title(f"{ylabel}-Confidence Curve")
    _save_figure(fig, save_path, dpi=150)


def plot_confusion_matrix(matrix, names, save_path, normalize=True):
    """Heat map of a (nc + 1, nc + 1) confusion matrix (rows predicted, columns true, last background)."""
    matrix = np.asarray(matrix, dtype=float)
    if normalize:
        matrix = matrix / (matrix.sum(0, keepdims=True) + 1e-9)
    n = matrix.shape[0]
    labels = (list(names) + ["background"]) if len(names) == n - 1 else [str(i) for i in range(n - 1)] + ["background"]
    fig = _new_figure((12, 9))
    ax = fig.subplots()
    shown = np.where(matrix < 0.005, np.nan, matrix) if normalize else matrix
    image = ax.imshow(shown, cmap="Blues", vmin=0.0)
    fig.colorbar(image, ax=ax)
    if n < 30:
        ax.set_xticks(range(n), labels=labels, rotation=90, fontsize=8)
        ax.set_yticks(range(n), labels=labels, fontsize=8)
        for (i, j), v in np.ndenumerate(matrix):
            if v >= 0.005:
                ax.text(j, i, f"{v:.2f}" if normalize else f"{v:.0f}", ha="center", va="center", fontsize=7)
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix")
    _save_figure(fig, save_path, dpi=150)


def save_one_box(xyxy, im, file=Path("im.jpg"), gain=1.02, pad=10, square=False, save=True):
    """Crop xyxy box (4,) from HWC image ``im``, enlarged by ``gain`` and ``pad`` pixels; optionally save it.

    Returns the crop (h, w, 3).
    """
    box = xyxy2xywh(torch.as_tensor(xyxy, dtype=torch.float32).view(-1, 4))
    if square:
        box[:, 2:] = box[:, 2:].max(1, keepdim=True)[0]
    box[:, 2:] = box[:, 2:] * gain + pad
    box = clip_boxes(xywh2xyxy(box).long(), im.shape)
    x1, y1, x2, y2 = (int(v) for v in box[0])
    crop = im[y1:y2, x1:x2]
    if save:
        file = Path(file)
        file.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(file), crop)
    return crop


def plot_val_study(files, save_path):
    """Plot val.py --task study files (rows: size, P, R, mAP50, mAP50-95, 3 losses, 3 times in ms)
    as mAP50-95 against image size and against inference time per image."""
    fig = _new_figure((10, 4))
    by_size, by_time = fig.subplots(1, 2)
    for file in files:
        rows = np.atleast_2d(np.loadtxt(file))
        label = Path(file).stem.replace("study_", "")
        by_size.plot(rows[:, 0], rows[:, 4], ".-", linewidth=2, label=label)
        by_time.plot(rows[:, 9], rows[:, 4], ".-", linewidth=2, label=label)
    by_size.set_xlabel("image size (pixels)")
    by_time.set_xlabel("inference time per image (ms)")
    for ax in (by_size, by_time):
        ax.set_ylabel("mAP50-95")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    _save_figure(fig, save_path, dpi=150)
