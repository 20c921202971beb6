"""PyTorch helpers: device selection, EMA, optimizer groups, model info, and the determinism policy.

The policy's public face lives here: four modes (``off``, ``warn``, ``scoped``, ``strict``; see
:func:`configure_determinism`), :func:`temporary_determinism`, and :class:`DeterminismPolicy`,
whose backward scope can relax ``torch.use_deterministic_algorithms`` for the backward pass only
and which adopts the op audit's report. The audit itself (op table, tracer, report) is
``utils/determinism/op_audit.py``; its command is ``python audit.py --cfg MODEL.yaml``.
"""

import contextlib
import math
import os
import sys
import time
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from utils.ddp import dist_info_from_env
from utils.env_vars import recorded
from utils.determinism.messages import (adoption_summary, scoped_failure_message, strict_failure_message,
                                        strict_unverified_message, unverified_warning)
from utils.errors import UserError
from utils.logging import LOGGER, colorstr
from utils.rng_state import seed_everything


# ----------------------------------------------------------------------------- devices


def _parse_device_request(device) -> str:
    """Normalise a ``--device`` value: ``'cuda:0'`` -> ``'0'``, ``None``/``'none'`` -> ``''``."""
    request = str(device if device is not None else "").strip().lower()
    request = request.replace("cuda:", "").replace(" ", "")
    return "" if request == "none" else request


def _cuda_ids(request: str) -> list[int]:
    """``'0,1'`` -> ``[0, 1]``; anything that is not a list of distinct indices is a UserError."""
    parts = request.split(",")
    if not all(p.isdigit() for p in parts):
        raise UserError(f"--device {request!r}: expected 'cpu', 'cuda' (the default GPU), a CUDA index such as 0, "
                        "or a comma-separated list such as 0,1")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise UserError(f"--device {request!r}: a CUDA index is listed twice; list each GPU once")
    return ids


_exported_mask = None  # the CUDA_VISIBLE_DEVICES value select_device last exported in this process


def _masked_ids(ids: list[int], device) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries for the requested ``ids``.

    A mask this process was started with (a user's ``CUDA_VISIBLE_DEVICES=2,3``, or a parent such
    as the GPU proof that selected a GPU) already renumbered the GPUs, so ``ids`` count within it;
    a mask this process exported itself is replaced, as the indices count the same GPUs as before.
    """
    mask = recorded("CUDA_VISIBLE_DEVICES")
    if mask is None or mask == _exported_mask:
        return [str(i) for i in ids]
    visible = [entry.strip() for entry in mask.split(",") if entry.strip()]
    if max(ids) >= len(visible):
        raise UserError(f"--device {device!r}: CUDA_VISIBLE_DEVICES={mask!r} leaves {len(visible)} GPU(s) "
                        f"visible (indices 0..{len(visible) - 1}); choose among them or unset it")
    return [visible[i] for i in ids]


def _describe_cuda(index: int) -> str:
    """``'CUDA:0 (NVIDIA H200, 143771MiB)'`` for the visible device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return f"CUDA:{index} ({props.name}, {props.total_memory / (1 << 20):.0f}MiB)"


def select_device(device="", batch_size: int = 0) -> torch.device:
    """Turn a ``--device`` value into a ``torch.device`` (YOLOv5 semantics).

    ``'cpu'`` -> CPU; ``'0'`` or ``'0,1'`` -> those CUDA devices; ``''`` -> ``cuda:0`` when CUDA is
    available, else CPU; ``'cuda'`` (torch's own spelling) -> as ``''``, but CUDA is required. Under DDP
    (``LOCAL_RANK`` set) the process gets the ``LOCAL_RANK``-th listed GPU. When CUDA is not yet
    initialised, an explicit GPU list is exported as ``CUDA_VISIBLE_DEVICES`` before the first CUDA call
    (so child processes and DDP ranks see the same GPUs) and indices are renumbered from 0; the indices
    count within a mask the process was started with (:func:`_masked_ids`). Once CUDA is initialised the
    variable would have no effect, so it is left alone and the index is used as given. CPU requests never
    touch the variable, because hiding GPUs would leak into everything else running in this process.
    Invalid requests and a ``batch_size`` not divisible by the GPU count raise UserError.
    """
    global _exported_mask
    request = _parse_device_request(device)
    header = f"Python-{sys.version.split()[0]} torch-{torch.__version__} "
    default_gpu = request in ("", "cuda")
    exported = not default_gpu and request not in ("cpu", "mps") and not torch.cuda.is_initialized()
    if exported:
        # The driver reads the variable once, at its first call, and torch.cuda.is_available() below is such a
        # call: exporting after it would leave the renumbered cuda:0 pointing at physical GPU 0.
        physical = _masked_ids(_cuda_ids(request), device)
        _exported_mask = os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical)
    if request == "cpu" or (request == "" and not torch.cuda.is_available()):
        LOGGER.info(f"{header}CPU")
        return torch.device("cpu")
    if request == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise UserError("--device mps: Apple MPS is not available on this machine; use --device cpu")
        LOGGER.info(f"{header}MPS")
        return torch.device("mps")
    if not torch.cuda.is_available():
        which = f" for device(s) {request}; choose among the indices nvidia-smi -L lists, or" if exported else ";"
        raise UserError(f"--device {device!r}: CUDA is not available on this machine (torch {torch.__version__})"
                        f"{which} use --device cpu")
    ids = list(range(len(physical))) if exported else ([0] if default_gpu else _cuda_ids(request))
    available = torch.cuda.device_count()
    if exported and available < len(ids):
        raise UserError(f"--device {device!r}: only {available} of CUDA device(s) {request} exist on this machine; "
                        "choose among the indices that nvidia-smi -L lists")
    if max(ids) >= available:
        raise UserError(f"--device {device!r}: this machine has {available} visible CUDA device(s) "
                        f"(indices 0..{available - 1}); choose among them")
    if len(ids) > 1 and batch_size > 0 and batch_size % len(ids):
        raise UserError(f"--batch-size {batch_size} is not a multiple of the {len(ids)} GPUs in "
                        f"--device {device}; use a multiple of {len(ids)}")
    local_rank = dist_info_from_env().local_rank
    slot = max(local_rank, 0)
    if slot >= len(ids):
        raise UserError(f"--device {device!r}: LOCAL_RANK {local_rank} needs at least {slot + 1} GPUs "
                        "in --device; list one GPU per process")
    LOGGER.info(header + ", ".join(_describe_cuda(i) for i in ids))
    return torch.device("cuda", ids[slot])


def cudnn_version() -> int | None:
    """cuDNN's version where CUDA is available, else None. Asking loads the library: on a machine without a
    usable GPU under an address-space limit (``ulimit -v``, common on shared clusters) that load aborts the
    process (SIGABRT, "Cannot load symbol cudnnGetVersion"), so nothing else here may ask."""
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        return torch.backends.cudnn.version()
    return None


def time_sync() -> float:
    """Seconds from a monotonic clock, after waiting for queued CUDA work (accurate GPU timing)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


# ----------------------------------------------------------------------------- models


def is_parallel(model) -> bool:
    """True for ``nn.DataParallel`` / ``DistributedDataParallel`` wrappers."""
    return isinstance(model, (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel))


def de_parallel(model) -> nn.Module:
    """The bare model inside a DP/DDP wrapper (the model itself otherwise)."""
    return model.module if is_parallel(model) else model


def grid_size(model) -> int:
    """The model's largest stride, at least 32: image sizes and letterbox padding are multiples of it."""
    return max(int(model.stride.max()), 32)


def intersect_dicts(da: dict, db: dict, exclude=()) -> dict:
    """Entries of ``da`` whose key is in ``db`` with the same shape and contains no ``exclude`` substring."""
    return {k: v for k, v in da.items()
            if k in db and not any(x in k for x in exclude) and v.shape == db[k].shape}


def freeze_layers(model, freeze: list) -> list:
    """Freeze ``--freeze N`` (first N layers) or ``--freeze i j k`` (those layers). Returns frozen prefixes."""
    prefixes = [f"model.{i}." for i in (freeze if len(freeze) > 1 else range(freeze[0]))]
    for name, param in model.named_parameters():
        param.requires_grad = not any(name.startswith(prefix) for prefix in prefixes)
    if not any(param.requires_grad for param in model.parameters()):
        raise UserError(f"--freeze {' '.join(map(str, freeze))}: freezes every layer of this {len(model.model)}-layer "
                        "model, so nothing would train; freeze fewer layers")
    if prefixes:
        LOGGER.info(f"Freezing {len(prefixes)} layers: {', '.join(p.rstrip('.') for p in prefixes)}")
    return prefixes


def input_channels(model: nn.Module) -> int:
    """Input channels: ``model.yaml['ch']`` when present, else the first conv weight's dim 1."""
    yaml_dict = getattr(model, "yaml", None)
    if isinstance(yaml_dict, dict) and isinstance(yaml_dict.get("ch"), int):
        return yaml_dict["ch"]
    for p in model.parameters():
        if p.dim() == 4:
            return p.shape[1]
    return 3


def _gflops(model: nn.Module, imgsz) -> float | None:
    """GFLOPs at ``imgsz`` (int or (h, w)), profiled on a copy at the model's max stride and scaled.

    Profiling at a small size keeps this cheap; conv FLOPs scale with the pixel count.
    Returns None when thop is missing or the model cannot be profiled at that size.
    """
    try:
        import thop
    except ImportError:
        return None
    try:
        p = next(model.parameters())
        stride = grid_size(model) if hasattr(model, "stride") else 32
        im = torch.zeros((1, input_channels(model), stride, stride), device=p.device, dtype=p.dtype)
        with torch.no_grad():
            # eval mode: a training-mode copy would draw from the global RNG (DropPath) and shift
            # the random stream of the run that asked for the summary
            macs = thop.profile(deepcopy(model).eval(), inputs=(im,), verbose=False)[0]
    except Exception as e:  # thop fails on unusual modules; the summary is still useful without FLOPs
        LOGGER.debug(f"model_info: FLOPs not computed ({type(e).__name__}: {e})")
        return None
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    return macs * 2 / 1e9 * (h / stride) * (w / stride)


def model_info(model: nn.Module, verbose: bool = False, imgsz=640) -> tuple:
    """Log ``NAME summary: L layers, P parameters, G gradients, X GFLOPs``; return ``(L, P, G, X)``.

    ``X`` is None when FLOPs could not be computed (the log line then omits it).
    """
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    n_grads = sum(p.numel() for p in params if p.requires_grad)
    n_layers = len(list(model.modules()))
    if verbose:
        LOGGER.info(f"{'layer':>5} {'name':>40} {'gradient':>9} {'parameters':>12} {'shape':>20}")
        for i, (name, p) in enumerate(model.named_parameters()):
            LOGGER.info(f"{i:5g} {name:>40} {str(p.requires_grad):>9} {p.numel():12g} {str(list(p.shape)):>20}")
    gflops = _gflops(model, imgsz)
    yaml_file = getattr(model, "yaml_file", None) or (getattr(model, "yaml", None) or {}).get("yaml_file")
    name = Path(yaml_file).stem if yaml_file else type(model).__name__
    flops_text = f", {gflops:.1f} GFLOPs" if gflops is not None else ""
    LOGGER.info(f"{name} summary: {n_layers} layers, {n_params} parameters, {n_grads} gradients{flops_text}")
    return n_layers, n_params, n_grads, gflops


class ModelEMA:
    """Exponential moving average of a model's state (YOLOv5's ModelEMA).

    ``ema = decay * (1 - exp(-updates / tau))`` ramps the decay up from 0, so early weights are
    forgotten quickly. The copy ``.ema`` is fp32, in eval mode, and has no gradients.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0):
        self.ema = deepcopy(de_parallel(model)).float().eval()
        self.updates = updates
        self.decay_max = decay
        self.tau = tau
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def decay(self, updates: int) -> float:
        """The ramped decay after ``updates`` updates."""
        return self.decay_max * (1 - math.exp(-updates / self.tau))

    def update(self, model: nn.Module) -> None:
        """Blend the model's floating-point state into ``.ema``: ``ema = d * ema + (1 - d) * model``."""
        self.updates += 1
        d = self.decay(self.updates)
        model_state = de_parallel(model).state_dict()
        ema_values, model_values = [], []
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                ema_values.append(v)
                model_values.append(model_state[k].detach().to(v.dtype))
        with torch.no_grad():  # the same two rounded steps per element as v.mul_(d).add_(m, alpha=1 - d)
            torch._foreach_mul_(ema_values, d)
            torch._foreach_add_(ema_values, model_values, alpha=1 - d)

    def update_attr(self, model: nn.Module, include=(), exclude=("process_group", "reducer")) -> None:
        """Copy plain attributes (e.g. ``names``, ``nc``, ``hyp``) from ``model`` to ``.ema``."""
        for k, v in de_parallel(model).__dict__.items():
            if (include and k not in include) or k.startswith("_") or k in exclude:
                continue
            setattr(self.ema, k, v)


def smart_optimizer(model: nn.Module, name: str = "SGD", lr: float = 0.001, momentum: float = 0.9,
                    decay: float = 1e-5) -> torch.optim.Optimizer:
    """An optimizer with YOLOv5's three parameter groups.

    Group 0: biases (no weight decay); group 1: other weights (``weight_decay=decay``);
    group 2: normalisation-layer weights (no decay). Warm-up code relies on group 0 being biases.
    SGD uses Nesterov momentum; Adam/AdamW use ``betas=(momentum, 0.999)``.
    """
    norm_types = tuple(v for k, v in nn.__dict__.items() if "Norm" in k and isinstance(v, type))
    biases, weights, norm_weights = [], [], []
    for module in model.modules():
        for p_name, p in module.named_parameters(recurse=False):
            if p_name == "bias":
                biases.append(p)
            elif p_name == "weight" and isinstance(module, norm_types):
                norm_weights.append(p)
            else:
                weights.append(p)
    # all three groups at construction: a model without biases (group 0 empty) is still valid
    groups = [{"params": biases, "weight_decay": 0.0}, {"params": weights, "weight_decay": decay},
              {"params": norm_weights, "weight_decay": 0.0}]
    key = str(name).lower()
    if key == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    elif key == "adam":
        optimizer = torch.optim.Adam(groups, lr=lr, betas=(momentum, 0.999))
    elif key == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999))
    else:
        raise UserError(f"--optimizer {name!r}: unknown optimizer; choose SGD, Adam or AdamW")
    LOGGER.info(f"{colorstr('optimizer:')} {type(optimizer).__name__}(lr={lr}) with parameter groups "
                f"{len(norm_weights)} weight(decay=0.0), {len(weights)} weight(decay={decay}), {len(biases)} bias")
    return optimizer


class EarlyStopping:
    """Stop when fitness has not improved for ``patience`` epochs (0 disables); state survives resume."""

    def __init__(self, patience: int = 30):
        self.patience = patience
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.last_epoch = -1
        self.possible_stop = False  # True when the next epoch without improvement stops training

    def __call__(self, epoch: int, fitness: float) -> bool:
        """Record ``fitness`` for ``epoch``; return True when training should stop."""
        fitness = float(fitness)
        if fitness >= self.best_fitness:  # >= so a plateau at the start (fitness 0) counts as progress
            self.best_epoch = epoch
            self.best_fitness = fitness
        self.last_epoch = epoch
        stop = self._waited_out(0)
        self.possible_stop = self._waited_out(1)
        if stop:
            LOGGER.info(f"Stopping training early: no improvement in the last {self.patience} epochs; "
                        f"best results at epoch {self.best_epoch}. Use --patience 0 to disable, "
                        "or e.g. --patience 300 to wait longer.")
        return stop

    def _waited_out(self, epochs_left: int) -> bool:
        """Whether ``epochs_left`` more epochs without improvement reach the patience."""
        return self.last_epoch - self.best_epoch + epochs_left >= (self.patience or float("inf"))

    def state_dict(self) -> dict:
        """Plain data for a checkpoint."""
        return {"patience": self.patience, "best_fitness": self.best_fitness, "best_epoch": self.best_epoch,
                "last_epoch": self.last_epoch, "possible_stop": self.possible_stop}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` output. The patience is the current run's flag, which a resume may
        change (waiting longer, or not stopping early, changes when a run ends, never what an epoch computes)."""
        self.best_fitness = float(state["best_fitness"])
        self.best_epoch = int(state["best_epoch"])
        self.possible_stop = bool(state["possible_stop"])
        if "last_epoch" in state:  # checkpoints written before it was saved keep their possible_stop
            self.last_epoch = int(state["last_epoch"])
            self.possible_stop = self._waited_out(1)


# ----------------------------------------------------------------------------- determinism policy

MODES = ("off", "warn", "scoped", "strict")
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
_CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")  # the two settings NVIDIA documents as deterministic


def _algorithm_flags() -> tuple[bool, bool]:
    """``(use_deterministic_algorithms enabled, warn_only)`` right now."""
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


@contextlib.contextmanager
def temporary_determinism(flag: bool = False, warn_only: bool = False):
    """Set ``torch.use_deterministic_algorithms(flag, warn_only=warn_only)`` inside the block.

    On exit, also when the block raises, the previous mode *and* the previous ``warn_only`` come
    back exactly, so nested blocks unwind level by level.
    """
    previous_mode, previous_warn_only = _algorithm_flags()
    set_deterministic_algorithms(flag, warn_only=warn_only)
    try:
        yield
    finally:
        set_deterministic_algorithms(previous_mode, warn_only=previous_warn_only)


def set_deterministic_algorithms(flag: bool, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms(flag, warn_only=warn_only)`` without its import of torch._inductor.

    Since torch 2.5 that call imports ``torch._inductor.config`` (2.4 s of start-up on the 2-core machine, in
    every process) only to set inductor's own ``deterministic`` switch. Here the switch is set where inductor
    is loaded already; a process that compiles later reads it from ``TORCHINDUCTOR_DETERMINISTIC``, which
    :func:`configure_determinism` exports for the process's mode.
    """
    torch._C._set_deterministic_algorithms(flag, warn_only=warn_only)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = flag


def determinism_state() -> dict:
    """The process-wide determinism settings as plain data (for reports and the environment dump)."""
    enabled, warn_only = _algorithm_flags()
    fill_memory = getattr(getattr(torch.utils, "deterministic", None), "fill_uninitialized_memory", None)
    return {
        "deterministic_algorithms": enabled,
        "warn_only": warn_only,
        "debug_mode": torch.get_deterministic_debug_mode(),  # 0 off, 1 warn, 2 error
        "fill_uninitialized_memory": fill_memory,
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "CUBLAS_WORKSPACE_CONFIG": recorded("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": recorded("PYTHONHASHSEED"),
    }


# use_deterministic_algorithms also NaN-fills every new tensor, so that a kernel reading memory it never wrote
# shows. It took about a tenth of a CPU training step (docs/performance.md), and it cannot change a result
# unless such a read happens: training is bit-identical with and without it (tests/test_nan_fill.py), and
# without it such a read would make repeated runs differ, which the reproducibility tests and the GPU proof
# would catch.
NAN_FILL_UNINITIALIZED = False

# The distinctive words of the too-late warning below; the GPU proof searches run logs for them.
CUBLAS_TOO_LATE = "now has no effect on cuBLAS"


def _ensure_cublas_workspace() -> None:
    """Export ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS is only deterministic with it).

    cuBLAS reads the variable when CUDA creates its handles, so it must be set before any CUDA
    work; if CUDA is already initialised with another value, say that setting it now is too late.
    """
    current = recorded("CUBLAS_WORKSPACE_CONFIG")
    if current in _CUBLAS_DETERMINISTIC_VALUES:
        return
    if torch.cuda.is_initialized():  # not is_available(): it starts the driver before select_device picks a GPU
        LOGGER.warning(f"CUDA was initialised with CUBLAS_WORKSPACE_CONFIG={current}; setting "
                       f"{CUBLAS_WORKSPACE_CONFIG} {CUBLAS_TOO_LATE} in this process. Export "
                       f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE_CONFIG} before starting Python.")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG


def prepare_cuda_environment(mode: str) -> None:
    """Before anything touches CUDA: export what a determinism ``mode`` needs from the environment."""
    if _check_mode(mode) != "off":
        _ensure_cublas_workspace()
        _disable_nccl_nvls()


def _disable_nccl_nvls() -> None:
    """NCCL's NVLS all-reduce (NVSwitch H100/H200 nodes) is not run-to-run deterministic (NVIDIA/nccl#1497).

    DDP's gradients are gathered, not all-reduced, in these modes, but NCCL also all-reduces
    elsewhere (SyncBatchNorm, user code); NCCL reads the variable when its communicator starts.
    """
    current = recorded("NCCL_NVLS_ENABLE")
    if current not in (None, "0"):
        LOGGER.warning(f"NCCL_NVLS_ENABLE={current} overridden with 0: NVLS all-reduce is not deterministic "
                       "(use --deterministic off to keep it)")
    os.environ["NCCL_NVLS_ENABLE"] = "0"


def _check_mode(mode) -> str:
    """Normalise a ``--deterministic`` value (bools map to strict/off); unknown values are a UserError."""
    if isinstance(mode, bool) or mode is None:
        return "strict" if mode else "off"
    key = str(mode).strip().lower()
    if key not in MODES:
        raise UserError(f"--deterministic {mode!r}: unknown mode; choose one of {', '.join(MODES)}")
    return key


def _check_seed(seed) -> int:
    """A seed NumPy accepts: an int in [0, 2**32)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 32:
        raise UserError(f"--seed {seed!r}: expected an integer from 0 to {2 ** 32 - 1}")
    return int(seed)


@dataclass
class DeterminismPolicy:
    """The run's determinism mode, made by :func:`configure_determinism`; train.py consults it.

    ``relax_backward`` says whether :meth:`backward_scope` switches determinism off around the
    backward pass; it is only ever True in ``scoped`` mode (True until an audit says otherwise).
    ``twins`` (a ``utils.determinism.twins.plan.TwinPlan``, scoped and strict only) are the deterministic
    twins :meth:`forward_scope` routes the training forward through, set before the audit is adopted.
    """

    mode: str
    seed: int
    rank: int = -1
    relax_backward: bool = False
    audit_summary: str | None = None
    audit: dict | None = None
    nondeterministic_ops: dict = field(default_factory=dict)
    twins: object = None

    def forward_scope(self):
        """Context manager for the training forward: routes ops to the run's deterministic twins, if any."""
        return self.twins.routing() if self.twins is not None else contextlib.nullcontext()

    def backward_scope(self):
        """Context manager for ``loss.backward()``: relaxes determinism only in scoped mode when needed.

        cuDNN stays deterministic; mode and ``warn_only`` are restored exactly, also on exceptions.
        """
        if self.mode == "scoped" and self.relax_backward:
            return temporary_determinism(False)
        return contextlib.nullcontext()

    def adopt_audit(self, report) -> str:
        """Apply an :func:`audit_model` report to this run and return one line to log.

        ``strict``: findings that fail on the audited device (or ops torch itself flagged) raise a
        UserError naming op, phase, module and the ways out. ``scoped``: the backward is relaxed
        only if backward ops need it; forward and step ops (optimizer, EMA) cannot be relaxed, so
        they stop the run here with a UserError as strict does, not at the first batch. Silent
        findings (no alert, result varies) stop strict; scoped and warn report them, relaxing nothing.
        Ops outside the op table (``report.unverified``, recorded with the report) stop strict and are
        warned about by scoped and warn.
        ``report`` is a ``utils.determinism.op_audit.AuditReport``.
        """
        failing = report.applicable()
        if self.mode == "strict" and report.unverified and not failing:
            raise UserError(strict_unverified_message(report.unverified))
        if self.mode in ("scoped", "warn") and report.unverified:
            LOGGER.warning(unverified_warning(self.mode, report.unverified))
        silent = [f for f in failing if f.silent]
        backward = [f for f in failing if f.phase == "backward" and not f.silent]
        forward = [f for f in failing if f.phase != "backward" and not f.silent]  # nothing relaxes them
        if self.mode == "strict" and failing:
            raise UserError(strict_failure_message(report.device, failing))
        if self.mode == "scoped" and forward:  # torch would raise at the first batch, with a traceback
            raise UserError(scoped_failure_message(report.device, forward))
        if self.mode == "scoped":
            self.relax_backward = bool(backward)
        relaxed = backward if self.relax_backward else []
        counted = relaxed + silent if self.mode == "scoped" else failing if self.mode == "warn" else []
        self.nondeterministic_ops = {op: sum(f.op == op for f in counted) for op in sorted({f.op for f in counted})}
        summary = adoption_summary(self.mode, report, backward, forward, self.relax_backward, silent, self.twins)
        self.audit_summary = summary
        self.audit = report.to_dict()
        return summary

    def state(self) -> dict:
        """Plain data for the run's determinism report: the mode, the seed and every global flag.

        The audit and the relaxed ops are not repeated here: the report holds them once, at its top level.
        """
        return {"mode": self.mode, "seed": self.seed, "rank": self.rank,
                "relax_backward": self.relax_backward, **determinism_state(),
                "audit_summary": self.audit_summary}


def configure_determinism(mode: str, seed: int = 0, rank: int = -1) -> DeterminismPolicy:
    """The single entry point: seed every RNG and set the determinism mode process-wide.

    Modes (``--deterministic``):

    - ``off``: seeds set, fastest kernels, ``cudnn.benchmark`` on.
    - ``warn``: ``use_deterministic_algorithms(True, warn_only=True)``; torch warns at every op
      without a deterministic implementation and nothing stops.
    - ``scoped``: deterministic everywhere, but :meth:`DeterminismPolicy.backward_scope` may relax
      the backward pass (after an audit, only if a backward op needs it).
    - ``strict``: deterministic everywhere; such an op raises RuntimeError.

    All modes but ``off`` turn on ``cudnn.deterministic`` (benchmark off) and export
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8``. Every rank uses the same ``seed``: DDP broadcasts rank 0's
    weights anyway, and per-rank randomness (augmentation) comes from the data loader, which
    seeds by (seed, epoch, rank) itself; ``rank`` is recorded for the report.
    ``PYTHONHASHSEED`` only takes effect when the interpreter starts, so it is recorded, never set
    here; export it in the launcher (shell, Dockerfile) if set/dict ordering of strings matters.
    """
    mode = _check_mode(mode)
    seed = _check_seed(seed)
    deterministic = mode != "off"
    if deterministic:
        _ensure_cublas_workspace()
    seed_everything(seed)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    set_deterministic_algorithms(deterministic, warn_only=mode == "warn")
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1" if deterministic else "0"  # for an inductor loaded later
    torch.utils.deterministic.fill_uninitialized_memory = NAN_FILL_UNINITIALIZED
    return DeterminismPolicy(mode=mode, seed=seed, rank=rank, relax_backward=mode == "scoped")


