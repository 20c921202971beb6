"""The op table: aten ops PyTorch raises for under ``torch.use_deterministic_algorithms(True)``, per device and torch.

Each row says where the op raises and for which torch releases (``since`` / ``until``, with the
change that moved the bound). :func:`match_nondeterministic` answers for one aten call and one
torch release, so the GPU proof can predict a GPU with another torch than the one installed.

Sources per release (:data:`VERIFIED_TORCH`): the docstring of ``torch.use_deterministic_algorithms``,
``torch/nn/functional.py`` (its Python branches for non-CPU tensors) and, where the wheel is a
CUDA build, the ``alertNotDeterministic`` strings in ``torch/lib/libtorch_cuda.so``. What a
Python branch decides (e.g. ``F.interpolate``'s decomposition of bilinear and trilinear on
non-CPU tensors under determinism, since torch 2.5) is not a row: the audit sees it by tracing
with CUDA's branches (``utils/determinism/cuda_trace.py``). :data:`SILENT_OPS` are CUDA kernels
that are not deterministic and raise nothing: torch has no alert for them, the audit does.

torchvision's detection ops have rows of their own (:data:`TORCHVISION_OPS`, bounded by torchvision
releases, checked against :data:`VERIFIED_TORCHVISION`), and :data:`TORCHVISION_CLEAN` names its ops
known to be deterministic. An op of any other namespace (a user's ``torch.library`` op, another
package's) is not in the table: :func:`known_op` says so, and the audit reports it as not verified.
"""

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from utils.torchvision_ops import version as torchvision_version

CUDA_ONLY = ("cuda",)
CPU_AND_CUDA = ("cpu", "cuda")

# Releases the table was checked against, and what was read for each.
VERIFIED_TORCH = {
    "2.9": "docstring, functional.py and libtorch_cuda.so of the 2.9.0 wheel",
    "2.11": "docstring, functional.py and libtorch_cuda.so of the 2.11.0 wheel",
    "2.13": "docstring and functional.py of the 2.13.0 CPU wheel (it has no libtorch_cuda.so)",
    "2.14": "docstring, functional.py and libtorch_cuda.so of 2.14.1+cu130",
}


def release(version: str) -> tuple[int, int]:
    """``'2.11.0+cu130'`` or ``'2.11'`` -> ``(2, 11)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def release_name(version: str) -> str:
    """``'2.11.0+cu130'`` -> ``'2.11'``."""
    return "%d.%d" % release(version)


def verified(version: str) -> bool:
    """True when the table was checked against ``version``'s release."""
    return release_name(version) in VERIFIED_TORCH


def _argument_is(name: str, expected) -> Callable[[str, dict], bool]:
    """Condition: the op's argument ``name`` equals ``expected``."""
    return lambda overload, arguments: arguments.get(name) == expected


def _floating_input(overload: str, arguments: dict) -> bool:
    """Condition: the op's ``self`` tensor is floating point."""
    tensor = arguments.get("self")
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point()


def _integer_input(overload: str, arguments: dict) -> bool:
    tensor = arguments.get("self")
    return isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()


@dataclass(frozen=True)
class NondeterministicOp:
    """One row of the op table: aten ops that throw under determinism.

    ``doc_names`` are the names used in ``torch.use_deterministic_algorithms.__doc__``'s
    "will throw a RuntimeError" list; ``aten`` the overload packets the audit sees at dispatch
    (backward kernels for "when attempting to differentiate"); ``devices`` where it throws;
    ``applies(overload, arguments)`` narrows argument-dependent rows (None: always).
    ``kernel`` is set only for rows torch raises for but does not document: the ATen kernel
    whose ``alertNotDeterministic`` call is the source; for a ``silent`` row (no alert: the op
    runs under determinism and its result varies) the kernel and why. ``since`` / ``until`` bound the torch
    releases the row holds for (``until`` is the first release where it no longer does; empty:
    no bound), ``change`` names what moved the bound.
    """

    doc_names: tuple
    aten: tuple
    devices: tuple
    condition: str = ""
    applies: Callable[[str, dict], bool] | None = None
    kernel: str = ""
    since: str = ""
    until: str = ""
    change: str = ""
    silent: bool = False
    namespace: str = "aten"  # a torchvision row's since / until are torchvision releases
    alert: str = ""  # the name torch's alert message gives, where it is not the op's (torchvision's)

    @property
    def reason(self) -> str:
        """Human-readable source of the row, e.g. ``torch.Tensor.put_ with accumulate=False``."""
        text = " / ".join(self.doc_names) + (f" with {self.condition}" if self.condition else "")
        if self.silent:
            return f"{text} (silent: no alert; {self.kernel})"
        return text + (f" (undocumented; raised by {self.kernel})" if self.kernel else "")

    @property
    def versions(self) -> str:
        """``'torch < 2.10 (pytorch#165762)'``, or ``'every torch'`` for an unbounded row."""
        bounds = [f">= {self.since}" if self.since else "", f"< {self.until}" if self.until else ""]
        text = " and ".join(b for b in bounds if b)
        package = "torch" if self.namespace == "aten" else self.namespace
        return f"{package} {text} ({self.change})" if text else f"every {package}"

    def holds_for(self, version: str) -> bool:
        """True when the row holds for torch ``version`` (e.g. ``'2.9.0'``)."""
        wanted = release(version)
        return (not self.since or release(self.since) <= wanted) and (not self.until or wanted < release(self.until))


# Built from torch.use_deterministic_algorithms.__doc__ of the releases in VERIFIED_TORCH;
# tests/test_determinism.py cross-checks the rows holding for the installed torch against its
# docstring in both directions. Ops torch documents as switching to a deterministic algorithm
# (index_add, scatter_add_, ...) are not failures and are not listed.
DOCUMENTED_OPS = (
    NondeterministicOp(("torch.nn.AvgPool3d",), ("avg_pool3d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.AdaptiveAvgPool2d",), ("_adaptive_avg_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.AdaptiveAvgPool3d",),
                       ("_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward"), CUDA_ONLY),
    NondeterministicOp(("torch.nn.MaxPool3d",), ("max_pool3d_with_indices_backward",), CUDA_ONLY,
                       until="2.13", change="documented through 2.11, no longer in 2.13's documentation"),
    NondeterministicOp(("torch.nn.AdaptiveMaxPool2d",), ("adaptive_max_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.FractionalMaxPool2d",), ("fractional_max_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.FractionalMaxPool3d",), ("fractional_max_pool3d_backward",), CUDA_ONLY),
    # MaxUnpool1d runs on the 2-D kernel; unpooling throws on every device, forward included.
    NondeterministicOp(("torch.nn.MaxUnpool1d", "torch.nn.MaxUnpool2d"), ("max_unpool2d",), CPU_AND_CUDA),
    NondeterministicOp(("torch.nn.MaxUnpool3d",), ("max_unpool3d",), CPU_AND_CUDA),
    # The aten kernels of all four modes alert on CUDA, but F.interpolate reaches the bilinear and
    # trilinear ones only on a CPU: under determinism a non-CPU input takes a decomposition whose
    # backward is a deterministic index_put_ (torch >= 2.5), which a non-CPU trace sees.
    NondeterministicOp(("torch.nn.functional.interpolate",),
                       ("upsample_linear1d_backward", "upsample_bilinear2d_backward",
                        "upsample_bicubic2d_backward", "upsample_trilinear3d_backward"),
                       CUDA_ONLY, "mode linear or bicubic (bilinear and trilinear: the native kernel only)"),
    NondeterministicOp(("torch.nn.ReflectionPad1d", "torch.nn.ReflectionPad2d", "torch.nn.ReflectionPad3d"),
                       ("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward"),
                       CUDA_ONLY),
    # Only the image-shaped (2-D target) NLL kernel accumulates with atomics, and only when it
    # reduces: nll_loss2d_forward_out_cuda_template alerts for reduction != 'none' (aten's 0).
    NondeterministicOp(("torch.nn.NLLLoss",), ("nll_loss2d_forward",), CUDA_ONLY, "reduction 'mean' or 'sum'",
                       lambda overload, arguments: arguments.get("reduction") != 0),
    NondeterministicOp(("torch.nn.CTCLoss",), ("_ctc_loss_backward",), CUDA_ONLY),
    # aten encodes EmbeddingBag's mode as an int: 0 sum, 1 mean, 2 max.
    NondeterministicOp(("torch.nn.EmbeddingBag",), ("_embedding_bag_backward", "_embedding_bag_dense_backward"),
                       CUDA_ONLY, "mode='max'", _argument_is("mode", 2)),
    NondeterministicOp(("torch.Tensor.put_",), ("put_", "put"), CPU_AND_CUDA, "accumulate=False",
                       _argument_is("accumulate", False)),
    NondeterministicOp(("torch.Tensor.put_",), ("put_", "put"), CUDA_ONLY, "accumulate=True",
                       _argument_is("accumulate", True)),
    # _histc_cuda alerts for floating-point input only since pytorch#151701; before, for every dtype.
    NondeterministicOp(("torch.histc",), ("histc",), CUDA_ONLY, "floating-point input", _floating_input),
    NondeterministicOp(("torch.histc",), ("histc",), CUDA_ONLY, "integer input", _integer_input,
                       until="2.8", change="pytorch#151701"),
    NondeterministicOp(("torch.bincount",), ("bincount",), CUDA_ONLY, "weights",
                       lambda overload, arguments: arguments.get("weights") is not None),
    # 2.9's libtorch_cuda.so holds the "kthvalue CUDA" alert, 2.11's does not.
    NondeterministicOp(("torch.kthvalue",), ("kthvalue",), CUDA_ONLY, until="2.10", change="pytorch#165762"),
    # nanmedian shares median's CUDA kernel for the indices output; the plain overload has none.
    NondeterministicOp(("torch.median",), ("median", "nanmedian"), CUDA_ONLY, "indices output",
                       lambda overload, arguments: overload != "default"),
    NondeterministicOp(("torch.nn.functional.grid_sample",),
                       ("grid_sampler_2d_backward", "grid_sampler_3d_backward"), CUDA_ONLY),
    NondeterministicOp(("torch.Tensor.scatter_reduce",), ("scatter_reduce", "scatter_reduce_"), CUDA_ONLY,
                       "reduce='prod'", _argument_is("reduce", "prod")),
)

# Ops torch raises for on CUDA without listing them in its documentation (source: the kernel's
# alertNotDeterministic call, named in ``kernel``).
UNDOCUMENTED_OPS = (
    NondeterministicOp(("torch.nn.functional.interpolate",), ("_upsample_bilinear2d_aa_backward",), CUDA_ONLY,
                       "mode='bilinear', antialias=True", kernel="upsample_bilinear2d_aa_backward_out_cuda"),
    NondeterministicOp(("torch.nn.functional.interpolate",), ("_upsample_bicubic2d_aa_backward",), CUDA_ONLY,
                       "mode='bicubic', antialias=True", kernel="upsample_bicubic2d_aa_backward_out_cuda"),
    NondeterministicOp(("torch.Tensor.index_reduce_",), ("index_reduce", "index_reduce_"), CUDA_ONLY,
                       kernel="index_reduce_func_cuda_impl (alert 'index_reduce_cuda')"),
    # torch documents ReplicationPad as deterministic on CUDA: F.pad decomposes mode='replicate' on
    # CUDA under determinism; the native backward kernels still alert.
    NondeterministicOp(("torch.nn.functional.pad",),
                       ("replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"),
                       CUDA_ONLY, "the native replicate kernel (F.pad decomposes it on CUDA under determinism)",
                       kernel="replication_pad{1,2,3}d_backward_cuda"),
    # Since 2.13 the documentation lists MaxPool3d as deterministic on CUDA: functional.py decomposes
    # max_pool3d_with_indices (return_indices=True) on CUDA; _max_pool3d (return_indices=False, what
    # nn.MaxPool3d calls by default) still reaches the kernel, which alerts.
    NondeterministicOp(("torch.nn.MaxPool3d",), ("max_pool3d_with_indices_backward",), CUDA_ONLY,
                       "the native kernel (F.max_pool3d decomposes only with return_indices=True)",
                       kernel="max_pool3d_with_indices_backward_out_cuda", since="2.13",
                       change="documented as raising through 2.11"),
)


def _pool_sizes_do_not_divide(overload: str, arguments: dict) -> bool:
    """Condition: an adaptive 3-D pool whose input sizes are not multiples of its output sizes."""
    grad, source = arguments.get("grad_output"), arguments.get("self")
    if not (isinstance(grad, torch.Tensor) and isinstance(source, torch.Tensor)):
        return True
    return any(i % o for i, o in zip(source.shape[-3:], grad.shape[-3:]) if o)


# Kernels that are not deterministic on CUDA and that torch does not alert for: they run under
# use_deterministic_algorithms(True) and their result varies (found by reading the kernels and
# cuDNN's documentation, not measured).
SILENT_OPS = (
    NondeterministicOp(("torch.nn.AdaptiveMaxPool3d",), ("adaptive_max_pool3d_backward",), CUDA_ONLY,
                       "input sizes that are not multiples of the output sizes", _pool_sizes_do_not_divide,
                       kernel="adaptive_max_pool3d_backward_out_cuda accumulates with atomicAdd when the "
                              "sizes do not divide", silent=True),
    NondeterministicOp(("torch.nn.functional.grid_sample",), ("cudnn_grid_sampler_backward",), CUDA_ONLY,
                       "4-D bilinear, zeros padding, align_corners=True (cuDNN's sampler)",
                       kernel="cuDNN documents cudnnSpatialTfSamplerBackward as not reproducible (atomics)",
                       silent=True),
)

NONDETERMINISTIC_OPS = DOCUMENTED_OPS + UNDOCUMENTED_OPS + SILENT_OPS

# torchvision's ops, read from the installed 0.29.1+cu130: torchvision/_autograd_registrations.py
# (the backward functions call torch._prims_common.alert_not_deterministic on CUDA; until the
# stable-ABI build the CUDA kernels called alertNotDeterministic with the same names) and
# torchvision/_C_stable.so (the kernels). tests/test_torchvision_determinism.py re-reads both.
VERIFIED_TORCHVISION = {"0.29": "_autograd_registrations.py, ops/*.py and _C_stable.so of 0.29.1+cu130"}
_ROI_NATIVE = ("the native kernel (under determinism torchvision.ops.roi_align takes a compiled pure-PyTorch "
               "path instead where torch.compile supports the GPU; the audit cannot know that and flags)")
TORCHVISION_OPS = (
    NondeterministicOp(("torchvision.ops.roi_align",), ("_roi_align_backward",), CUDA_ONLY, _ROI_NATIVE,
                       kernel="alert 'roi_align_backward_kernel'", namespace="torchvision",
                       alert="roi_align_backward_kernel"),
    NondeterministicOp(("torchvision.ops.roi_pool",), ("_roi_pool_backward",), CUDA_ONLY,
                       kernel="alert 'roi_pool_backward_kernel'", namespace="torchvision",
                       alert="roi_pool_backward_kernel"),
    NondeterministicOp(("torchvision.ops.ps_roi_align",), ("_ps_roi_align_backward",), CUDA_ONLY,
                       kernel="alert 'ps_roi_align_backward_kernel'", namespace="torchvision",
                       alert="ps_roi_align_backward_kernel"),
    NondeterministicOp(("torchvision.ops.ps_roi_pool",), ("_ps_roi_pool_backward",), CUDA_ONLY,
                       kernel="alert 'ps_roi_pool_backward_kernel'", namespace="torchvision",
                       alert="ps_roi_pool_backward_kernel"),
    # The CUDA backward (deformable_col2im_kernel) accumulates with atomicAdd. The C++ kernel never
    # alerted; 0.29's Python backward alerts. Releases between were not checked: 0.29 is the bound.
    NondeterministicOp(("torchvision.ops.deform_conv2d",), ("_deform_conv2d_backward",), CUDA_ONLY,
                       kernel="alert 'compute_grad_input' (_autograd_registrations.py)", since="0.29",
                       change="the backward's alert, first seen in 0.29", namespace="torchvision",
                       alert="compute_grad_input"),
    NondeterministicOp(("torchvision.ops.deform_conv2d",), ("_deform_conv2d_backward",), CUDA_ONLY,
                       kernel="deformable_col2im_kernel accumulates with atomicAdd and the C++ kernel has no alert",
                       until="0.29", change="the backward's alert, first seen in 0.29", silent=True,
                       namespace="torchvision"),
)
# torchvision ops whose every device's kernel is deterministic (no atomics), and the forwards of the rows above.
TORCHVISION_CLEAN = frozenset({"nms", "roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool", "deform_conv2d"})
KNOWN_NAMESPACES = ("aten", "prims", "profiler")  # profiler: record_function markers, no arithmetic

# Documented entries the audit deliberately does not check: (reason, the releases whose docstring lists them).
EXEMPT_DOC_NAMES = {
    "torch.Tensor.resize_": ("throws only for quantized tensors, which training never uses", ""),
    # No release checked has the "cumsum_cuda_kernel" alert in libtorch_cuda.so: the entry is stale.
    "torch.cumsum": ("stale: CUDA cumsum has a deterministic kernel (no 'cumsum_cuda_kernel' alert in the "
                     "2.9, 2.11 or 2.14 CUDA library)", "2.14"),
}


def exempt_doc_names(version: str) -> set:
    """The exempt documented names the docstring of torch ``version`` lists."""
    return {name for name, (_, until) in EXEMPT_DOC_NAMES.items() if not until or release(version) < release(until)}


def documented_names(doc: str) -> set:
    """Names in a ``torch.use_deterministic_algorithms`` docstring's "will throw a RuntimeError" list."""
    section = doc.split("nondeterministic operations will throw a")[1].split("In addition")[0]
    return set(re.findall(r"^\s*\* :(?:class|func|meth):`([^`]+)`", section, flags=re.M))


def documentation_mismatch(doc: str, version: str) -> tuple[set, set]:
    """``(documented but not in the rows for version, in those rows but not documented)``, exemptions aside."""
    documented = documented_names(doc)
    exempt = exempt_doc_names(version)
    in_table = {name for row in rows_for(version) if row in DOCUMENTED_OPS for name in row.doc_names}
    return documented - in_table - exempt, (in_table | exempt) - documented


def rows_for(version: str) -> tuple:
    """The rows that hold for torch ``version``."""
    return tuple(row for row in NONDETERMINISTIC_OPS if row.holds_for(version))


_ROWS_BY_OP: dict[tuple, list] = {}
for _row in NONDETERMINISTIC_OPS + TORCHVISION_OPS:
    for _name in _row.aten:
        _ROWS_BY_OP.setdefault((_row.namespace, _name), []).append(_row)


def known_op(func) -> bool:
    """True when the table answers for ``func`` (an OpOverload): aten, prims and profiler ops, and the
    torchvision ops it has rows for or knows to be deterministic."""
    name = func.overloadpacket.__name__
    return func.namespace in KNOWN_NAMESPACES or (
        func.namespace == "torchvision" and (name in TORCHVISION_CLEAN or ("torchvision", name) in _ROWS_BY_OP))


def op_name(func) -> str:
    """``adaptive_max_pool2d_backward`` for an aten op, ``torchvision::_roi_align_backward`` for others."""
    name = func.overloadpacket.__name__
    return name if func.namespace == "aten" else f"{func.namespace}::{name}"


def op_for_alert(alert: str) -> str | None:
    """The op (as :func:`op_name` gives it) of the row whose torch alert message names ``alert``, or None."""
    rows = [row for row in TORCHVISION_OPS if row.alert and row.alert == alert]
    return f"{rows[0].namespace}::{rows[0].aten[0]}" if rows else None


@lru_cache(maxsize=1)
def installed_torchvision() -> str:
    """The installed torchvision's version (read without importing the package)."""
    return torchvision_version()


def _named_arguments(func, args: tuple, kwargs: dict) -> dict:
    """An aten call's arguments by schema name, defaults filled in (e.g. ``accumulate=False``)."""
    named = {}
    for i, schema_arg in enumerate(func._schema.arguments):
        if i < len(args):
            named[schema_arg.name] = args[i]
        elif schema_arg.name in kwargs:
            named[schema_arg.name] = kwargs[schema_arg.name]
        elif schema_arg.has_default_value():
            named[schema_arg.name] = schema_arg.default_value
    return named


def match_nondeterministic(func, args: tuple = (), kwargs: dict | None = None,
                           version: str = torch.__version__) -> NondeterministicOp | None:
    """The row an op call falls under in torch ``version`` (default: the installed one), or None.

    torchvision's rows hold for the installed torchvision (:func:`installed_torchvision`).
    """
    candidates = _ROWS_BY_OP.get((func.namespace, func.overloadpacket.__name__), ())
    package_version = installed_torchvision() if func.namespace == "torchvision" else version
    rows = [row for row in candidates if row.holds_for(package_version)]
    if not rows:
        return None
    overload = func._overloadname
    arguments = _named_arguments(func, args, kwargs or {})
    for row in rows:
        if row.applies is None or row.applies(overload, arguments):
            return row
    return None
