"""Attention and pyramid blocks of the kinds users add to YOLO models, built on ops with deterministic twins.

Each block maps ``(B, C, H, W) -> (B, C, H, W)`` and is registered with ``register_module(style="same")``
so a model YAML row ``[-1, 1, PoolAttention, []]`` uses it. Their CUDA backward passes are not
deterministic natively (adaptive max and average pooling, bicubic interpolation); with the twins routed
they audit clean.
"""

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.yolo import register_module


class PoolAttention(nn.Module):
    """CBAM's channel attention: shared 1x1 convolutions on the global max and average pools."""

    def __init__(self, c1: int):
        super().__init__()
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(self.max_pool(x)) + self.fc(self.avg_pool(x)))


class CoordinatePyramid(nn.Module):
    """Coordinate attention (``(None, 1)`` pools) plus an overlapping max-pool pyramid brought back by bicubic."""

    def __init__(self, c1: int):
        super().__init__()
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))
        self.pyramid = nn.AdaptiveMaxPool2d(3)  # 3 does not divide the map sizes here: windows overlap
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.fc(self.pool_h(x)) * self.fc(self.pool_w(x)))
        context = F.interpolate(self.pyramid(x), size=x.shape[-2:], mode="bicubic", align_corners=False)
        return x * gate + context


for _block in (PoolAttention, CoordinatePyramid):
    register_module(_block, style="same", override=True)

MODEL_YAML = """nc: 2
depth_multiple: 1.0
width_multiple: 1.0
anchors: 3
backbone:
  [[-1, 1, Conv, [8, 3, 2]],
   [-1, 1, Conv, [8, 3, 2]],
   [-1, 1, PoolAttention, []],
   [-1, 1, Conv, [8, 3, 2]],
   [-1, 1, CoordinatePyramid, []],
   [-1, 1, Conv, [8, 3, 2]]]
head:
  [[[2, 4, 5], 1, Detect, [nc, anchors]]]
"""


def write_twin_model_yaml(folder: Path) -> Path:
    """A 6-layer model YAML with PoolAttention as ``model.2`` and CoordinatePyramid as ``model.4``."""
    path = Path(folder) / "twin-blocks.yaml"
    path.write_text(MODEL_YAML)
    return path
