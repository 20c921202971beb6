"""FFCA-YOLO modules (Zhang et al., IEEE TGRS 2024): FEM, FFM, SCAM and C3_Faster.

Class names match FFCA-YOLO's published YAML files so they parse unchanged. Three deliberate
differences from the widely copied implementation (FFM rows with the ``authors`` argument keep the
first two, for checkpoints trained with the authors' code; see :class:`_WeightedConcat`):

* FFM multiplies weight ``c`` with channel ``c`` (the upstream ``.view(N, H, W, C)`` on an NCHW
  tensor scales the wrong elements);
* FFM normalises its per-channel weights to mean 1 (``C * w / sum(w)``), not to sum 1: with sum 1
  every channel is scaled by ``1/C`` (1/64 to 1/160 in FFCA-YOLO-n), which puts the next
  BatchNorm's input variance (~1e-5) far below its eps (1e-3), so that BatchNorm no longer
  normalises and its output starts at ~0.09 std (docs/research/). The relative channel weights,
  the parameters and their count are unchanged;
* SCAM's global pools use ``mean``/``amax`` over H, W, whose CUDA backward is deterministic,
  instead of ``nn.AdaptiveMaxPool2d``, which breaks ``torch.use_deterministic_algorithms(True)``.

Faster forward + backward with the same maths (same parameters and names; equal to the
module-by-module formula within float rounding, tests/test_models.py; measured with
benchmarks/speed/bench_modules.py): 1x1 Convs that read the same input (FEM's three branch heads and
shortcut, SCAM's key and value, C3_Faster's cv1 and cv2) run as one convolution and one BatchNorm
while training (:func:`shared_input_convs`); SCAM queries its value map once for both descriptors and adds the
gated context with ``baddbmm``; FasterBlock adds DropPath's output to the residual with ``addcmul``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from models.common import C3, Conv

FFM_ARITHMETICS = ("fixed", "authors")  # FFM_Concat2/3 weighting; see _WeightedConcat
# How FEM and SCAM initialise their residual branch (a YAML row argument). 'zero_last' zeroes the branch's
# last scale so the module starts as its shortcut (Goyal et al. 2017; timm's zero_init_last); 'published'
# keeps the authors'. SCAM defaults to 'zero_last': its published branch triples the backbone's gradient at
# the start. FEM defaults to 'published': its branch is already 0.1 of its shortcut, and a zeroed BatchNorm
# scale stays under 0.002 for 100 epochs, so its dilated branches would never be used (docs/research/).
BRANCH_INITS = ("zero_last", "published")


def _check_branch_init(module: str, init: str) -> None:
    if init not in BRANCH_INITS:
        raise ValueError(f"{module} init must be one of {BRANCH_INITS}, got {init!r}")


def global_avg_pool(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N, C)`` mean over H, W (equals ``nn.AdaptiveAvgPool2d(1)``)."""
    return x.mean(dim=(2, 3))


def global_max_pool(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N, C)`` max over H, W (equals ``nn.AdaptiveMaxPool2d(1)``, deterministic backward)."""
    return x.amax(dim=(2, 3))


def _shareable(convs: Sequence[Conv]) -> bool:
    """Whether ``convs`` are bias-free 1x1 stride-1 Convs whose BatchNorms train with equal settings.

    Training only: in eval mode every Conv runs as its own module, so per-module hooks (thop's FLOP
    count, layer profilers) see each convolution.
    """
    first = convs[0].bn
    if not isinstance(first, nn.BatchNorm2d) or not first.training:
        return False
    for m in convs:
        conv, bn = m.conv, m.bn
        geometry = (conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.groups)
        if geometry != ((1, 1), (1, 1), (0, 0), (1, 1), 1):
            return False
        if conv.bias is not None or not isinstance(bn, nn.BatchNorm2d) or not bn.affine or not bn.track_running_stats:
            return False
        if bn.momentum is None or (bn.training, bn.eps, bn.momentum) != (first.training, first.eps, first.momentum):
            return False
    return True


def _concatenated_batch_norm(bns: Sequence[nn.BatchNorm2d], y: torch.Tensor) -> torch.Tensor:
    """``y`` (N, sum C_k, H, W) normalised (training mode) channel block ``k`` by ``bns[k]``, in one
    call; each BatchNorm's running statistics and batch counter are updated as its own forward would."""
    mean = torch.cat([bn.running_mean for bn in bns])
    var = torch.cat([bn.running_var for bn in bns])
    weight = torch.cat([bn.weight for bn in bns])
    bias = torch.cat([bn.bias for bn in bns])
    first = bns[0]
    out = F.batch_norm(y, mean, var, weight, bias, True, first.momentum, first.eps)
    sizes = [bn.num_features for bn in bns]
    with torch.no_grad():
        for bn, m, v in zip(bns, mean.split(sizes), var.split(sizes)):
            bn.running_mean.copy_(m)
            bn.running_var.copy_(v)
            bn.num_batches_tracked.add_(1)
    return out


def shared_input_convs(convs: Sequence[Conv], x: torch.Tensor) -> list[torch.Tensor]:
    """``[m(x) for m in convs]``; training 1x1 Convs with BatchNorm run as one convolution and one BatchNorm.

    One wide 1x1 convolution reads ``x`` once and, in backward, gives ``x`` one gradient instead of
    a sum of ``len(convs)``; every output channel is the same dot product as in its own Conv.
    Anything else (eval mode, fused Convs, other kernels) runs module by module.
    """
    if not _shareable(convs):
        return [m(x) for m in convs]
    y = F.conv2d(x, torch.cat([m.conv.weight for m in convs]))
    y = _concatenated_batch_norm([m.bn for m in convs], y)
    return [m.act(part) for m, part in zip(convs, y.split([m.conv.out_channels for m in convs], 1))]


class FEM(nn.Module):
    """Feature Enhancement Module; ``(N, c1, H, W) -> (N, c2, H, W)``.

    Three branches on ``i = c1 // map_reduce`` channels (plain 3x3; 1x3/3x1 then dilated 3x3;
    3x1/1x3 then dilated 3x3), each ``2i`` wide, concatenated (``6i``) and projected to ``c2``;
    output ``ReLU(scale * projection + shortcut(x))``. Every conv is bias-free with BatchNorm,
    ReLU after all but the last conv of each branch. ``init='published'`` (default) is the authors';
    ``'zero_last'`` starts the projection's BatchNorm scale at 0, so FEM starts as ``ReLU(shortcut(x))``.
    """

    def __init__(self, c1: int, c2: int, scale: float = 0.1, map_reduce: int = 8, dilation: int = 5,
                 init: str = "published"):
        super().__init__()
        _check_branch_init("FEM", init)
        i = c1 // map_reduce
        if i < 2:
            raise ValueError(f"FEM needs at least {2 * map_reduce} input channels, got {c1}")
        mid = (i // 2) * 3
        self.scale = scale
        self.branch_a = nn.Sequential(
            Conv(c1, 2 * i, 1, act=nn.ReLU()),
            Conv(2 * i, 2 * i, 3, act=False),
        )
        self.branch_b = nn.Sequential(
            Conv(c1, i, 1, act=nn.ReLU()),
            Conv(i, mid, (1, 3), act=nn.ReLU()),
            Conv(mid, 2 * i, (3, 1), act=nn.ReLU()),
            Conv(2 * i, 2 * i, 3, d=dilation, act=False),
        )
        self.branch_c = nn.Sequential(
            Conv(c1, i, 1, act=nn.ReLU()),
            Conv(i, mid, (3, 1), act=nn.ReLU()),
            Conv(mid, 2 * i, (1, 3), act=nn.ReLU()),
            Conv(2 * i, 2 * i, 3, d=dilation, act=False),
        )
        self.project = Conv(6 * i, c2, 1, act=False)
        self.shortcut = Conv(c1, c2, 1, act=False)
        self.act = nn.ReLU(inplace=True)  # on the sum FEM itself made
        if init == "zero_last":
            nn.init.zeros_(self.project.bn.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = (self.branch_a[0], self.branch_b[0], self.branch_c[0], self.shortcut)
        a, b, c, shortcut = shared_input_convs(heads, x)
        branches = torch.cat((self.branch_a[1:](a), self.branch_b[1:](b), self.branch_c[1:](c)), 1)
        return self.act(torch.add(shortcut, self.project(branches), alpha=self.scale))


class _WeightedConcat(nn.Module):
    """Fast normalised fusion: one learnable weight per input channel, then channel concat.

    ``channels`` are the inputs' channel counts; inputs ``(N, C_k, H, W)`` -> ``(N, C, H, W)``,
    ``C = sum C_k``. ``arithmetic`` (a YAML row argument after ``dimension``, so checkpoints keep it):

    * ``'fixed'`` (default): channel ``c`` of the concatenation scaled by ``C * w[c] / (sum(w) + eps)``;
      the weights average 1, so at initialisation (all ``w`` equal) FFM is a plain concatenation;
    * ``'authors'``: FFCA-YOLO's own computation, for checkpoints trained with the authors' code
      (utils/foreign_checkpoint.py): weights ``w / (sum(w) + eps)`` (sum 1), and input ``k`` read as
      ``(N, H, W, C_k)`` in memory order, so flat element ``j`` of each image's ``C_k*H*W`` block is
      scaled by weight ``j mod C_k`` of that input.
    """

    n_inputs = 0

    def __init__(self, channels: Sequence[int], dimension: int = 1, arithmetic: str = "fixed", eps: float = 1e-4):
        super().__init__()
        channels = [int(c) for c in channels]
        if len(channels) != self.n_inputs:
            raise ValueError(f"{type(self).__name__} fuses {self.n_inputs} inputs, got {len(channels)}")
        if dimension != 1:
            raise ValueError(f"{type(self).__name__} weights channels, so dimension must be 1, got {dimension}")
        if arithmetic not in FFM_ARITHMETICS:
            raise ValueError(f"{type(self).__name__} arithmetic must be one of {FFM_ARITHMETICS}, got {arithmetic!r}")
        self.channels = channels
        self.arithmetic = arithmetic
        self.eps = eps
        self.w = nn.Parameter(torch.ones(sum(channels)))

    def normalised_weights(self) -> torch.Tensor:
        """``(C,)`` weights: ``'fixed'`` divided by their mean (sum / C, +eps / C), so they average 1;
        ``'authors'`` divided by their sum (+eps), so they sum to 1."""
        if self.arithmetic == "authors":
            return self.w / (self.w.sum() + self.eps)
        return self.w * self.w.numel() / (self.w.sum() + self.eps)

    def forward(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        got = [x.shape[1] for x in xs]
        if got != self.channels:
            raise ValueError(f"{type(self).__name__} built for channels {self.channels}, got {got}")
        weights = self.normalised_weights()
        if self.arithmetic == "authors":
            # (N, H*W, C_k) in logical NCHW order (the authors' .view on a contiguous tensor); any layout works
            return torch.cat([(x.reshape(x.shape[0], -1, x.shape[1]) * part).reshape(x.shape)
                              for x, part in zip(xs, weights.split(self.channels))], 1)
        return torch.cat(tuple(xs), 1) * weights.view(1, -1, 1, 1)


class FFM_Concat2(_WeightedConcat):  # noqa: N801 (name fixed by FFCA-YOLO's YAML files)
    """FFM fusion of two feature maps (see :class:`_WeightedConcat`)."""

    n_inputs = 2


class FFM_Concat3(_WeightedConcat):  # noqa: N801
    """FFM fusion of three feature maps (see :class:`_WeightedConcat`)."""

    n_inputs = 3


class SCAM(nn.Module):
    """Spatial Context-Aware Module; ``(N, C, H, W) -> (N, C, H, W)``.

    key = softmax over H*W of Conv(C->1); value = Conv(C->C); channel context = value @ key
    (a C-vector). Softmaxed global-average and global-max descriptors of the input, each applied
    to the value map, give two ``1 x H x W`` maps; gate = sigmoid(Conv(2->1)). Output
    ``x + SiLU(conv1x1(context)) * gate``. ``init='zero_last'`` (default) starts that 1x1 conv at 0
    (the branch has no BatchNorm to zero), so SCAM starts as the identity; ``'published'`` does not.
    """

    def __init__(self, c1: int, init: str = "zero_last"):
        super().__init__()
        _check_branch_init("SCAM", init)
        self.key = Conv(c1, 1, 1)
        self.value = Conv(c1, c1, 1)
        self.context_proj = nn.Sequential(nn.Conv2d(c1, c1, 1, bias=False), nn.SiLU())
        self.gate = Conv(2, 1, 1)
        if init == "zero_last":
            nn.init.zeros_(self.context_proj[0].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        key, value = shared_input_convs((self.key, self.value), x)
        key = key.reshape(n, h * w, 1).softmax(1)
        value = value.reshape(n, c, h * w)
        context = torch.bmm(value, key).view(n, c, 1, 1)
        # Both descriptors query the value map in one (n, 2, c) @ (n, c, hw) product: one pass over it.
        queries = torch.stack((global_avg_pool(x).softmax(1), global_max_pool(x).softmax(1)), 1)
        maps = torch.bmm(queries, value).view(n, 2, h, w)
        gate = self.gate(maps).sigmoid().view(n, 1, h * w)
        # x + context (n, c, 1) times gate (n, 1, hw): an outer product added to x in one kernel.
        return torch.baddbmm(x.reshape(n, c, h * w), self.context_proj(context).view(n, c, 1), gate).view(n, c, h, w)


class DropPath(nn.Module):
    """Stochastic depth: while training, zero whole samples with probability ``p`` and rescale."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return x * self._sample_mask(x) / (1.0 - self.p)

    def _sample_mask(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, 1, ..., 1)``: per sample 1 (kept, probability ``1 - p``) or 0 (dropped)."""
        return x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.p)

    def residual(self, shortcut: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``shortcut + self(x)``; while training one addcmul instead of three kernels (the
        ``mask / keep`` factor is rounded once, so this equals the sum within float rounding)."""
        if not self.training or self.p == 0.0:
            return shortcut + x
        return torch.addcmul(shortcut, x, self._sample_mask(x) / (1.0 - self.p))


class FasterBlock(nn.Module):
    """FasterNet block on ``c`` channels; shape kept.

    Partial 3x3 conv (bias-free) on the first ``c // n_div`` channels, the rest passing through,
    then Conv(c->2c, BN+SiLU), bias-free 1x1 conv 2c->c (no BN), DropPath, residual add.
    """

    def __init__(self, c: int, n_div: int = 4, mlp_ratio: int = 2, drop_path: float = 0.1):
        super().__init__()
        self.c_partial = c // n_div
        if self.c_partial < 1:
            raise ValueError(f"FasterBlock needs at least {n_div} channels, got {c}")
        self.partial_conv = nn.Conv2d(self.c_partial, self.c_partial, 3, 1, 1, bias=False)
        self.mlp = nn.Sequential(Conv(c, c * mlp_ratio, 1), nn.Conv2d(c * mlp_ratio, c, 1, bias=False))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed, rest = x.split([self.c_partial, x.shape[1] - self.c_partial], 1)
        mixed = torch.cat((self.partial_conv(mixed), rest), 1)
        return self.drop_path.residual(x, self.mlp(mixed))


class C3_Faster(C3):  # noqa: N801 (name fixed by FFCA-YOLO's YAML files)
    """C3 whose inner blocks are FasterNet blocks (always residual; ``shortcut`` is accepted
    so C3 rows such as ``[256, False]`` parse unchanged). ``(N, c1, H, W) -> (N, c2, H, W)``."""

    @staticmethod
    def _blocks(c_: int, n: int, shortcut: bool, g: int) -> nn.Sequential:
        return nn.Sequential(*(FasterBlock(c_) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner, bypass = shared_input_convs((self.cv1, self.cv2), x)
        return self.cv3(torch.cat((self.m(inner), bypass), 1))
