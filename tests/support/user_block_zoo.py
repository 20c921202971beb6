"""A user's file of nine blocks of the kinds people add to YOLOv5, written as a user writes them.

Nothing here knows about the determinism policy: each block uses the plain ``torch.nn``,
``torch.nn.functional`` and ``torchvision.ops`` calls, and is registered with
``models.yolo.register_module`` so a model YAML row ``[-1, 1, CBAM, []]`` uses it (``--modules
tests/support/user_block_zoo.py`` on the command line). Every block maps ``(B, C, H, W) -> (B, C, H, W)``
(the "same" style: the constructor takes the input channels first).

The CUDA backward of the pools, bicubic upsampling, ``grid_sample``, ``deform_conv2d`` and ``roi_align``
below has no deterministic kernel; the policy's twins replace them (docs/determinism.md, "Deterministic twins").
"""

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.ops

from models.yolo import register_module


@register_module(style="same", override=True)
class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: a global average pool gates the channels."""

    def __init__(self, c1: int, reduction: int = 2):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Conv2d(c1, max(c1 // reduction, 1), 1), nn.ReLU(),
                                nn.Conv2d(max(c1 // reduction, 1), c1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(self.pool(x)))


@register_module(style="same", override=True)
class CBAM(nn.Module):
    """CBAM: channel attention from global max and average pools, then spatial attention from a 7x7 conv."""

    def __init__(self, c1: int, reduction: int = 2):
        super().__init__()
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        hidden = max(c1 // reduction, 1)
        self.mlp = nn.Sequential(nn.Conv2d(c1, hidden, 1), nn.ReLU(), nn.Conv2d(hidden, c1, 1))
        self.spatial = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.sigmoid(self.mlp(self.max_pool(x)) + self.mlp(self.avg_pool(x)))
        descriptor = torch.cat((x.amax(1, keepdim=True), x.mean(1, keepdim=True)), 1)
        return x * torch.sigmoid(self.spatial(descriptor))


@register_module(style="same", override=True)
class CoordAttention(nn.Module):
    """Coordinate attention: pools along each axis, a shared 1x1 conv, then per-row and per-column gates."""

    def __init__(self, c1: int):
        super().__init__()
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))
        self.shared = nn.Sequential(nn.Conv2d(c1, c1, 1), nn.BatchNorm2d(c1), nn.Hardswish())
        self.gate_h = nn.Conv2d(c1, c1, 1)
        self.gate_w = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        rows = self.pool_h(x)  # (B, C, H, 1)
        columns = self.pool_w(x).permute(0, 1, 3, 2)  # (B, C, W, 1)
        rows, columns = self.shared(torch.cat((rows, columns), 2)).split((h, w), 2)
        return x * torch.sigmoid(self.gate_h(rows)) * torch.sigmoid(self.gate_w(columns.permute(0, 1, 3, 2)))


@register_module(style="same", override=True)
class PyramidPooling(nn.Module):
    """PSPNet's pyramid: average pools to 1, 2, 3 and 6 cells, each upsampled back bilinearly and fused."""

    def __init__(self, c1: int, bins: tuple = (1, 2, 3, 6)):
        super().__init__()
        self.stages = nn.ModuleList(nn.Sequential(nn.AdaptiveAvgPool2d(b), nn.Conv2d(c1, c1, 1)) for b in bins)
        self.fuse = nn.Conv2d(c1 * (len(bins) + 1), c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        levels = [F.interpolate(stage(x), size=size, mode="bilinear", align_corners=False) for stage in self.stages]
        return self.fuse(torch.cat([x, *levels], 1))


@register_module(style="same", override=True)
class MaxPyramid(nn.Module):
    """An SPP-like pyramid of adaptive max pools whose cells overlap (3, 5 and 7 cells do not divide 8 or 16)."""

    def __init__(self, c1: int, cells: tuple = (3, 5, 7)):
        super().__init__()
        self.pools = nn.ModuleList(nn.AdaptiveMaxPool2d(c) for c in cells)
        self.fuse = nn.Conv2d(c1 * (len(cells) + 1), c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        levels = [F.interpolate(pool(x), size=size, mode="nearest") for pool in self.pools]
        return self.fuse(torch.cat([x, *levels], 1))


@register_module(style="same", override=True)
class SpatialTransformer(nn.Module):
    """A spatial transformer: a small localisation net predicts an affine warp (starting at the identity)."""

    def __init__(self, c1: int):
        super().__init__()
        self.localise = nn.Sequential(nn.Conv2d(c1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten(), nn.Linear(4, 6))
        nn.init.zeros_(self.localise[-1].weight)
        with torch.no_grad():
            self.localise[-1].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1.0, 0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.localise(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@register_module(style="same", override=True)
class DeformableConv(nn.Module):
    """A modulated deformable 3x3 convolution (DCNv2): a conv predicts the offsets and the mask."""

    def __init__(self, c1: int):
        super().__init__()
        self.offset_mask = nn.Conv2d(c1, 27, 3, padding=1)
        nn.init.zeros_(self.offset_mask.weight)
        nn.init.zeros_(self.offset_mask.bias)
        self.deform = torchvision.ops.DeformConv2d(c1, c1, 3, padding=1)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset_x, offset_y, mask = self.offset_mask(x).chunk(3, 1)
        return self.act(self.deform(x, torch.cat((offset_x, offset_y), 1), torch.sigmoid(mask)))


@register_module(style="same", override=True)
class PooledBicubic(nn.Module):
    """Context from an adaptive average pool to 5x5 cells, brought back to the map with bicubic upsampling."""

    def __init__(self, c1: int, cells: int = 5):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(cells)
        self.conv = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = F.interpolate(self.conv(self.pool(x)), size=x.shape[-2:], mode="bicubic", align_corners=False)
        return x + context


@register_module(style="same", override=True)
class RegionContext(nn.Module):
    """RoIAlign on fixed boxes (the four quadrants and the centre of each map): their mean pooled features
    gate the channels of the whole map."""

    def __init__(self, c1: int, cells: int = 2):
        super().__init__()
        self.cells = cells
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        boxes = torch.tensor([[0, 0, w / 2, h / 2], [w / 2, 0, w, h / 2], [0, h / 2, w / 2, h], [w / 2, h / 2, w, h],
                              [w / 4, h / 4, 3 * w / 4, 3 * h / 4]], dtype=x.dtype, device=x.device)
        pooled = torchvision.ops.roi_align(x, [boxes] * len(x), self.cells, aligned=True)  # (5B, C, cells, cells)
        regions = pooled.mean((2, 3)).view(len(x), len(boxes), -1).mean(1)  # (B, C)
        return x * torch.sigmoid(self.fc(regions[..., None, None]))


ZOO = (SqueezeExcite, CBAM, CoordAttention, PyramidPooling, MaxPyramid, SpatialTransformer, DeformableConv,
       PooledBicubic, RegionContext)


def zoo_model_yaml(blocks=ZOO) -> str:
    """A small detector (Conv stages to strides 2, 4, 8, 16, 8 channels) with ``blocks`` inserted in turn
    after the stride-4 and stride-8 stages; Detect reads the last three stages."""
    rows = ["  [[-1, 1, Conv, [8, 3, 2]],", "   [-1, 1, Conv, [8, 3, 2]],"]
    names = [block.__name__ for block in blocks]
    half = (len(names) + 1) // 2
    rows += [f"   [-1, 1, {name}, []]," for name in names[:half]]
    p2 = len(rows) - 1
    rows.append("   [-1, 1, Conv, [8, 3, 2]],")
    rows += [f"   [-1, 1, {name}, []]," for name in names[half:]]
    p3 = len(rows) - 1
    rows.append("   [-1, 1, Conv, [8, 3, 2]]]")
    head = f"  [[[{p2}, {p3}, {len(rows) - 1}], 1, Detect, [nc, anchors]]]"
    return "\n".join(["nc: 2", "depth_multiple: 1.0", "width_multiple: 1.0", "anchors:",
                      "  - [4, 5, 8, 10, 12, 8]", "  - [16, 20, 24, 16, 20, 30]", "  - [32, 28, 40, 48, 56, 40]",
                      "backbone:", *rows, "head:", head, ""])


def write_zoo_model_yaml(folder: Path, blocks=ZOO, name: str = "zoo.yaml") -> Path:
    """Write :func:`zoo_model_yaml` to ``folder / name``; returns its path. The blocks are registered again
    first: a test that ran earlier in this process may have registered a block of the same name (an SE block)."""
    for block in blocks:
        register_module(block, style="same", override=True)
    path = Path(folder) / name
    path.write_text(zoo_model_yaml(blocks))
    return path
