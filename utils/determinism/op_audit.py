"""The determinism op audit: which ops of one training step have no deterministic implementation.

:func:`audit_model` runs what ``train.py``'s training step runs (forward, loss, backward, an
optimizer step and the EMA update) on deep copies of a model, records every aten op under a
``TorchDispatchMode`` and matches it against the op table (``utils/determinism/op_table.py``) of
the ops PyTorch throws for under ``torch.use_deterministic_algorithms(True)``. Each finding names
its op, its phase, the devices where it throws and the innermost module (or ``loss``,
``optimizer``, ``ema``) that issued it. torchvision's detection ops have rows too; an op of any
other library is listed as not verified (:attr:`AuditReport.unverified`), so it is never clean.

A CPU audit predicts CUDA too, from a second trace on the ``meta`` device that takes CUDA's
branches (``utils/determinism/cuda_trace.py``): torch's Python code branches on ``input.is_cpu``
and ``input.is_cuda`` (``F.interpolate``, ``F.pad(mode="replicate")`` and ``F.max_pool3d`` decompose
on CUDA under determinism), and its C++ hands some calls to cuDNN (``grid_sample``, ``ctc_loss``).
Some CUDA kernels are nondeterministic without an alert (``Finding.silent``). The meta trace replaces the loss by
the sum of the outputs (a detection loss needs values), so the loss's own ops are predicted from
the CPU trace; where meta has no kernel for an op of the model, the whole CUDA prediction comes
from the CPU trace, and the report and each CUDA finding say so (:attr:`AuditReport.cuda_trace`).
The command line is ``python audit.py --cfg MODEL.yaml``; this module never imports ``models/``:
callers pass the model and, for a detection model, a loss factory (:func:`detection_loss`).
"""

import contextlib
import logging
import math
import re
import threading
import warnings
from copy import deepcopy
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn as nn

from utils.determinism.cuda_trace import as_cuda_branch, cuda_branch_trace
from utils.determinism.op_table import known_op, match_nondeterministic, op_for_alert, op_name
from utils.logging import LOGGER
from utils.loss import ComputeLoss
from utils.rng_state import preserved_rng_state
from utils.torch_utils import ModelEMA, de_parallel, input_channels, smart_optimizer, temporary_determinism

# ----------------------------------------------------------------------------- the report

PHASES = ("forward", "backward", "step")  # step: gradient clipping, optimizer step, EMA update
_MODULE_KEY = "determinism_audit_module"  # key in autograd Node.metadata
_OUTSIDE_MODEL = "(outside the model)"
_TORCH_ALERT = " does not have a deterministic implementation"
META_TRACE = "meta"
LOSS_FROM_CPU = "CUDA predicted from the CPU trace (the meta trace cannot compute the loss)"
AUDIT_NWD_C = 8.0  # stand-in NWD constant (px) for auditing a loss whose run has not measured its data yet


@dataclass(frozen=True)
class Finding:
    """An op without a deterministic implementation on ``devices``, as issued by ``module`` in ``phase``."""

    op: str
    phase: str  # one of PHASES
    module: str  # e.g. "model.24.max_pool (AdaptiveMaxPool2d)", "loss", "optimizer", "ema"
    devices: tuple
    reason: str = ""
    silent: bool = False  # runs without torch's alert on those devices, but not deterministically

    def to_dict(self) -> dict:
        """Plain data."""
        return {"op": self.op, "phase": self.phase, "module": self.module,
                "devices": list(self.devices), "reason": self.reason, "silent": self.silent}

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        """The inverse of :meth:`to_dict`; malformed data raises ValueError, KeyError or TypeError."""
        text = {name: data[name] for name in ("op", "phase", "module", "reason")}
        devices = data["devices"]
        strings = isinstance(devices, list) and all(isinstance(v, str) for v in (*text.values(), *devices))
        silent = data["silent"]
        if not strings or text["phase"] not in PHASES or not isinstance(silent, bool):
            raise ValueError(f"malformed finding {data!r}")
        return cls(devices=tuple(devices), silent=silent, **text)


def _same_op(flagged: str, table_op: str) -> bool:
    """True when torch's alert name (``_histc_cuda``, ``adaptive_avg_pool2d_backward_cuda``) is the table's aten op.

    The alert names the kernel: a device suffix, and aten's leading underscore dropped or added.
    """
    return flagged.lstrip("_").startswith(table_op.lstrip("_")) or op_for_alert(flagged) == table_op


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
    cuda_trace: str = ""  # what the CUDA findings come from: a CUDA or meta trace, or the CPU one and why
    unverified: list = field(default_factory=list)  # [{"op", "phase", "module"}]: ops the table does not know

    @property
    def clean(self) -> bool:
        """True when every op of the step is known to the table and has a deterministic implementation."""
        return not self.findings and not self.torch_flagged and not self.unverified

    def applicable(self) -> list:
        """Findings that fail on the audited device, plus torch's own flags the table did not explain."""
        device_type = torch.device(self.device).type
        failing = [f for f in self.findings if device_type in f.devices]
        explained = {f.op for f in failing}
        for flag in self.torch_flagged:
            if not any(_same_op(flag["op"], op) for op in explained):
                failing.append(Finding(flag["op"], flag["phase"], "(reported by torch)", (device_type,),
                                       flag["message"]))
        return failing

    def format(self) -> str:
        """A human-readable multi-line report."""
        counted = ", ".join(f"{n} {phase}" for phase, n in self.op_counts.items())
        lines = [f"Determinism audit of one training step (batch {self.batch_size}, {self.imgsz}x{self.imgsz}) "
                 f"on {self.device} (torch {self.torch_version}): {counted} aten ops recorded; "
                 f"CUDA predicted from: {self.cuda_trace or self.device}"]
        if self.findings:
            op_width = max(len("op"), *(len(f.op) for f in self.findings)) + 2
            module_width = max(len("module"), *(len(f.module) for f in self.findings)) + 2
            lines.append(f"  {'op':<{op_width}}{'phase':<10}{'fails on':<10}{'module':<{module_width}}source")
            for f in self.findings:
                where = "/".join(f.devices) + (" silent" if f.silent else "")
                lines.append(f"  {f.op:<{op_width}}{f.phase:<10}{where:<10}{f.module:<{module_width}}{f.reason}")
        for flag in self.torch_flagged:
            lines.append(f"  torch itself flagged on {self.device} in {flag['phase']}: {flag['message']}")
        for op in self.unverified:
            lines.append(f"  not verified: {op['op']} ({op['phase']}, {op['module']}): an op the determinism "
                         "table does not know; nothing says whether it is deterministic")
        if self.clean:
            lines.append("Result: clean; every op has a deterministic implementation on CPU and CUDA, "
                         "so --deterministic strict keeps full determinism.")
        elif not self.findings and not self.torch_flagged:
            lines.append(f"Result: not verified; {len(self.unverified)} op(s) outside the table. strict refuses "
                         "to promise determinism, scoped warns and records them. See docs/determinism.md")
        else:
            lines.append(f"Result: {len(self.findings)} op(s) without a deterministic implementation"
                         + (f" and {len(self.unverified)} not verified" if self.unverified else "") + ". Under "
                         "--deterministic strict these ops stop training on the devices listed; scoped "
                         "relaxes backward ops only; warn reports them. 'silent': torch raises nothing "
                         "there and the result varies. See docs/determinism.md")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Plain data for the run's determinism report."""
        return {"device": self.device, "imgsz": self.imgsz, "batch_size": self.batch_size,
                "torch_version": self.torch_version, "cuda_trace": self.cuda_trace, "clean": self.clean,
                "findings": [f.to_dict() for f in self.findings],
                "torch_flagged": [dict(flag) for flag in self.torch_flagged], "op_counts": dict(self.op_counts),
                "unverified": [dict(op) for op in self.unverified]}

    @classmethod
    def from_dict(cls, data: dict) -> "AuditReport":
        """The inverse of :meth:`to_dict` (``clean`` is derived, not read); malformed data raises
        ValueError, KeyError or TypeError, so a damaged cache file is never half-read."""
        flags = [{"op": str(f["op"]), "phase": str(f["phase"]), "message": str(f["message"])}
                 for f in data["torch_flagged"]]
        unverified = [{"op": str(u["op"]), "phase": str(u["phase"]), "module": str(u["module"])}
                      for u in data["unverified"]]
        counts = {str(phase): int(n) for phase, n in data["op_counts"].items()}
        text = {name: data[name] for name in ("device", "torch_version", "cuda_trace")}
        if not all(isinstance(value, str) for value in text.values()):
            raise ValueError("device, torch_version and cuda_trace must be strings")
        return cls(imgsz=int(data["imgsz"]), batch_size=int(data["batch_size"]), **text,
                   findings=[Finding.from_dict(f) for f in data["findings"]],
                   torch_flagged=flags, op_counts=counts, unverified=unverified)


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


def _make_recorder(tracker: _ModuleTracker, version: str):
    """A TorchDispatchMode that counts every aten op and keeps the findings for torch ``version`` with their module."""

    class OpRecorder(_dispatch_mode_base()):
        def __init__(self):
            super().__init__()
            self.phase = "forward"
            self.findings: dict = {}
            self.unverified: dict = {}  # (op, phase, module) -> {"op", "phase", "module"}
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
                row = match_nondeterministic(func, args, kwargs, version)
                with self.lock:
                    self.op_counts[self.phase] += 1
                    if row is not None:
                        finding = Finding(op_name(func), self.phase, self._module(), row.devices, row.reason,
                                          row.silent)
                        self.findings.setdefault((finding.op, finding.phase, finding.module), finding)
                    elif not known_op(func):
                        seen = {"op": op_name(func), "phase": self.phase, "module": self._module()}
                        self.unverified.setdefault(tuple(seen.values()), seen)
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
ForwardScope = Callable[[], contextlib.AbstractContextManager]  # a fresh context manager per step


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


def _run_step(student: nn.Module, images: torch.Tensor, loss_factory: LossFactory, amp: bool,
              version: str, forward_scope: ForwardScope | None = None) -> tuple:
    """One recorded training step: ``(findings by (op, phase, module), torch's flags, op counts, ops the
    table does not know)``; the forward and the loss run inside ``forward_scope()`` when given (the twins'
    router, as in training)."""
    tracker = _ModuleTracker(student)
    recorder = _make_recorder(tracker, version)
    try:
        with temporary_determinism(True, warn_only=True):
            step = _TrainingStep(student, images, loss_factory, amp)
            _, flags = _record(recorder, "forward", lambda: _in_scope(forward_scope, lambda: step.forward(tracker)))
            if step.loss is not None:
                flags += _record(recorder, "backward", step.backward)[1]
                flags += _record(recorder, "step", lambda: step.step(tracker))[1]
    finally:
        tracker.remove()
    unique_flags = list({(f["op"], f["phase"]): f for f in flags}.values())
    return recorder.findings, unique_flags, dict(recorder.op_counts), list(recorder.unverified.values())


def _in_scope(forward_scope: ForwardScope | None, step: Callable):
    with forward_scope() if forward_scope is not None else contextlib.nullcontext():
        return step()


def _meta_findings(model: nn.Module, images: torch.Tensor, version: str,
                   forward_scope: ForwardScope | None = None) -> tuple:
    """``(findings, '')`` of the step traced on ``meta`` with CUDA's branches, or ``(None, why not)``."""
    student = _training_copy(model).to("meta")
    meta_images = torch.empty(images.shape, device="meta").contiguous(memory_format=torch.channels_last)
    try:
        with cuda_branch_trace(version):
            return _run_step(student, as_cuda_branch(meta_images), sum_of_outputs, False, version,
                             forward_scope)[0], ""
    except (NotImplementedError, RuntimeError) as e:  # an op without a meta kernel, or one that needs values
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        op = re.search(r"\w+::\w+", first)
        return None, op.group(0) if op else first[:80]


def _with_cuda(finding: Finding | None, like: Finding, note: str = "") -> Finding:
    """``finding`` (or ``like`` with no devices) that also fails on CUDA, ``note`` added to its reason."""
    base = finding or replace(like, devices=())
    return replace(base, devices=base.devices + ("cuda",), reason=base.reason + (f"; {note}" if note else ""))


def predict_cuda(cpu: dict, meta: dict | None, meta_failure: str = "") -> list:
    """Findings of a CPU audit: CPU failures from the CPU trace, CUDA ones from the meta trace.

    The loss's CUDA failures come from the CPU trace (the meta trace replaces the loss), and so do
    all of them when ``meta`` is None, its trace having failed with ``meta_failure``.
    """
    fallback = f"CUDA predicted from the CPU trace: meta has no kernel ({meta_failure})"
    merged = {key: replace(f, devices=("cpu",)) for key, f in cpu.items() if "cpu" in f.devices}
    for key, f in cpu.items():
        if "cuda" in f.devices and (meta is None or f.module == "loss"):
            merged[key] = _with_cuda(merged.get(key), f, fallback if meta is None else LOSS_FROM_CPU)
    for key, f in (meta or {}).items():
        if "cuda" in f.devices and f.module != "loss":
            merged[key] = _with_cuda(merged.get(key), f)
    return list(merged.values())


def audit_model(model: nn.Module, imgsz: int = 64, device="cpu", batch_size: int = 2, ch: int | None = None,
                loss_factory: LossFactory | None = None, amp: bool = False,
                torch_version: str = torch.__version__, forward_scope: ForwardScope | None = None) -> AuditReport:
    """Audit one training step on a ``(batch_size, ch, imgsz, imgsz)`` input; return the report.

    The step runs on deep copies (model, optimizer, EMA), so ``model`` and the RNG streams are
    left exactly as they were; ``model`` must already be on ``device``. ``loss_factory(copy,
    images)`` returns the loss callable (default :func:`sum_of_outputs`; :func:`detection_loss`
    for YOLO models); ``amp`` runs the forward under autocast as train.py does on CUDA. Every
    aten op is matched against the op table rows for ``torch_version`` (the GPU proof's replay
    predicts another release's GPU); the step runs under
    ``use_deterministic_algorithms(True, warn_only=True)``, so ``torch_flagged`` holds what torch
    itself reports on this device. On a CPU the CUDA findings come from a second trace on
    ``meta`` (:func:`predict_cuda`). ``batch_size`` must be at least 2 (BatchNorm on a 1x1 map
    needs two values per channel). ``forward_scope()`` (a context manager factory, e.g. the
    deterministic twins' router) is entered around the forward and the loss, as training enters it.
    """
    if batch_size < 2:
        raise ValueError(f"audit batch_size {batch_size}: must be at least 2 (BatchNorm needs two values)")
    device = torch.device(device)
    student = _training_copy(model)
    generator = torch.Generator().manual_seed(0)  # the input must not draw from the global stream
    images = torch.rand((batch_size, ch or input_channels(student), imgsz, imgsz), generator=generator)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    on_meta = device.type == "meta"  # a meta audit stands in for CUDA: it takes CUDA's branches
    with preserved_rng_state(device), cuda_branch_trace(torch_version) if on_meta else contextlib.nullcontext():
        images = as_cuda_branch(images) if on_meta else images
        found, flags, counts, unverified = _run_step(student, images, loss_factory or sum_of_outputs, amp,
                                                     torch_version, forward_scope)
        findings, cuda_trace = list(found.values()), str(device)
        if device.type == "cpu":
            meta, failure = _meta_findings(model, images, torch_version, forward_scope)
            findings = predict_cuda(found, meta, failure)
            cuda_trace = META_TRACE if meta is not None else f"cpu (meta has no kernel: {failure})"
    return AuditReport(device=str(device), imgsz=imgsz, findings=findings, torch_flagged=flags, op_counts=counts,
                       batch_size=batch_size, cuda_trace=cuda_trace, unverified=unverified)
