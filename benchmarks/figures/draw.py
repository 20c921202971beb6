"""Drawing helpers shared by the pictures: figures without pyplot, boxes, captions, small PNGs."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import numpy as np

LIMIT_BYTES = 200_000  # every committed picture at most 200 KB, so the repository stays small
CLASS_COLOURS = ("#ffe119", "#00e5ff", "#ff7f00", "#ffffff", "#ff00ff", "#00ff00")  # bright on the shapes' backgrounds
COMMAND = "python -m benchmarks.figures"


def figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas (no pyplot state, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def trained(what: str, version: str) -> str:
    """The source sentence of a picture drawn from training runs, trained at project version ``version``."""
    return f"Trained: {what} (at version {version})."


def caption(fig, source: str, drawn_at: str) -> None:
    """Footer naming where the picture's data came from, the command that drew it and the project version."""
    text = f"{source} Made by `{COMMAND}` at version {drawn_at}."
    width = int(fig.get_figwidth() * 15)  # characters per line at fontsize 8
    fig.text(0.01, 0.0, textwrap.fill(text, width), ha="left", va="top", fontsize=8, color="0.3")


def save_png(fig, path: Path, dpis=(80, 72, 64), colours: int = 128) -> int:
    """Write ``fig`` as a PNG of ``colours`` palette entries at the first of ``dpis`` that keeps it within
    :data:`LIMIT_BYTES` (photos with sensor noise compress badly); ValueError if none does."""
    from PIL import Image

    for dpi in dpis:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.15, facecolor="white")
        rgb = Image.open(buffer).convert("RGB")
        out = io.BytesIO()
        # octree keeps the small saturated objects and box outlines in their colours; median cut merges them
        quantized = rgb.quantize(colours, Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
        quantized.save(out, format="PNG", optimize=True)
        if out.tell() <= LIMIT_BYTES:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(out.getvalue())
            return out.tell()
    raise ValueError(f"{path.name}: {out.tell()} bytes at {dpis[-1]} dpi, over the {LIMIT_BYTES}-byte limit")


def boxes(ax, xyxy: np.ndarray, classes: np.ndarray, pad: float = 2.0, width: float = 1.4) -> None:
    """Outline each box in its class colour, ``pad`` px outside it so the object itself stays visible."""
    from matplotlib.patches import Rectangle

    for (x1, y1, x2, y2), c in zip(xyxy, classes):
        ax.add_patch(Rectangle((x1 - pad, y1 - pad), x2 - x1 + 2 * pad, y2 - y1 + 2 * pad, fill=False,
                               edgecolor=CLASS_COLOURS[int(c) % len(CLASS_COLOURS)], linewidth=width))


def labels_xyxy(label_file: Path, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """A YOLO label file as ``(xyxy boxes in pixels, classes)``."""
    rows = np.loadtxt(label_file, ndmin=2) if label_file.stat().st_size else np.zeros((0, 5))
    cx, cy, w, h = rows[:, 1] * width, rows[:, 2] * height, rows[:, 3] * width, rows[:, 4] * height
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), rows[:, 0].astype(int)


def legend(fig, names) -> None:
    """One legend line of class colours at the top of the figure (``names``: a list or an index -> name dict)."""
    from matplotlib.patches import Patch

    handles = [Patch(edgecolor=CLASS_COLOURS[i % len(CLASS_COLOURS)], facecolor="none", label=n)
               for i, n in (names.items() if isinstance(names, dict) else enumerate(names))]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9, bbox_to_anchor=(0.5, 1.0),
               facecolor="0.35", labelcolor="white", edgecolor="none", framealpha=1.0)
