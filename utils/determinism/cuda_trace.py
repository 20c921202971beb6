"""Tracing a training step the way CUDA would run it, on the ``meta`` device of a machine without a GPU.

The op audit predicts CUDA from a trace on ``meta`` (shapes only, no values). But meta is not
CUDA: torch picks some kernels by device, in Python and in C++, and meta takes CUDA's side of only
some of those choices.

- Python branches on ``not input.is_cpu`` (``F.interpolate`` decomposes bilinear and trilinear on
  non-CPU input under determinism): meta takes CUDA's side on its own.
- Python branches on ``input.is_cuda`` (``F.pad(mode="replicate")`` and
  ``F.max_pool3d(..., return_indices=True)`` decompose on CUDA under determinism): meta does not.
  :class:`CudaBranchTensor` answers ``is_cuda`` with True, so they go CUDA's way, except where the
  torch release being predicted is older than the branch (:data:`PYTHON_BRANCHES`).
- C++ branches to cuDNN, which meta never takes: ``grid_sampler`` runs cuDNN's sampler for 4-D
  bilinear, zero-padded, ``align_corners=True`` input, and ``ctc_loss`` runs cuDNN's CTC (with
  ``deterministic=true``) for the inputs ``_use_cudnn_ctc_loss`` accepts: lengths as tensors by its
  Tensor rule, and where that refuses them, read into lists, by its list rule (:func:`cudnn_ctc`). :class:`CudaBranchTensor`
  sends those calls to the cuDNN ops, for which :func:`cuda_branch_trace` registers shape-only meta
  kernels, so the trace records what CUDA runs.

A fake CUDA device (``FakeTensorMode`` with CUDA tensors) would take every branch by itself, but
on a machine without a CUDA driver its backward stops in the autograd engine
(``GraphTask::stash_current_streams`` asks the driver for a primary context), so it cannot trace
a training step here.
"""

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from utils.determinism.op_table import release

# Python functions whose is_cuda branch a torch release may predate: function -> first release with it.
# F.max_pool3d's CUDA decomposition is in 2.13's and 2.14's functional.py; 2.11's documentation still
# lists MaxPool3d as raising (2.12 was not checked).
PYTHON_BRANCHES = {F.max_pool3d_with_indices: "2.13"}

_CUDNN_FLOATS = (torch.float16, torch.float32, torch.float64)  # at::native::cudnn_is_acceptable
_CUDNN_CTC_MAX_TARGET = 256  # _use_cudnn_ctc_loss: every target length below this
_INT32_MAX = 2 ** 31 - 1  # canUse32BitIndexMath's default bound, which it excludes

_predicted_release = contextvars.ContextVar("predicted_torch_release", default=torch.__version__)
_python_branches_on = contextvars.ContextVar("python_branches_on", default=True)
_meta_kernels = []  # the torch.library registrations, kept alive for the process


class CudaBranchTensor(torch.Tensor):
    """A meta tensor that torch's Python code takes for a CUDA tensor, and whose cuDNN calls go to cuDNN.

    Every tensor computed from one is one too (its ``__torch_function__`` converts the results, as
    ``torch.Tensor``'s does), so wrapping a step's input (:func:`as_cuda_branch`) is enough.
    """

    @property
    def is_cuda(self) -> bool:
        return _python_branches_on.get()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        call = _cudnn_route(func, args, kwargs) or (lambda: func(*args, **kwargs))
        since = PYTHON_BRANCHES.get(func)
        token = _python_branches_on.set(not since or release(_predicted_release.get()) >= release(since))
        try:
            with torch._C.DisableTorchFunctionSubclass():
                result = call()
        finally:
            _python_branches_on.reset(token)
        return result if func in torch.overrides.get_default_nowrap_functions() else _as_subclass(result, cls)


def as_cuda_branch(tensor: torch.Tensor) -> CudaBranchTensor:
    """``tensor`` (a meta tensor) as a :class:`CudaBranchTensor`."""
    return tensor.as_subclass(CudaBranchTensor)


@contextlib.contextmanager
def cuda_branch_trace(torch_version: str = torch.__version__):
    """While active, :class:`CudaBranchTensor` takes the branches of torch ``torch_version``'s CUDA path."""
    _register_cudnn_meta_kernels()
    token = _predicted_release.set(torch_version)
    try:
        yield
    finally:
        _predicted_release.reset(token)


def _as_subclass(result, cls):
    """``result``'s tensors as ``cls``, inside tuples, named tuples and torch's return types too."""
    if isinstance(result, torch.Tensor):
        return result if isinstance(result, cls) else result.as_subclass(cls)
    if isinstance(result, (tuple, list)):
        items = [_as_subclass(item, cls) for item in result]
        kind = type(result)
        return kind._make(items) if hasattr(kind, "_make") else kind(items)
    return result


# ----------------------------------------------------------------------------- cuDNN's C++ branches


def _indexable_in_32_bits(t: torch.Tensor) -> bool:
    """at::native::canUse32BitIndexMath: fewer elements than INT32_MAX, and the last one's offset below it."""
    if t.numel() == 0:
        return True
    last_offset = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.numel() < _INT32_MAX and last_offset < _INT32_MAX


def _cudnn_acceptable(*tensors) -> bool:
    """at::native::cudnn_is_acceptable (CUDA assumed) and 32-bit indexing, for every tensor."""
    return torch.backends.cudnn.enabled and all(
        t.dtype in _CUDNN_FLOATS and t.numel() > 0 and _indexable_in_32_bits(t) for t in tensors)


def cudnn_samples(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None) -> bool:
    """True when CUDA's ``grid_sampler`` hands ``F.grid_sample(input, grid, ...)`` to cuDNN's sampler."""
    return (mode == "bilinear" and padding_mode == "zeros" and bool(align_corners) and input.dim() == 4
            and input.shape[1] <= 1024 and _cudnn_acceptable(input, grid))


def _lengths(values) -> list | None:
    """Lengths as ints, or None where a tensor's values cannot be read (a meta tensor)."""
    if isinstance(values, torch.Tensor):
        return None if values.is_meta else [int(v) for v in values.flatten().tolist()]
    return [int(v) for v in values]


def _ctc_common(log_probs, targets, blank) -> bool:
    """The conditions ATen's two ``_use_cudnn_ctc_loss`` overloads share (CUDA log_probs assumed)."""
    return (torch.backends.cudnn.enabled and blank == 0 and targets.dim() == 1 and log_probs.dim() == 3
            and log_probs.dtype == torch.float32 and targets.dtype == torch.int32 and targets.is_contiguous())


def _ctc_lengths_fit(inputs: list | None, targets_n: list | None) -> bool:
    """Every target shorter than cuDNN's limit and no longer than its input (unreadable lengths: no)."""
    if inputs is None or targets_n is None:
        return False
    return all(t < _CUDNN_CTC_MAX_TARGET and t <= i for t, i in zip(targets_n, inputs))


def cudnn_ctc_by_tensor_rule(log_probs, targets, input_lengths, target_lengths, blank=0) -> bool:
    """``_use_cudnn_ctc_loss.Tensor``: batched input, int32 length tensors, targets on any device."""
    tensors = isinstance(input_lengths, torch.Tensor) and isinstance(target_lengths, torch.Tensor)
    return (tensors and _ctc_common(log_probs, targets, blank) and input_lengths.dtype == torch.int32
            and target_lengths.dtype == torch.int32
            and _ctc_lengths_fit(_lengths(input_lengths), _lengths(target_lengths)))


def cudnn_ctc_by_list_rule(log_probs, targets, input_lengths, target_lengths, blank=0) -> bool:
    """``_use_cudnn_ctc_loss`` on the lengths as int lists, after unbatched input gains its batch dimension:
    targets on the CPU and every input as long as ``log_probs``."""
    batched = log_probs if log_probs.dim() == 3 else log_probs.unsqueeze(1)
    inputs = _lengths(input_lengths)
    return (_ctc_common(batched, targets, blank) and targets.device.type == "cpu" and inputs is not None
            and all(i == batched.shape[0] for i in inputs) and _ctc_lengths_fit(inputs, _lengths(target_lengths)))


def cudnn_ctc(log_probs, targets, input_lengths, target_lengths, blank=0) -> bool:
    """True when CUDA's ``ctc_loss`` runs cuDNN's CTC.

    Lengths as tensors take ATen's Tensor overload: cuDNN if its rule accepts them, otherwise the
    lengths are read into int lists and the list overload's rule decides, as for lengths given as
    lists. Lengths a meta trace cannot read count as not accepted, which predicts the native
    kernel (and its alert).
    """
    if isinstance(input_lengths, torch.Tensor) and cudnn_ctc_by_tensor_rule(
            log_probs, targets, input_lengths, target_lengths, blank):
        return True
    return cudnn_ctc_by_list_rule(log_probs, targets, input_lengths, target_lengths, blank)


def _ctc_through_cudnn(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    """``ctc_loss`` as aten's ctc_loss_impl computes it on cuDNN's path (deterministic algorithm)."""
    batched = log_probs.dim() == 3
    if not cudnn_ctc_by_tensor_rule(log_probs, targets, input_lengths, target_lengths, blank):
        input_lengths, target_lengths = _lengths(input_lengths), _lengths(target_lengths)  # the list overload
    costs = torch._cudnn_ctc_loss(log_probs if batched else log_probs.unsqueeze(1), targets, input_lengths,
                                  target_lengths, blank, True, zero_infinity)[0]
    if reduction == "mean":
        divisor = torch.as_tensor(target_lengths, dtype=costs.dtype, device=costs.device).clamp_min(1)
        return (costs / divisor).mean()
    if reduction == "sum":
        return costs.sum()
    return costs if batched else costs.squeeze(0)


def _bound(defaults: dict, args: tuple, kwargs: dict) -> dict:
    """Positional and keyword arguments by name, in the order of ``defaults``, defaults filled in."""
    named = dict(zip(defaults, args))
    return {name: kwargs.get(name, named.get(name, default)) for name, default in defaults.items()}


_GRID_SAMPLE = dict.fromkeys(("input", "grid")) | {"mode": "bilinear", "padding_mode": "zeros",
                                                   "align_corners": None}
_CTC_LOSS = dict.fromkeys(("log_probs", "targets", "input_lengths", "target_lengths")) | {
    "blank": 0, "reduction": "mean", "zero_infinity": False}


def _cudnn_route(func, args: tuple, kwargs: dict):
    """A call of the cuDNN op CUDA would run for ``func(*args, **kwargs)``, or None."""
    if func is F.grid_sample:
        call = _bound(_GRID_SAMPLE, args, kwargs)
        if cudnn_samples(**call):
            return lambda: torch.cudnn_grid_sampler(call["input"], call["grid"])
    if func is F.ctc_loss:
        call = _bound(_CTC_LOSS, args, kwargs)
        if cudnn_ctc(*(call[name] for name in ("log_probs", "targets", "input_lengths", "target_lengths", "blank"))):
            return lambda: _ctc_through_cudnn(**call)
    return None


# ----------------------------------------------------------------------------- meta kernels for the cuDNN ops


def _grid_sampler_meta(input, grid):
    return input.new_empty((input.shape[0], input.shape[1], grid.shape[1], grid.shape[2]))


def _grid_sampler_backward_meta(input, grid, grad_output):
    return input.new_empty(input.shape), grid.new_empty(grid.shape)


def _ctc_meta(log_probs, targets, input_lengths, target_lengths, blank, deterministic, zero_infinity):
    return log_probs.new_empty((log_probs.shape[1],)), log_probs.new_empty(log_probs.shape)


_META_KERNELS = {"cudnn_grid_sampler": _grid_sampler_meta,
                 "cudnn_grid_sampler_backward": _grid_sampler_backward_meta,
                 "_cudnn_ctc_loss": _ctc_meta, "_cudnn_ctc_loss.Tensor": _ctc_meta}


def _register_cudnn_meta_kernels() -> None:
    """Shape-only meta kernels for the cuDNN ops torch has none for (once per process; a torch that
    ships its own keeps it)."""
    if _meta_kernels:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in _META_KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            library.impl(name, kernel, "Meta")
    _meta_kernels.append(library)

