"""A model block whose backward calls ``Tensor.put_(..., accumulate=False)``.

That op has no deterministic implementation on any device, so under
``torch.use_deterministic_algorithms(True)`` it raises even on a CPU: the tests use it to
reproduce, on a laptop, what ``adaptive_max_pool2d_backward_cuda`` does on a GPU server.
"""

from pathlib import Path

import torch
import torch.nn as nn

from models.yolo import register_module


class _PutGradient(torch.autograd.Function):
    """Identity forward; backward rewrites the gradient through ``put_`` (non-deterministic op)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        flat_index = torch.arange(grad.numel(), device=grad.device)
        return grad.clone().put_(flat_index, grad.flatten(), accumulate=False)


class PutGradient(nn.Module):
    """``(B, C, H, W) -> (B, C, H, W)`` identity whose backward needs ``put_``.

    ``c1`` (input channels) is accepted so that model YAMLs can use the block.
    """

    def __init__(self, c1: int = 0):
        super().__init__()
        self.channels = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _PutGradient.apply(x)


register_module(PutGradient, style="same", override=True)

PUT_MODEL_YAML = """nc: 4
depth_multiple: 1.0
width_multiple: 1.0
anchors: 3
backbone:
  [[-1, 1, Conv, [8, 3, 2]],
   [-1, 1, Conv, [16, 3, 2]],
   [-1, 1, PutGradient, []],
   [-1, 1, Conv, [16, 3, 2]],
   [-1, 1, Conv, [16, 3, 2]]]
head:
  [[[2, 3, 4], 1, Detect, [nc, anchors]]]
"""


def write_put_model_yaml(folder: Path) -> Path:
    """Write the model YAML using PutGradient (layer 2) and return its path."""
    path = Path(folder) / "put-model.yaml"
    path.write_text(PUT_MODEL_YAML)
    return path
