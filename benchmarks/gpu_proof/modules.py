"""Model blocks the GPU proof trains: FFCA's SCAM as published (on ``nn.AdaptiveMaxPool2d``) and a CPU stand-in.

Importing this module registers both blocks (and the user block zoo of tests/support/user_block_zoo.py,
which the twin rows train) with the YAML parser, so a ``train.py`` subprocess
that imports it first (``python -c "import benchmarks.gpu_proof.modules, train; train.cli()" ARGS``, started
in the repository root) can train a model YAML that names them.

- ``UpstreamSCAM``: SCAM with ``nn.AdaptiveAvgPool2d(1)`` / ``nn.AdaptiveMaxPool2d(1)``, as in the
  authors' code; its ``adaptive_max_pool2d`` backward has no deterministic CUDA kernel.
- ``PutGradientSCAM``: the same block whose output gradient passes through ``Tensor.put_`` with
  ``accumulate=False``, which has no deterministic kernel on any device; it stands in for
  ``UpstreamSCAM`` on a CPU, where the adaptive pools are deterministic, so every SCAM check
  runs for real on a CPU too.
"""

from copy import deepcopy
from pathlib import Path

import torch
import torch.nn as nn

from models.ffca import SCAM
from models.yolo import register_module
from tests.support import user_block_zoo  # noqa: F401  (registers the zoo's blocks)
from utils.files import yaml_load, yaml_save


class PutGradientFunction(torch.autograd.Function):
    """Identity forward; backward rewrites the gradient through ``Tensor.put_(..., accumulate=False)``.

    ``put_`` without accumulation has no deterministic implementation on any device, so strict mode
    fails on a CPU exactly as ``adaptive_max_pool2d_backward_cuda`` fails on a GPU.
    """

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        flat_index = torch.arange(grad.numel(), device=grad.device)
        return grad.clone().put_(flat_index, grad.flatten(), accumulate=False)


class UpstreamSCAM(SCAM):
    """SCAM with the upstream global pools; ``(B, C, H, W) -> (B, C, H, W)``."""

    def __init__(self, c1: int):
        super().__init__(c1)
        self.avg_pool, self.max_pool = nn.AdaptiveAvgPool2d(1), nn.AdaptiveMaxPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        key = self.key(x).view(n, h * w, 1).softmax(1)
        value = self.value(x).view(n, c, h * w)
        context = torch.bmm(value, key).view(n, c, 1, 1)
        avg = self.avg_pool(x).view(n, c).softmax(1).view(n, 1, c)
        mx = self.max_pool(x).view(n, c).softmax(1).view(n, 1, c)
        maps = torch.cat((torch.bmm(avg, value), torch.bmm(mx, value)), 1).view(n, 2, h, w)
        return x + self.context_proj(context) * self.gate(maps).sigmoid()


class PutGradientSCAM(UpstreamSCAM):
    """``UpstreamSCAM`` whose backward also needs ``put_`` (non-deterministic on CPU and CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PutGradientFunction.apply(super().forward(x))


for _block in (UpstreamSCAM, PutGradientSCAM):
    register_module(_block, style="same", override=True)

# The op each block makes strict fail with, as the audit names it and as PyTorch's error names it.
FLAGGED_OPS = {"UpstreamSCAM": ("adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward_cuda"),
               "PutGradientSCAM": ("put_", "put_")}


def flagged_block(device_type: str) -> str:
    """The SCAM variant whose backward fails under strict on ``device_type`` ('cuda' or 'cpu')."""
    return "UpstreamSCAM" if device_type == "cuda" else "PutGradientSCAM"


def write_scam_variant(base_cfg: Path, block: str, folder: Path) -> Path:
    """Copy of the model YAML ``base_cfg`` with every ``SCAM`` row replaced by ``block``; returns its path."""
    cfg = deepcopy(yaml_load(base_cfg))
    replaced = 0
    for part in ("backbone", "head"):
        for row in cfg[part]:
            if row[2] == "SCAM":
                row[2] = block
                replaced += 1
    if not replaced:
        raise ValueError(f"{base_cfg}: no SCAM layer to replace")
    cfg.pop("yaml_file", None)
    path = Path(folder) / f"{Path(base_cfg).stem}-{block.lower()}.yaml"
    yaml_save(path, cfg)
    return path
