"""Deterministic twin of ``F.interpolate`` for the linear family, bicubic, and the antialiased modes.

Each of these modes is separable: the output is the input with one interpolation matrix
(``out x in``) applied along each spatial dimension, so the twin is one matmul per dimension and
its backward is the transposed matmul, where aten's CUDA backward kernels accumulate with atomics.
The matrices are built on the CPU, as aten's CPU kernels compute their indices and weights, in the
kernels' arithmetic type (``float32`` for float and half input, ``float64`` for double):

- ``linear`` / ``bilinear`` / ``trilinear``: two taps, ``src = scale * (dst + 0.5) - 0.5`` clamped at 0
  (``align_corners=False``) or ``src = scale * dst``; an unchanged size is the identity;
- ``bicubic``: four taps of Keys' kernel (``A = -0.75``), the source index not clamped, taps beyond the
  border read the border;
- ``antialias=True`` (``bilinear``, ``bicubic``): the filter (triangle, or cubic with ``a = -0.5``) is
  widened by the scale when downsampling, and each row is normalised to sum 1 over the input.

``scale`` is ``1 / scale_factor`` when a scale factor reaches the kernel (``recompute_scale_factor``
not True), else ``in / out``; with ``align_corners=True`` it is ``(in - 1) / (out - 1)``. Other modes
(``nearest``, ``nearest-exact``, ``area``) and invalid arguments go to the native function.
"""

import functools
import math

import torch
import torch.nn.functional as F

from utils.determinism.twins.pooling import along

LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}  # mode -> spatial dimensions
CUBIC_A = -0.75  # aten's bicubic (as TensorFlow's)
CUBIC_AA_A = -0.5  # aten's antialiased bicubic (as PIL's)


def twinned(input: torch.Tensor, mode: str, antialias: bool) -> bool:
    """Whether the twin computes this call (otherwise the native function does)."""
    spatial = input.dim() - 2
    if antialias:
        return mode in ("bilinear", "bicubic") and spatial == 2
    return LINEAR_MODES.get(mode) == spatial or (mode == "bicubic" and spatial == 2)


def _kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scale(in_size: int, out_size: int, align_corners: bool, scale_factor, dtype) -> torch.Tensor:
    """aten's ``area_pixel_compute_scale`` in the kernel's arithmetic type."""
    if align_corners:
        return torch.tensor((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0, dtype=dtype)
    if scale_factor is not None and scale_factor > 0:
        return torch.tensor(1.0 / scale_factor, dtype=dtype)
    return torch.tensor(in_size, dtype=dtype) / out_size


def _source_index(scale: torch.Tensor, out_size: int, align_corners: bool, cubic: bool) -> torch.Tensor:
    """aten's ``area_pixel_compute_source_index`` for every output index."""
    dst = torch.arange(out_size, dtype=scale.dtype)
    if align_corners:
        return scale * dst
    src = scale * (dst + 0.5) - 0.5
    return src if cubic else src.clamp(min=0)


def _linear_matrix(in_size, out_size, align_corners, scale_factor, dtype) -> torch.Tensor:
    if in_size == out_size:
        return torch.eye(in_size, dtype=dtype)
    src = _source_index(_scale(in_size, out_size, align_corners, scale_factor, dtype), out_size, align_corners, False)
    low = src.floor().long().clamp(max=in_size - 1)
    weight_high = (src - low).clamp(0, 1)
    high = (low + 1).clamp(max=in_size - 1)
    matrix = torch.zeros(out_size, in_size, dtype=dtype)
    rows = torch.arange(out_size)
    matrix.index_put_((rows, low), 1 - weight_high, accumulate=True)
    matrix.index_put_((rows, high), weight_high, accumulate=True)
    return matrix


def _cubic_weights(t: torch.Tensor, a: float) -> list:
    """Keys' kernel at distances ``t + 1, t, 1 - t, 2 - t`` (aten's ``get_cubic_upsample_coefficients``)."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _cubic_matrix(in_size, out_size, align_corners, scale_factor, dtype) -> torch.Tensor:
    src = _source_index(_scale(in_size, out_size, align_corners, scale_factor, dtype), out_size, align_corners, True)
    base = src.floor().long().clamp(max=in_size - 1)
    t = (src - base).clamp(0, 1)
    matrix = torch.zeros(out_size, in_size, dtype=dtype)
    rows = torch.arange(out_size)
    for tap, weight in enumerate(_cubic_weights(t, CUBIC_A)):
        matrix.index_put_((rows, (base - 1 + tap).clamp(0, in_size - 1)), weight, accumulate=True)
    return matrix


def _aa_filter(x: float, cubic: bool) -> float:
    x = abs(x)
    if not cubic:
        return 1.0 - x if x < 1.0 else 0.0
    a = CUBIC_AA_A
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    return (((x - 5) * x + 8) * x - 4) * a if x < 2.0 else 0.0


def _antialias_matrix(in_size, out_size, align_corners, scale_factor, dtype, cubic: bool) -> torch.Tensor:
    """aten's antialiased weights: the filter stretched by the scale when shrinking, rows normalised."""
    scale = float(_scale(in_size, out_size, align_corners, scale_factor, dtype))
    support = (2.0 if cubic else 1.0) * max(scale, 1.0)
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    matrix = torch.zeros(out_size, in_size, dtype=torch.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        weights = [_aa_filter((j - center + 0.5) * inverse, cubic) for j in range(first, last)]
        total = sum(weights)
        if weights:
            matrix[i, first:last] = torch.tensor(weights, dtype=torch.float64) / (total if total else 1.0)
    return matrix.to(dtype)


@functools.lru_cache(maxsize=256)
def interpolation_matrix(in_size: int, out_size: int, mode: str, align_corners: bool, scale_factor,
                         antialias: bool, dtype: torch.dtype) -> torch.Tensor:
    """``(out_size, in_size)`` weights of one spatial dimension, on the CPU, in ``dtype``."""
    kernel = _kernel_dtype(dtype)
    if antialias:
        matrix = _antialias_matrix(in_size, out_size, align_corners, scale_factor, kernel, mode == "bicubic")
    elif mode == "bicubic":
        matrix = _cubic_matrix(in_size, out_size, align_corners, scale_factor, kernel)
    else:
        matrix = _linear_matrix(in_size, out_size, align_corners, scale_factor, kernel)
    return matrix.to(dtype)


def sizes_and_scales(input: torch.Tensor, size, scale_factor, recompute_scale_factor) -> tuple:
    """``(output sizes, scale factors reaching the kernel or Nones)`` as ``F.interpolate`` resolves them."""
    spatial = input.dim() - 2
    if size is not None:
        sizes = [size] * spatial if isinstance(size, int) else list(size)
        return [int(s) for s in sizes], [None] * spatial
    factors = [scale_factor] * spatial if isinstance(scale_factor, (int, float)) else list(scale_factor)
    sizes = [math.floor(float(input.shape[2 + i]) * float(f)) for i, f in enumerate(factors)]
    return sizes, [None] * spatial if recompute_scale_factor else [float(f) for f in factors]


def _native_call(size, scale_factor, align_corners, recompute_scale_factor, spatial: int) -> bool:
    """Arguments the twin leaves to ``F.interpolate``, which raises its own error for them."""
    if (size is None) == (scale_factor is None) or (recompute_scale_factor and size is not None):
        return True
    for given in (size, scale_factor):
        if isinstance(given, (list, tuple)) and len(given) != spatial:
            return True
    return align_corners is not None and not isinstance(align_corners, bool)


def interpolate(input: torch.Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False) -> torch.Tensor:
    """Twin of ``F.interpolate`` (same signature): ``(N, C, *spatial)`` -> ``(N, C, *output sizes)``."""
    spatial = input.dim() - 2
    if not twinned(input, mode, antialias) or _native_call(size, scale_factor, align_corners,
                                                           recompute_scale_factor, spatial):
        return F.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    sizes, factors = sizes_and_scales(input, size, scale_factor, recompute_scale_factor)
    out = input
    for i, (out_size, factor) in enumerate(zip(sizes, factors)):
        dim = 2 + i
        matrix = interpolation_matrix(input.shape[dim], out_size, mode, bool(align_corners), factor, antialias,
                                      input.dtype)
        out = along(out, matrix.to(input.device), dim)
    return out
