"""The twin table and the router that sends a native op's calls to its deterministic twin.

A :class:`Twin` names the aten ops whose audit findings it makes unnecessary (``resolves``) and its
routes: pairs ``(native callable, adapter)``. While :func:`routing` is active (a
``torch.overrides.TorchFunctionMode``, entered around the training forward), a call of a native
callable goes to its adapters in table order; an adapter returns the twin's result, or
:data:`NATIVE` to leave the call to the native function (a mode the twin does not cover).

What the mode sees, checked on torch 2.14 and torchvision 0.29: the ``torch.nn.functional`` Python
functions (``F.adaptive_max_pool2d`` is its ``boolean_dispatch`` wrapper, ``F.interpolate`` also
for ``nn.Upsample``), ``torch._C._nn`` builtins called directly, and torchvision's operators as the
``OpOverloadPacket`` (``torch.ops.torchvision.roi_align``: ``torchvision.ops.roi_align`` and
``RoIAlign`` call it, with the operator's own arguments; the Python wrappers themselves are not
seen). Inside a route the mode is off, so a twin's own ops and a native fallback are not routed.
A Python function the mode cannot see and that computes an op without calling it (torchvision's
``roi_align`` on CUDA under determinism) is a twin's ``patches`` entry: while the router is active
that module attribute is the twin's adapter, and it is put back on exit.

Adding a twin is one entry of :data:`TWINS`: ``Twin(name, resolves, same_signature(twin, *natives))``
for a twin with the native function's signature, or the routes of ``torchvision_routes.py``.
"""

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from utils.determinism.twins.interpolation import interpolate, sizes_and_scales, twinned
from utils.determinism.twins.pooling import (adaptive_avg_pool2d, adaptive_avg_pool3d, adaptive_max_pool2d,
                                             adaptive_max_pool3d)
from utils.determinism.twins.sampling import grid_sample
from utils.determinism.twins.torchvision_routes import (deform_conv2d_routes, roi_align_patches, roi_align_routes,
                                                       roi_pool_routes)
from utils.determinism.twins.vision_ops import deform_conv2d, roi_align, roi_pool

NATIVE = object()  # an adapter's answer: let the native function compute this call


@dataclass(frozen=True)
class Twin:
    """A deterministic twin: the audit findings it resolves and the calls it takes over."""

    name: str
    resolves: tuple  # aten op names (as audit findings name them) whose backward the twin replaces
    routes: tuple  # ((native callable, adapter(*args, **kwargs) -> result or NATIVE), ...)
    patches: tuple = ()  # ((module name, attribute, replacement), ...): Python functions the mode cannot see


def same_signature(twin, *natives) -> tuple:
    """Routes sending every call of each of ``natives`` to ``twin``, which has their signature."""
    return tuple((native, twin) for native in natives)


def _with_indices(twin):
    """Adapter for aten's ``adaptive_max_poolNd(input, output_size) -> (output, indices)``."""
    return lambda input, output_size: twin(input, output_size, return_indices=True)


def _max_pool_1d(always_indices: bool):
    """Adapter for a 1-D adaptive max pool ``(N, C, L)``: the 2-D twin on ``(N, C, 1, L)``, as aten computes it."""
    def pool(input, output_size, return_indices=False):
        size = output_size if isinstance(output_size, int) else output_size[0]
        if always_indices or return_indices:
            output, indices = adaptive_max_pool2d(input.unsqueeze(-2), (1, size), return_indices=True)
            return output.squeeze(-2), indices.squeeze(-2)
        return adaptive_max_pool2d(input.unsqueeze(-2), (1, size)).squeeze(-2)
    return pool


def _avg_pool_1d(input, output_size):
    """Twin of ``F.adaptive_avg_pool1d`` ``(N, C, L)``: the 2-D twin on ``(N, C, 1, L)``."""
    size = output_size if isinstance(output_size, int) else output_size[0]
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, size)).squeeze(-2)


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    if input.dim() != 4 or mode not in ("bilinear", "nearest"):  # 5-D and bicubic stay native (and stay flagged)
        return NATIVE
    return grid_sample(input, grid, mode, padding_mode, bool(align_corners))


def _area(twin, spatial: int):
    """Adapter for ``F.interpolate(mode='area')`` of ``spatial`` dimensions: an adaptive average pool."""
    def area(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
             recompute_scale_factor=None, antialias=False):
        if mode != "area" or input.dim() != spatial + 2 or antialias or (size is None) == (scale_factor is None):
            return NATIVE
        sizes, _ = sizes_and_scales(input, size, scale_factor, True)
        return twin(input, sizes)
    return area


def _interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    if not twinned(input, mode, antialias):
        return NATIVE
    return interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)


def _max_pool_routes(twin, dims: int) -> tuple:
    name = f"adaptive_max_pool{dims}d"
    return (same_signature(twin, getattr(F, name), getattr(F, f"{name}_with_indices"), getattr(F, f"_{name}"))
            + ((getattr(torch._C._nn, name), _with_indices(twin)),))


def _avg_pool_routes(twin, dims: int) -> tuple:
    name = f"adaptive_avg_pool{dims}d"
    return same_signature(twin, getattr(F, name), getattr(torch._C._nn, name)) + ((F.interpolate, _area(twin, dims)),)


TWINS = (
    Twin("adaptive_max_pool2d", ("adaptive_max_pool2d_backward",),
         _max_pool_routes(adaptive_max_pool2d, 2)
         + same_signature(_max_pool_1d(False), F.adaptive_max_pool1d, F._adaptive_max_pool1d)
         + same_signature(_max_pool_1d(True), F.adaptive_max_pool1d_with_indices, torch.adaptive_max_pool1d)),
    Twin("adaptive_max_pool3d", ("adaptive_max_pool3d_backward",), _max_pool_routes(adaptive_max_pool3d, 3)),
    Twin("adaptive_avg_pool2d", ("_adaptive_avg_pool2d_backward",),
         _avg_pool_routes(adaptive_avg_pool2d, 2)
         + same_signature(_avg_pool_1d, F.adaptive_avg_pool1d) + ((F.interpolate, _area(_avg_pool_1d, 1)),)),
    Twin("adaptive_avg_pool3d", ("_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward"),
         _avg_pool_routes(adaptive_avg_pool3d, 3)),
    Twin("interpolate", ("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
                         "upsample_trilinear3d_backward", "_upsample_bilinear2d_aa_backward",
                         "_upsample_bicubic2d_aa_backward"),
         ((F.interpolate, _interpolate),)),
    Twin("grid_sample", ("grid_sampler_2d_backward", "cudnn_grid_sampler_backward"),
         ((F.grid_sample, _grid_sample),)),
    Twin("deform_conv2d", ("torchvision::_deform_conv2d_backward",),
         deform_conv2d_routes(deform_conv2d)),
    Twin("roi_align", ("torchvision::_roi_align_backward",), roi_align_routes(roi_align),
         roi_align_patches(roi_align)),
    Twin("roi_pool", ("torchvision::_roi_pool_backward",), roi_pool_routes(roi_pool)),
)


def twin_named(name: str) -> Twin:
    """The table's twin called ``name`` (KeyError if none)."""
    return {twin.name: twin for twin in TWINS}[name]


def twins_resolving(ops) -> tuple:
    """The twins (table order) that resolve any of the aten op names ``ops``."""
    wanted = set(ops)
    return tuple(twin for twin in TWINS if wanted & set(twin.resolves))


class TwinRouter(TorchFunctionMode):
    """Sends calls of the native callables of ``twins`` to their adapters (see the module docstring)."""

    def __init__(self, twins):
        super().__init__()
        self.routes: dict = {}
        for twin in twins:
            for native, adapter in twin.routes:
                self.routes.setdefault(native, []).append(adapter)
        self.patches = [patch for twin in twins for patch in twin.patches]
        self.originals: list = []

    def __enter__(self):
        # A module nobody imported has no caller to redirect, and importing it here would load its package
        # (torchvision) into every training process.
        present = [(sys.modules[module_name], name, replacement) for module_name, name, replacement in self.patches
                   if hasattr(sys.modules.get(module_name), name)]
        self.originals = [(module, name, getattr(module, name)) for module, name, _ in present]
        for module, name, replacement in present:
            setattr(module, name, replacement)
        return super().__enter__()

    def __exit__(self, *exc_info):
        try:
            return super().__exit__(*exc_info)
        finally:
            for module, name, original in reversed(self.originals):
                setattr(module, name, original)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for adapter in self.routes.get(func, ()):
            result = adapter(*args, **kwargs)
            if result is not NATIVE:
                return result
        return func(*args, **kwargs)


def routing(twins) -> TwinRouter:
    """A context manager routing the native calls of ``twins`` (a sequence of :class:`Twin`) to them."""
    return TwinRouter(twins)
