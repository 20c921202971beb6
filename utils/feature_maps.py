"""Feature maps of a model's layers as pictures: ``detect.py --visualize``, YOLOv5's flag.

:func:`recorded_layer_outputs` hooks the layers for the forward passes inside a ``with`` block (the hooks
are removed after it, so nothing stays attached to the model); :func:`save_feature_maps` writes, per layer,
``stage{i}_{Type}_features.png`` (the first 32 channels side by side, 8 per row, each scaled to its own
range) and ``.npy`` (those channels as float32), YOLOv5's file names.
"""

import contextlib
import math
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

MAX_CHANNELS = 32
COLUMNS = 8
MIN_TILE = 64  # px: smaller maps are enlarged (nearest neighbour), so a stride-32 map stays readable
GAP = 2  # px between tiles


@contextlib.contextmanager
def recorded_layer_outputs(layers: nn.Sequential):
    """Yield ``{(index, type name): (bs, C, H, W) tensor}``, filled with each layer's output in the first
    forward pass inside the block (under test-time augmentation, the unscaled one). Layers whose output is not
    one 4-d tensor (Detect) are left out."""
    outputs = {}

    def hook_for(index: int):
        def keep(layer, _inputs, output):
            if isinstance(output, torch.Tensor) and output.ndim == 4:
                outputs.setdefault((index, type(layer).__name__), output.detach())
        return keep

    handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(layers)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def feature_grid(channels: np.ndarray) -> np.ndarray:
    """``(C, H, W)`` float -> a BGR uint8 picture of the channels in rows of :data:`COLUMNS`, each min-max scaled."""
    c, h, w = channels.shape
    lo = channels.min(axis=(1, 2), keepdims=True)
    span = channels.max(axis=(1, 2), keepdims=True) - lo
    tiles = np.where(span > 0, (channels - lo) / np.where(span > 0, span, 1) * 255, 0).astype(np.uint8)
    scale = max(1, math.ceil(MIN_TILE / max(h, w)))
    th, tw = h * scale, w * scale
    rows, cols = math.ceil(c / COLUMNS), min(c, COLUMNS)
    grid = np.zeros((rows * (th + GAP) - GAP, cols * (tw + GAP) - GAP), np.uint8)
    filled = np.zeros(grid.shape, bool)
    for k, tile in enumerate(tiles):
        r, col = divmod(k, COLUMNS)
        where = np.s_[r * (th + GAP):r * (th + GAP) + th, col * (tw + GAP):col * (tw + GAP) + tw]
        grid[where], filled[where] = tile.repeat(scale, axis=0).repeat(scale, axis=1), True
    picture = cv2.applyColorMap(grid, cv2.COLORMAP_VIRIDIS)
    picture[~filled] = 255  # white gaps and empty cells
    return picture


def save_feature_maps(outputs: dict, image_index: int, folder: Path) -> list[Path]:
    """Write the recorded maps of image ``image_index`` of the batch into ``folder``; returns the PNG paths.
    A write that fails raises OSError naming the file."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for (index, name), output in sorted(outputs.items()):
        channels = output[image_index, :MAX_CHANNELS].float().cpu().numpy()
        stem = folder / f"stage{index}_{name}_features"
        ok, png = cv2.imencode(".png", feature_grid(channels))
        if not ok:
            raise OSError(f"could not encode {stem}.png")
        stem.with_suffix(".png").write_bytes(png.tobytes())
        np.save(stem.with_suffix(".npy"), channels)
        written.append(stem.with_suffix(".png"))
    return written
