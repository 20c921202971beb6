"""Model blocks with non-deterministic ops, and tiny model YAMLs that use them.

``PutGradient``'s backward calls ``Tensor.put_(..., accumulate=False)``, which has no
deterministic implementation on any device: under ``torch.use_deterministic_algorithms(True)``
it raises even on a CPU, so the tests reproduce on a laptop what ``adaptive_max_pool2d_backward_cuda``
does on a GPU server. ``MaxPoolAttention`` is the CBAM / upstream-SCAM pattern itself
(``nn.AdaptiveMaxPool2d``), non-deterministic in its CUDA backward only.
"""

from pathlib import Path

import torch
import torch.nn as nn

from benchmarks.gpu_proof.modules import PutGradientFunction
from models.yolo import register_module


class PutGradient(nn.Module):
    """``(B, C, H, W) -> (B, C, H, W)`` identity whose backward needs ``put_``.

    ``c1`` (input channels) is accepted so that model YAMLs can use the block.
    """

    def __init__(self, c1: int = 0):
        super().__init__()
        self.channels = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PutGradientFunction.apply(x)


class MaxPoolAttention(nn.Module):
    """CBAM-style channel attention on ``nn.AdaptiveMaxPool2d``; ``(B, C, H, W) -> (B, C, H, W)``."""

    def __init__(self, c1: int):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(self.pool(x)))


for _block in (PutGradient, MaxPoolAttention):
    register_module(_block, style="same", override=True)

MODEL_YAML = """nc: {nc}
depth_multiple: 1.0
width_multiple: 1.0
anchors: 3
backbone:
  [[-1, 1, Conv, [8, 3, 2]],
   [-1, 1, Conv, [{width}, 3, 2]],
   [-1, 1, {block}, []],
   [-1, 1, Conv, [{width}, 3, 2]],
   [-1, 1, Conv, [{width}, 3, 2]]]
head:
  [[[2, 3, 4], 1, Detect, [nc, anchors]]]
"""


def write_model_yaml(folder: Path, block: str, nc: int = 4, width: int = 16) -> Path:
    """Write a 5-layer model YAML with ``block`` as layer 2 (``model.2``) and return its path."""
    path = Path(folder) / f"{block.lower()}-model.yaml"
    path.write_text(MODEL_YAML.format(nc=nc, width=width, block=block))
    return path


def write_put_model_yaml(folder: Path) -> Path:
    """The model YAML with PutGradient as layer 2."""
    return write_model_yaml(folder, "PutGradient")
