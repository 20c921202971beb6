"""The determinism op audit: which ops of one training step have no deterministic implementation.

:func:`audit_model` runs what ``train.py``'s training step runs (forward, loss, backward, an
optimizer step and the EMA update) on deep copies of a model, records every aten op under a
``TorchDispatchMode`` and matches it against :data:`NONDETERMINISTIC_OPS`, a table of the ops
PyTorch throws for under ``torch.use_deterministic_algorithms(True)``. Each finding names its op,
its phase, the devices where it throws and the innermost module (or ``loss``, ``optimizer``,
``ema``) that issued it; the table part is predictive, so a CPU run names CUDA-only failures.
The command line is ``python audit.py --cfg MODEL.yaml``; this module never imports ``models/``:
callers pass the model and, for a detection model, a loss factory (:func:`detection_loss`).
"""

import contextlib
import logging
import math
import threading
import warnings
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from utils.logging import LOGGER
from utils.loss import ComputeLoss
from utils.torch_utils import (ModelEMA, de_parallel, get_rng_state, input_channels, set_rng_state,
                               smart_optimizer, temporary_determinism)

# ----------------------------------------------------------------------------- the op table

CUDA_ONLY = ("cuda",)
CPU_AND_CUDA = ("cpu", "cuda")


def _argument_is(name: str, expected) -> Callable[[str, dict], bool]:
    """Condition: the op's argument ``name`` equals ``expected``."""
    return lambda overload, arguments: arguments.get(name) == expected


def _floating_input(overload: str, arguments: dict) -> bool:
    """Condition: the op's ``self`` tensor is floating point."""
    tensor = arguments.get("self")
    return isinstance(tensor, torch.Tensor) and tensor.is_floating_point()


@dataclass(frozen=True)
class NondeterministicOp:
    """One row of the op table: aten ops that throw under determinism.

    ``doc_names`` are the names used in ``torch.use_deterministic_algorithms.__doc__``'s
    "will throw a RuntimeError" list; ``aten`` the overload packets the audit sees at dispatch
    (backward kernels for "when attempting to differentiate"); ``devices`` where it throws;
    ``applies(overload, arguments)`` narrows argument-dependent rows (None: always).
    ``kernel`` is set only for rows torch raises for but does not document: the ATen kernel
    whose ``alertNotDeterministic`` call is the source.
    """

    doc_names: tuple
    aten: tuple
    devices: tuple
    condition: str = ""
    applies: Callable[[str, dict], bool] | None = None
    kernel: str = ""

    @property
    def reason(self) -> str:
        """Human-readable source of the row, e.g. ``torch.Tensor.put_ with accumulate=False``."""
        text = " / ".join(self.doc_names) + (f" with {self.condition}" if self.condition else "")
        return text + (f" (undocumented; raised by {self.kernel})" if self.kernel else "")


# Built from torch.use_deterministic_algorithms.__doc__ (torch 2.x); tests/test_determinism.py
# cross-checks the documented rows against the installed torch in both directions, so an upgrade
# that adds or retires an entry fails the suite. Ops torch documents as switching to a
# deterministic algorithm (index_add, scatter_add_, cumsum, ...) are not failures and are not listed.
DOCUMENTED_OPS = (
    NondeterministicOp(("torch.nn.AvgPool3d",), ("avg_pool3d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.AdaptiveAvgPool2d",), ("_adaptive_avg_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.AdaptiveAvgPool3d",),
                       ("_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward"), CUDA_ONLY),
    NondeterministicOp(("torch.nn.AdaptiveMaxPool2d",), ("adaptive_max_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.FractionalMaxPool2d",), ("fractional_max_pool2d_backward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.FractionalMaxPool3d",), ("fractional_max_pool3d_backward",), CUDA_ONLY),
    # MaxUnpool1d runs on the 2-D kernel; unpooling throws on every device, forward included.
    NondeterministicOp(("torch.nn.MaxUnpool1d", "torch.nn.MaxUnpool2d"), ("max_unpool2d",), CPU_AND_CUDA),
    NondeterministicOp(("torch.nn.MaxUnpool3d",), ("max_unpool3d",), CPU_AND_CUDA),
    NondeterministicOp(("torch.nn.functional.interpolate",),
                       ("upsample_linear1d_backward", "upsample_bilinear2d_backward",
                        "upsample_bicubic2d_backward", "upsample_trilinear3d_backward"),
                       CUDA_ONLY, "mode linear, bilinear, bicubic or trilinear"),
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
    # _histc_cuda alerts only for floating-point input; integer histograms count exactly.
    NondeterministicOp(("torch.histc",), ("histc",), CUDA_ONLY, "floating-point input", _floating_input),
    NondeterministicOp(("torch.bincount",), ("bincount",), CUDA_ONLY, "weights",
                       lambda overload, arguments: arguments.get("weights") is not None),
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
)

NONDETERMINISTIC_OPS = DOCUMENTED_OPS + UNDOCUMENTED_OPS

# Documented entries the audit deliberately does not check, with the reason.
EXEMPT_DOC_NAMES = {
    "torch.Tensor.resize_": "throws only for quantized tensors, which training never uses",
}

_ROWS_BY_ATEN: dict[str, list] = {}
for _row in NONDETERMINISTIC_OPS:
    for _name in _row.aten:
        _ROWS_BY_ATEN.setdefault(_name, []).append(_row)


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


def match_nondeterministic(func, args: tuple = (), kwargs: dict | None = None) -> NondeterministicOp | None:
    """The table row an aten call falls under, or None when it is deterministic everywhere."""
    rows = _ROWS_BY_ATEN.get(func.overloadpacket.__name__)
    if not rows:
        return None
    overload = func._overloadname
    arguments = _named_arguments(func, args, kwargs or {})
    for row in rows:
        if row.applies is None or row.applies(overload, arguments):
            return row
    return None


# ----------------------------------------------------------------------------- the report

PHASES = ("forward", "backward", "step")  # step: gradient clipping, optimizer step, EMA update
_MODULE_KEY = "determinism_audit_module"  # key in autograd Node.metadata
_OUTSIDE_MODEL = "(outside the model)"
_TORCH_ALERT = " does not have a deterministic implementation"
AUDIT_NWD_C = 8.0  # stand-in NWD constant (px) for auditing a loss whose run has not measured its data yet


@dataclass(frozen=True)
class Finding:
    """An op without a deterministic implementation on ``devices``, as issued by ``module`` in ``phase``."""

    op: str
    phase: str  # one of PHASES
    module: str  # e.g. "model.24.max_pool (AdaptiveMaxPool2d)", "loss", "optimizer", "ema"
    devices: tuple
    reason: str = ""

    def to_dict(self) -> dict:
        """Plain data."""
        return {"op": self.op, "phase": self.phase, "module": self.module,
                "devices": list(self.devices), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        """The inverse of :meth:`to_dict`; malformed data raises ValueError, KeyError or TypeError."""
        text = {name: data[name] for name in ("op", "phase", "module", "reason")}
        devices = data["devices"]
        strings = isinstance(devices, list) and all(isinstance(v, str) for v in (*text.values(), *devices))
        if not strings or text["phase"] not in PHASES:
            raise ValueError(f"malformed finding {data!r}")
        return cls(devices=tuple(devices), **text)


@dataclass
class AuditReport:
    """What :func:`audit_model` saw: table findings plus, from the real run, what torch warned about."""

    device: str
    imgsz: int
    findings: list = field(default_factory=list)
    torch_flagged: list = field(default_factory=list)  # [{"op", "phase", "message"}]
    op_counts: dict = field(default_factory=dict)  # {"forward": n, "backward": n, "step": n}
    torch_version: str = torch.__version__
    batch_size: int = 2

    @property
    def clean(self) -> bool:
        """True when no op of the step lacks a deterministic implementation on CPU or CUDA."""
        return not self.findings and not self.torch_flagged

    def applicable(self) -> list:
        """Findings that fail on the audited device, plus torch's own flags the table did not explain."""
        device_type = torch.device(self.device).type
        failing = [f for f in self.findings if device_type in f.devices]
        explained = {f.op for f in failing}
        for flag in self.torch_flagged:
            if not any(flag["op"].startswith(op) for op in explained):
                failing.append(Finding(flag["op"], flag["phase"], "(reported by torch)", (device_type,),
                                       flag["message"]))
        return failing

    def format(self) -> str:
        """A human-readable multi-line report."""
        counted = ", ".join(f"{n} {phase}" for phase, n in self.op_counts.items())
        lines = [f"Determinism audit of one training step (batch {self.batch_size}, {self.imgsz}x{self.imgsz}) "
                 f"on {self.device} (torch {self.torch_version}): {counted} aten ops recorded"]
        if self.findings:
            op_width = max(len("op"), *(len(f.op) for f in self.findings)) + 2
            module_width = max(len("module"), *(len(f.module) for f in self.findings)) + 2
            lines.append(f"  {'op':<{op_width}}{'phase':<10}{'fails on':<10}{'module':<{module_width}}source")
            for f in self.findings:
                lines.append(f"  {f.op:<{op_width}}{f.phase:<10}{'/'.join(f.devices):<10}"
                             f"{f.module:<{module_width}}{f.reason}")
        for flag in self.torch_flagged:
            lines.append(f"  torch itself flagged on {self.device} in {flag['phase']}: {flag['message']}")
        if self.clean:
            lines.append("Result: clean; every op has a deterministic implementation on CPU and CUDA, "
                         "so --deterministic strict keeps full determinism.")
        else:
            lines.append(f"Result: {len(self.findings)} op(s) without a deterministic implementation. Under "
                         "--deterministic strict these ops stop training on the devices listed; scoped "
                         "relaxes backward ops only; warn reports them. See docs/determinism.md")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Plain data for the run's determinism report."""
        return {"device": self.device, "imgsz": self.imgsz, "batch_size": self.batch_size,
                "torch_version": self.torch_version, "clean": self.clean,
                "findings": [f.to_dict() for f in self.findings],
                "torch_flagged": [dict(flag) for flag in self.torch_flagged], "op_counts": dict(self.op_counts)}

    @classmethod
    def from_dict(cls, data: dict) -> "AuditReport":
        """The inverse of :meth:`to_dict` (``clean`` is derived, not read); malformed data raises
        ValueError, KeyError or TypeError, so a damaged cache file is never half-read."""
        flags = [{"op": str(f["op"]), "phase": str(f["phase"]), "message": str(f["message"])}
                 for f in data["torch_flagged"]]
        counts = {str(phase): int(n) for phase, n in data["op_counts"].items()}
        if not isinstance(data["device"], str) or not isinstance(data["torch_version"], str):
            raise ValueError("device and torch_version must be strings")
        return cls(device=data["device"], imgsz=int(data["imgsz"]), batch_size=int(data["batch_size"]),
                   torch_version=data["torch_version"], findings=[Finding.from_dict(f) for f in data["findings"]],
                   torch_flagged=flags, op_counts=counts)


# ----------------------------------------------------------------------------- the tracer


def _tensors_in(obj) -> list:
    """Every tensor inside nested tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors_in(item)]
    return []


def _next_sequence_nr() -> int:
    """The sequence number the next autograd node created on this thread will get.

    Nodes are numbered in creation order per thread, so a region's own nodes are exactly those
    numbered between its start and its end.
    """
    with torch.enable_grad():
        probe = torch.zeros((), requires_grad=True).view(())
    return probe.grad_fn._sequence_nr() + 1


def _tag_new_nodes(outputs, label: str, first: int) -> None:
    """Label the autograd nodes behind ``outputs`` created since sequence number ``first``.

    Inner modules tag their nodes first; ``setdefault`` keeps their label and the walk goes on
    through them to reach the enclosing region's own nodes. The backward pass reads the label
    through ``torch._C._current_autograd_node()``.
    """
    pending = [t.grad_fn for t in _tensors_in(outputs) if t.grad_fn is not None]
    seen = set()
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "AccumulateGrad" or node._sequence_nr() < first:
            continue  # a leaf, or a node made before this region began
        node.metadata.setdefault(_MODULE_KEY, label)
        pending.extend(next_node for next_node, _ in node.next_functions)


class _ModuleTracker:
    """Forward hooks on every module, and named regions (``loss``, ``optimizer``, ``ema``).

    Keeps a stack of active labels; when a module or region ends, its new autograd nodes get its
    label, so backward ops are attributed to the module whose forward created them.
    """

    def __init__(self, model: nn.Module):
        self.stack: list[tuple[str, int]] = []  # (label, first sequence number)
        self.paused = False  # True while the hooks themselves run ops
        self.handles = []
        for name, module in model.named_modules():
            label = f"{name} ({type(module).__name__})" if name else type(module).__name__
            self.handles.append(module.register_forward_pre_hook(self._enter(label)))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))

    def current(self) -> str:
        """The innermost active label."""
        return self.stack[-1][0] if self.stack else _OUTSIDE_MODEL

    def _push(self, label: str) -> None:
        self.paused = True
        try:
            self.stack.append((label, _next_sequence_nr()))
        finally:
            self.paused = False

    def _enter(self, label: str):
        return lambda module, args: self._push(label)

    def _leave(self, module, args, output):
        label, first = self.stack.pop()
        _tag_new_nodes(output, label, first)

    @contextlib.contextmanager
    def region(self, label: str):
        """Attribute ops inside the block to ``label``; yields ``tag(outputs)`` for its autograd nodes."""
        self._push(label)
        first = self.stack[-1][1]
        try:
            yield lambda outputs: _tag_new_nodes(outputs, label, first)
        finally:
            self.stack.pop()

    def remove(self) -> None:
        """Detach every hook."""
        for handle in self.handles:
            handle.remove()


def _dispatch_mode_base():
    """``TorchDispatchMode`` (imported lazily: a private torch module, needed only by the audit)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    return TorchDispatchMode


def _make_recorder(tracker: _ModuleTracker):
    """A TorchDispatchMode that counts every aten op and keeps the table's findings with their module."""

    class OpRecorder(_dispatch_mode_base()):
        def __init__(self):
            super().__init__()
            self.phase = "forward"
            self.findings: dict = {}
            self.op_counts = dict.fromkeys(PHASES, 0)
            self.lock = threading.Lock()  # CUDA backward runs on autograd worker threads

        def _module(self) -> str:
            if self.phase != "backward":
                return tracker.current()
            current_node = getattr(torch._C, "_current_autograd_node", None)  # absent in older torch
            node = current_node() if current_node else None
            return node.metadata.get(_MODULE_KEY, _OUTSIDE_MODEL) if node is not None else _OUTSIDE_MODEL

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not tracker.paused:
                row = match_nondeterministic(func, args, kwargs)
                with self.lock:
                    self.op_counts[self.phase] += 1
                    if row is not None:
                        finding = Finding(func.overloadpacket.__name__, self.phase, self._module(),
                                          row.devices, row.reason)
                        self.findings.setdefault((finding.op, finding.phase, finding.module), finding)
            return func(*args, **kwargs)

    return OpRecorder()


def _torch_flags(caught: list, phase: str) -> list:
    """torch's 'does not have a deterministic implementation' warnings as ``{op, phase, message}``."""
    flags = []
    for w in caught:
        message = str(w.message).strip().splitlines()[0]
        if _TORCH_ALERT in message:
            op = message.split(_TORCH_ALERT)[0].strip()
            flags.append({"op": op, "phase": phase, "message": f"{op}{_TORCH_ALERT}"})
    return flags


# ----------------------------------------------------------------------------- losses for the audit

PARALLEL_GRAIN = 32768  # at::internal::GRAIN_SIZE: CPU index_put_ accumulate runs in parallel from here

LossFactory = Callable[[nn.Module, torch.Tensor], Callable]  # (model, images) -> (output -> scalar loss)


def sum_of_outputs(model: nn.Module, images: torch.Tensor) -> Callable:
    """Loss factory for any model: the sum of every floating output that requires grad (None if none)."""
    def loss(output):
        parts = [t.float().sum() for t in _tensors_in(output) if t.is_floating_point() and t.requires_grad]
        return torch.stack(parts).sum() if parts else None
    return loss


def crowded_targets(detect: nn.Module, batch_size: int, imgsz: int, generator: torch.Generator) -> torch.Tensor:
    """Synthetic labels ``(n, 6)`` [image, class, x, y, w, h] (normalised) crowded like a small-object set.

    Each box is sized like one of the head's anchors (cycling over levels and anchors, scaled by
    0.8-1.25), so every level gets at least ``n / nl`` positives; with ``n = PARALLEL_GRAIN * nl / no``
    the loss's ``pi[b, a, gj, gi]`` backward accumulates at least ``PARALLEL_GRAIN`` elements with
    ``index_put_``, the size at which PyTorch's CPU kernel goes parallel when determinism is off.
    """
    n = math.ceil(PARALLEL_GRAIN * detect.nl / detect.no)
    anchors_px = (detect.anchors * detect.stride.view(-1, 1, 1)).reshape(-1, 2).detach().float().cpu()
    scale = torch.empty(n, 1).uniform_(0.8, 1.25, generator=generator)
    wh = (anchors_px[torch.arange(n) % len(anchors_px)] * scale / imgsz).clamp(max=1.0)
    xy = wh / 2 + torch.rand(n, 2, generator=generator) * (1 - wh)
    image = (torch.arange(n) % batch_size).float()
    cls = torch.randint(0, detect.nc, (n,), generator=generator).float()
    return torch.cat((image[:, None], cls[:, None], xy, wh), 1)


def detection_loss(hyp: dict | None) -> LossFactory:
    """Loss factory for a YOLO detection model: ``utils.loss.ComputeLoss`` on :func:`crowded_targets`.

    ``hyp``: the loss's hyperparameters (e.g. the values of data/hyps/hyp.scratch-low.yaml; None is
    a UserError when the audit builds the loss); the model's Detect head is ``model.model[-1]``.
    """
    # a run sets NWD's constant from its data only after this audit; the ops do not depend on its value
    loss_hyp = None if hyp is None else {**hyp, "nwd_c": hyp.get("nwd_c") or AUDIT_NWD_C}

    def factory(model: nn.Module, images: torch.Tensor) -> Callable:
        compute_loss = ComputeLoss(model, loss_hyp)
        generator = torch.Generator().manual_seed(0)
        targets = crowded_targets(model.model[-1], images.shape[0], images.shape[-1], generator)
        targets = targets.to(images.device)
        return lambda output: compute_loss(output, targets)[0]
    return factory


# ----------------------------------------------------------------------------- the audit


@contextlib.contextmanager
def _quiet_logger():
    """Hide info lines (e.g. the optimizer summary) of the audit's own training objects."""
    level = LOGGER.level
    LOGGER.setLevel(logging.WARNING)
    try:
        yield
    finally:
        LOGGER.setLevel(level)


def _training_copy(model: nn.Module) -> nn.Module:
    """A train-mode, channels-last deep copy without gradients (train.py trains channels-last)."""
    copy = deepcopy(de_parallel(model)).train()
    for p in copy.parameters():
        p.grad = None
    return copy.to(memory_format=torch.channels_last)


def _record(recorder, phase: str, step: Callable):
    """Run ``step()`` as ``phase`` under the recorder; return its result and torch's own flags."""
    recorder.phase = phase
    with warnings.catch_warnings(record=True) as caught, recorder:
        warnings.simplefilter("always")
        result = step()
    return result, _torch_flags(caught, phase)


class _TrainingStep:
    """train.py's step on a copy: forward + loss, scaled backward, unscale/clip/step, EMA update."""

    def __init__(self, model: nn.Module, images: torch.Tensor, loss_factory: LossFactory, amp: bool):
        self.model, self.images, self.amp = model, images, amp
        self.loss_fn = loss_factory(model, images)
        with _quiet_logger():
            self.optimizer = smart_optimizer(model, "SGD", lr=0.01, momentum=0.937, decay=5e-4)
        self.ema = ModelEMA(model)
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp and images.device.type == "cuda")
        self.loss = None

    def forward(self, tracker: _ModuleTracker) -> None:
        # torch.autocast raises on a device without an autocast dtype (meta) even when disabled
        autocast = torch.autocast(self.images.device.type) if self.amp else contextlib.nullcontext()
        with autocast:
            output = self.model(self.images)
            with tracker.region("loss") as tag:
                self.loss = self.loss_fn(output)
                tag(self.loss)

    def backward(self) -> None:
        self.scaler.scale(self.loss).backward()

    def step(self, tracker: _ModuleTracker) -> None:
        with tracker.region("optimizer"):
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
        with tracker.region("ema"):
            self.ema.update(self.model)


def audit_model(model: nn.Module, imgsz: int = 64, device="cpu", batch_size: int = 2, ch: int | None = None,
                loss_factory: LossFactory | None = None, amp: bool = False) -> AuditReport:
    """Audit one training step on a ``(batch_size, ch, imgsz, imgsz)`` input; return the report.

    The step runs on deep copies (model, optimizer, EMA), so ``model`` and the RNG streams are
    left exactly as they were; ``model`` must already be on ``device``. ``loss_factory(copy,
    images)`` returns the loss callable (default :func:`sum_of_outputs`; :func:`detection_loss`
    for YOLO models); ``amp`` runs the forward under autocast as train.py does on CUDA. Every
    aten op is matched against :data:`NONDETERMINISTIC_OPS`; the step runs under
    ``use_deterministic_algorithms(True, warn_only=True)``, so ``torch_flagged`` holds what torch
    itself reports on this device. ``batch_size`` must be at least 2 (BatchNorm on a 1x1 map
    needs two values per channel).
    """
    if batch_size < 2:
        raise ValueError(f"audit batch_size {batch_size}: must be at least 2 (BatchNorm needs two values)")
    device = torch.device(device)
    student = _training_copy(model)
    generator = torch.Generator().manual_seed(0)  # the input must not draw from the global stream
    images = torch.rand((batch_size, ch or input_channels(student), imgsz, imgsz), generator=generator)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    saved_rng = get_rng_state()  # training-mode forwards (DropPath) draw from the global streams
    tracker = _ModuleTracker(student)
    recorder = _make_recorder(tracker)
    try:
        with temporary_determinism(True, warn_only=True):
            step = _TrainingStep(student, images, loss_factory or sum_of_outputs, amp)
            _, flags = _record(recorder, "forward", lambda: step.forward(tracker))
            if step.loss is not None:
                flags += _record(recorder, "backward", step.backward)[1]
                flags += _record(recorder, "step", lambda: step.step(tracker))[1]
    finally:
        tracker.remove()
        set_rng_state(saved_rng)
    unique_flags = list({(f["op"], f["phase"]): f for f in flags}.values())
    return AuditReport(device=str(device), imgsz=imgsz, findings=list(recorder.findings.values()),
                       torch_flagged=unique_flags, op_counts=dict(recorder.op_counts), batch_size=batch_size)
