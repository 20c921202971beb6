"""PyTorch helpers: device selection, EMA, optimizer groups, model info, RNG state, and the determinism policy.

This module is the one home of determinism in the project. The policy has four modes
(``off``, ``warn``, ``scoped``, ``strict``; see :func:`configure_determinism`), a backward
scope that can relax ``torch.use_deterministic_algorithms`` for the backward pass only, and an
op audit (:func:`audit_model`) that predicts from any device which ops of a model will fail
under determinism on CUDA. ``python -m utils.torch_utils --audit --cfg MODEL.yaml`` prints it.
"""

import argparse
import contextlib
import math
import os
import random
import sys
import threading
import time
import warnings
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from utils.errors import UserError
from utils.logging import LOGGER, colorstr

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))  # set by torch.distributed.run; -1 outside DDP


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
        raise UserError(f"--device {request!r}: expected 'cpu', a CUDA index such as 0, "
                        "or a comma-separated list such as 0,1")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise UserError(f"--device {request!r}: a CUDA index is listed twice; list each GPU once")
    return ids


def _describe_cuda(index: int) -> str:
    """``'CUDA:0 (NVIDIA H200, 143771MiB)'`` for the visible device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return f"CUDA:{index} ({props.name}, {props.total_memory / (1 << 20):.0f}MiB)"


def select_device(device="", batch_size: int = 0) -> torch.device:
    """Turn a ``--device`` value into a ``torch.device`` (YOLOv5 semantics).

    ``'cpu'`` -> CPU; ``'0'`` or ``'0,1'`` -> those CUDA devices; ``''`` -> ``cuda:0`` when CUDA is
    available, else CPU. Under DDP (``LOCAL_RANK`` set) the process gets the ``LOCAL_RANK``-th
    listed GPU. When CUDA is not yet initialised, an explicit GPU list is exported as
    ``CUDA_VISIBLE_DEVICES`` (so child processes and DDP ranks see the same GPUs) and indices are
    renumbered from 0; once CUDA is initialised the variable would have no effect, so it is left
    alone and the physical index is used. CPU requests never touch the variable, because hiding
    GPUs would leak into everything else running in this process.
    Invalid requests and a ``batch_size`` not divisible by the GPU count raise UserError.
    """
    request = _parse_device_request(device)
    header = f"Python-{sys.version.split()[0]} torch-{torch.__version__} "
    if request == "cpu" or (request == "" and not torch.cuda.is_available()):
        LOGGER.info(f"{header}CPU")
        return torch.device("cpu")
    if request == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise UserError("--device mps: Apple MPS is not available on this machine; use --device cpu")
        LOGGER.info(f"{header}MPS")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise UserError(f"--device {device!r}: CUDA is not available on this machine "
                        f"(torch {torch.__version__}); use --device cpu")
    ids = _cuda_ids(request) if request else [0]
    available = torch.cuda.device_count()
    if max(ids) >= available:
        raise UserError(f"--device {device!r}: this machine has {available} visible CUDA device(s) "
                        f"(indices 0..{available - 1}); choose among them")
    if len(ids) > 1 and batch_size > 0 and batch_size % len(ids):
        raise UserError(f"--batch-size {batch_size} is not a multiple of the {len(ids)} GPUs in "
                        f"--device {device}; use a multiple of {len(ids)}")
    slot = max(LOCAL_RANK, 0)
    if slot >= len(ids):
        raise UserError(f"--device {device!r}: LOCAL_RANK {LOCAL_RANK} needs at least {slot + 1} GPUs "
                        "in --device; list one GPU per process")
    if request and not torch.cuda.is_initialized():
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
        ids = list(range(len(ids)))
    LOGGER.info(header + ", ".join(_describe_cuda(i) for i in ids))
    return torch.device("cuda", ids[slot])


def time_sync() -> float:
    """Seconds from a monotonic clock, after waiting for queued CUDA work (accurate GPU timing)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int):
    """Let local rank 0 run the block first (e.g. caching a data set); the other ranks wait, then run it."""
    barrier_args = {}
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        barrier_args = {"device_ids": [max(local_rank, 0)]}
    if local_rank not in (-1, 0):
        dist.barrier(**barrier_args)
    yield
    if local_rank == 0:
        dist.barrier(**barrier_args)


# ----------------------------------------------------------------------------- models


def is_parallel(model) -> bool:
    """True for ``nn.DataParallel`` / ``DistributedDataParallel`` wrappers."""
    return isinstance(model, (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel))


def de_parallel(model) -> nn.Module:
    """The bare model inside a DP/DDP wrapper (the model itself otherwise)."""
    return model.module if is_parallel(model) else model


def intersect_dicts(da: dict, db: dict, exclude=()) -> dict:
    """Entries of ``da`` whose key is in ``db`` with the same shape and contains no ``exclude`` substring."""
    return {k: v for k, v in da.items()
            if k in db and not any(x in k for x in exclude) and v.shape == db[k].shape}


def _input_channels(model: nn.Module) -> int:
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
        stride = max(int(model.stride.max()), 32) if hasattr(model, "stride") else 32
        im = torch.zeros((1, _input_channels(model), stride, stride), device=p.device, dtype=p.dtype)
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
    key = str(name).lower()
    if key == "sgd":
        optimizer = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True)
    elif key == "adam":
        optimizer = torch.optim.Adam(biases, lr=lr, betas=(momentum, 0.999))
    elif key == "adamw":
        optimizer = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
    else:
        raise UserError(f"--optimizer {name!r}: unknown optimizer; choose SGD, Adam or AdamW")
    optimizer.add_param_group({"params": weights, "weight_decay": decay})
    optimizer.add_param_group({"params": norm_weights, "weight_decay": 0.0})
    LOGGER.info(f"{colorstr('optimizer:')} {type(optimizer).__name__}(lr={lr}) with parameter groups "
                f"{len(norm_weights)} weight(decay=0.0), {len(weights)} weight(decay={decay}), {len(biases)} bias")
    return optimizer


class EarlyStopping:
    """Stop when fitness has not improved for ``patience`` epochs (0 disables); state survives resume."""

    def __init__(self, patience: int = 30):
        self.patience = patience
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.possible_stop = False  # True when the next epoch without improvement stops training

    def __call__(self, epoch: int, fitness: float) -> bool:
        """Record ``fitness`` for ``epoch``; return True when training should stop."""
        fitness = float(fitness)
        if fitness >= self.best_fitness:  # >= so a plateau at the start (fitness 0) counts as progress
            self.best_epoch = epoch
            self.best_fitness = fitness
        limit = self.patience or float("inf")
        waited = epoch - self.best_epoch
        self.possible_stop = waited >= limit - 1
        stop = waited >= limit
        if stop:
            LOGGER.info(f"Stopping training early: no improvement in the last {self.patience} epochs; "
                        f"best results at epoch {self.best_epoch}. Use --patience 0 to disable, "
                        "or e.g. --patience 300 to wait longer.")
        return stop

    def state_dict(self) -> dict:
        """Plain data for a checkpoint."""
        return {"patience": self.patience, "best_fitness": self.best_fitness,
                "best_epoch": self.best_epoch, "possible_stop": self.possible_stop}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` output (patience comes from the current run's flag)."""
        self.best_fitness = float(state["best_fitness"])
        self.best_epoch = int(state["best_epoch"])
        self.possible_stop = bool(state["possible_stop"])


# ----------------------------------------------------------------------------- RNG state and seeding


def get_rng_state() -> dict:
    """Every RNG stream as plain data that survives ``torch.save`` + ``torch.load(weights_only=True)``.

    Keys: ``python`` ([version, 625 ints, gauss_next]), ``numpy`` ([name, 624 ints, pos,
    has_gauss, cached_gaussian]), ``torch`` (uint8 CPU tensor), ``cuda`` (one uint8 tensor per
    device; empty when CUDA is not initialised, since then no CUDA stream has been drawn from
    and initialising it here would allocate a context on every GPU).
    """
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    cuda_states = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_states = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return {
        "python": [py_version, list(py_internal), py_gauss],
        "numpy": [np_name, [int(k) for k in np_keys], int(np_pos), int(np_has_gauss), float(np_cached)],
        "torch": torch.get_rng_state().clone(),
        "cuda": cuda_states,
    }


def set_rng_state(state: dict) -> None:
    """Restore streams saved by :func:`get_rng_state`; a malformed state is a UserError."""
    try:
        py_version, py_internal, py_gauss = state["python"]
        random.setstate((int(py_version), tuple(int(v) for v in py_internal), py_gauss))
        np_name, np_keys, np_pos, np_has_gauss, np_cached = state["numpy"]
        np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), int(np_pos),
                             int(np_has_gauss), float(np_cached)))
        torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
        cuda_states = state.get("cuda") or []
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"RNG state in the checkpoint is malformed ({type(e).__name__}: {e}); "
                        "the checkpoint was not written by this project's train.py") from None
    if cuda_states and torch.cuda.is_available():
        if len(cuda_states) != torch.cuda.device_count():
            LOGGER.warning(f"WARNING: checkpoint holds RNG state for {len(cuda_states)} CUDA devices, "
                           f"this machine has {torch.cuda.device_count()}; restoring the common ones")
        for index, s in enumerate(cuda_states[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu().to(torch.uint8), index)


def _seed_everything(seed: int) -> None:
    """Seed Python ``random``, NumPy, torch CPU and every CUDA device (lazily, if CUDA is not up yet)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also queues the seed for every CUDA device
    torch.cuda.manual_seed_all(seed)


def init_seeds(seed: int = 0, deterministic: bool = False) -> "DeterminismPolicy":
    """YOLOv5-style entry: seed everything; ``deterministic=True`` means mode ``strict``, else ``off``."""
    return configure_determinism("strict" if deterministic else "off", seed)


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
    torch.use_deterministic_algorithms(flag, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous_mode, warn_only=previous_warn_only)


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
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
    }


def _ensure_cublas_workspace() -> None:
    """Export ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS is only deterministic with it).

    cuBLAS reads the variable when CUDA creates its handles, so it must be set before any CUDA
    work; if CUDA is already initialised with another value, say that setting it now is too late.
    """
    current = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if current in _CUBLAS_DETERMINISTIC_VALUES:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        LOGGER.warning(f"WARNING: CUDA was initialised with CUBLAS_WORKSPACE_CONFIG={current}; setting "
                       f"{CUBLAS_WORKSPACE_CONFIG} now has no effect on cuBLAS in this process. Export "
                       f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE_CONFIG} before starting Python.")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG


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
    """

    mode: str
    seed: int
    rank: int = -1
    relax_backward: bool = False
    audit_summary: str | None = None
    audit: dict | None = None

    def backward_scope(self):
        """Context manager for ``loss.backward()``: relaxes determinism only in scoped mode when needed.

        cuDNN stays deterministic; mode and ``warn_only`` are restored exactly, also on exceptions.
        """
        if self.mode == "scoped" and self.relax_backward:
            return temporary_determinism(False)
        return contextlib.nullcontext()

    def adopt_audit(self, report: "AuditReport") -> str:
        """Apply an :func:`audit_model` report to this run and return one line to log.

        ``strict``: findings that fail on the audited device (or ops torch itself flagged) raise a
        UserError naming op, phase, module and the ways out. ``scoped``: the backward is relaxed
        only if backward ops need it; forward ops cannot be relaxed and are called out.
        """
        failing = report.applicable()
        backward = [f for f in failing if f.phase == "backward"]
        forward = [f for f in failing if f.phase == "forward"]
        if self.mode == "strict" and failing:
            raise UserError(_strict_failure_message(report.device, failing))
        if self.mode == "scoped":
            self.relax_backward = bool(backward)
        summary = _adoption_summary(self.mode, report, backward, forward, self.relax_backward)
        if self.mode == "scoped" and forward:
            LOGGER.warning(f"WARNING: {summary}")
        self.audit_summary = summary
        self.audit = report.to_dict()
        return summary

    def state(self) -> dict:
        """Plain data for the run's determinism report: the mode, the seed and every global flag."""
        return {"mode": self.mode, "seed": self.seed, "rank": self.rank,
                "relax_backward": self.relax_backward, **determinism_state(),
                "audit_summary": self.audit_summary, "audit": self.audit}


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
    _seed_everything(seed)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=mode == "warn")
    return DeterminismPolicy(mode=mode, seed=seed, rank=rank, relax_backward=mode == "scoped")


def _finding_text(f: "Finding") -> str:
    """``adaptive_max_pool2d_backward (backward, model.9 (SCAM))``."""
    return f"{f.op} ({f.phase}, {f.module})"


def _strict_failure_message(device: str, failing: list) -> str:
    """One line: what fails under strict on ``device`` and the ways out."""
    ops = "; ".join(_finding_text(f) for f in failing)
    return (f"--deterministic strict: {len(failing)} op(s) of this model have no deterministic "
            f"implementation on {device}: {ops}. Ways out: --deterministic scoped (relaxes only the "
            "backward pass), --deterministic warn (reports and continues), or replace the module with "
            "a deterministic one; see docs/determinism.md")


def _adoption_summary(mode: str, report: "AuditReport", backward: list, forward: list, relax: bool) -> str:
    """The line train.py logs after adopting an audit."""
    where = report.device
    if not report.findings:
        return f"determinism audit ({mode}): clean on {where}; full determinism kept"
    elsewhere = [f for f in report.findings if f not in backward and f not in forward]
    parts = [f"determinism audit ({mode}) on {where}:"]
    if backward:
        verb = "backward relaxed because of" if relax else "non-deterministic backward ops:"
        parts.append(f"{verb} {', '.join(_finding_text(f) for f in backward)}.")
    if forward:
        parts.append(f"forward ops the backward scope cannot fix (use --deterministic warn or replace the "
                     f"module): {', '.join(_finding_text(f) for f in forward)}.")
    if elsewhere:
        parts.append(f"would fail on {'/'.join(sorted({d for f in elsewhere for d in f.devices}))} only: "
                     f"{', '.join(_finding_text(f) for f in elsewhere)}.")
    if not backward and not forward:
        parts.append("nothing to relax here; full determinism kept.")
    return " ".join(parts)


# ----------------------------------------------------------------------------- the op table

CUDA_ONLY = ("cuda",)
CPU_AND_CUDA = ("cpu", "cuda")


def _argument_is(name: str, expected) -> Callable[[str, dict], bool]:
    """Condition: the op's argument ``name`` equals ``expected``."""
    return lambda overload, arguments: arguments.get(name) == expected


@dataclass(frozen=True)
class NondeterministicOp:
    """One row of the op table: aten ops torch documents as throwing under determinism.

    ``doc_names`` are the names used in ``torch.use_deterministic_algorithms.__doc__``'s
    "will throw a RuntimeError" list; ``aten`` the overload packets the audit sees at dispatch
    (backward kernels for "when attempting to differentiate"); ``devices`` where it throws;
    ``applies(overload, arguments)`` narrows argument-dependent rows (None: always).
    """

    doc_names: tuple
    aten: tuple
    devices: tuple
    condition: str = ""
    applies: Callable[[str, dict], bool] | None = None

    @property
    def reason(self) -> str:
        """Human-readable source of the row, e.g. ``torch.Tensor.put_ with accumulate=False``."""
        return " / ".join(self.doc_names) + (f" with {self.condition}" if self.condition else "")


# Built from torch.use_deterministic_algorithms.__doc__ (torch 2.x); tests/test_determinism.py
# cross-checks it against the installed torch in both directions, so an upgrade that adds or
# retires an entry fails the suite. Ops torch documents as switching to a deterministic
# algorithm (index_add, scatter_add_, cumsum, ...) are not failures and are not listed.
NONDETERMINISTIC_OPS = (
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
    # Only the image-shaped (2-D target) NLL kernel accumulates with atomics in ATen.
    NondeterministicOp(("torch.nn.NLLLoss",), ("nll_loss2d_forward",), CUDA_ONLY),
    NondeterministicOp(("torch.nn.CTCLoss",), ("_ctc_loss_backward",), CUDA_ONLY),
    # aten encodes EmbeddingBag's mode as an int: 0 sum, 1 mean, 2 max.
    NondeterministicOp(("torch.nn.EmbeddingBag",), ("_embedding_bag_backward", "_embedding_bag_dense_backward"),
                       CUDA_ONLY, "mode='max'", _argument_is("mode", 2)),
    NondeterministicOp(("torch.Tensor.put_",), ("put_", "put"), CPU_AND_CUDA, "accumulate=False",
                       _argument_is("accumulate", False)),
    NondeterministicOp(("torch.Tensor.put_",), ("put_", "put"), CUDA_ONLY, "accumulate=True",
                       _argument_is("accumulate", True)),
    NondeterministicOp(("torch.histc",), ("histc",), CUDA_ONLY),
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


# ----------------------------------------------------------------------------- the op audit

_MODULE_KEY = "determinism_audit_module"  # key in autograd Node.metadata
_OUTSIDE_MODEL = "(outside the model)"
_TORCH_ALERT = " does not have a deterministic implementation"


@dataclass(frozen=True)
class Finding:
    """An op without a deterministic implementation on ``devices``, as issued by ``module`` in ``phase``."""

    op: str
    phase: str  # "forward" or "backward"
    module: str  # e.g. "model.24 (SCAM)"
    devices: tuple
    reason: str = ""

    def to_dict(self) -> dict:
        """Plain data."""
        return {"op": self.op, "phase": self.phase, "module": self.module,
                "devices": list(self.devices), "reason": self.reason}


@dataclass
class AuditReport:
    """What :func:`audit_model` saw: table findings plus, from the real run, what torch warned about."""

    device: str
    imgsz: int
    findings: list = field(default_factory=list)
    torch_flagged: list = field(default_factory=list)  # [{"op", "phase", "message"}]
    op_counts: dict = field(default_factory=dict)  # {"forward": n, "backward": n}
    torch_version: str = torch.__version__

    @property
    def clean(self) -> bool:
        """True when no op of the model lacks a deterministic implementation on CPU or CUDA."""
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
        lines = [f"Determinism audit at {self.imgsz}x{self.imgsz} on {self.device} (torch {self.torch_version}): "
                 f"{counted} aten ops recorded"]
        if self.findings:
            op_width = max(len("op"), *(len(f.op) for f in self.findings)) + 2
            module_width = max(len("module"), *(len(f.module) for f in self.findings)) + 2
            lines.append(f"  {'op':<{op_width}}{'phase':<10}{'fails on':<10}{'module':<{module_width}}documented as")
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
        return {"device": self.device, "imgsz": self.imgsz, "torch_version": self.torch_version,
                "clean": self.clean, "findings": [f.to_dict() for f in self.findings],
                "torch_flagged": [dict(flag) for flag in self.torch_flagged], "op_counts": dict(self.op_counts)}


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

    Nodes are numbered in creation order per thread, so a module's own nodes are exactly those
    numbered between its pre-hook and its post-hook.
    """
    with torch.enable_grad():
        probe = torch.zeros((), requires_grad=True).view(())
    return probe.grad_fn._sequence_nr() + 1


class _ModuleTracker:
    """Forward hooks on every module: a stack of active module paths, and autograd-node tagging.

    After a module's forward, its new autograd nodes (those created since its pre-hook, not yet
    claimed by an inner module, whose hook ran first) get the module path in ``Node.metadata``,
    which the backward pass reads through ``torch._C._current_autograd_node()``.
    """

    def __init__(self, model: nn.Module):
        self.stack: list[tuple[str, int]] = []  # (module path, first sequence number)
        self.paused = False  # True while the hooks themselves run ops
        self.handles = []
        for name, module in model.named_modules():
            label = f"{name} ({type(module).__name__})" if name else type(module).__name__
            self.handles.append(module.register_forward_pre_hook(self._enter(label)))
            self.handles.append(module.register_forward_hook(self._leave, always_call=True))

    def current(self) -> str:
        """The innermost active module path."""
        return self.stack[-1][0] if self.stack else _OUTSIDE_MODEL

    def _enter(self, label: str):
        def hook(module, args):
            self.paused = True
            try:
                self.stack.append((label, _next_sequence_nr()))
            finally:
                self.paused = False
        return hook

    def _leave(self, module, args, output):
        label, first = self.stack.pop()
        pending = [t.grad_fn for t in _tensors_in(output) if t.grad_fn is not None]
        seen = set()
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if type(node).__name__ == "AccumulateGrad" or node._sequence_nr() < first:
                continue  # a leaf, or a node made before this module ran
            # Inner modules tagged their nodes already; walk through them to reach this module's own.
            node.metadata.setdefault(_MODULE_KEY, label)
            pending.extend(next_node for next_node, _ in node.next_functions)

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
            self.op_counts = {"forward": 0, "backward": 0}
            self.lock = threading.Lock()  # CUDA backward runs on autograd worker threads

        def _module(self) -> str:
            if self.phase == "forward":
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


def _sum_outputs(output) -> torch.Tensor | None:
    """Sum of every floating output that requires grad (a loss for any output structure), or None."""
    parts = [t.float().sum() for t in _tensors_in(output) if t.is_floating_point() and t.requires_grad]
    return torch.stack(parts).sum() if parts else None


def _torch_flags(caught: list, phase: str) -> list:
    """torch's 'does not have a deterministic implementation' warnings as ``{op, phase, message}``."""
    flags = []
    for w in caught:
        message = str(w.message).strip().splitlines()[0]
        if _TORCH_ALERT in message:
            op = message.split(_TORCH_ALERT)[0].strip()
            flags.append({"op": op, "phase": phase, "message": f"{op}{_TORCH_ALERT}"})
    return flags


@contextlib.contextmanager
def _model_preserved(model: nn.Module):
    """Restore parameters, buffers (BN running stats), gradients, train/eval flags and RNG streams on exit."""
    saved_state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    saved_grads = {p: p.grad for p in model.parameters()}
    saved_training = {m: m.training for m in model.modules()}
    saved_rng = get_rng_state()
    for p in model.parameters():
        p.grad = None
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved_state[k])
        for p, grad in saved_grads.items():
            p.grad = grad
        for m, training in saved_training.items():
            m.training = training
        set_rng_state(saved_rng)


def audit_model(model: nn.Module, imgsz: int = 64, device="cpu", batch_size: int = 1,
                ch: int | None = None) -> AuditReport:
    """Run one train-mode forward and backward on a ``(batch_size, ch, imgsz, imgsz)`` input and audit it.

    Every aten op is recorded under a TorchDispatchMode; ops in :data:`NONDETERMINISTIC_OPS` become
    findings with their phase and the innermost module that issued them (the predictive part:
    valid for CUDA even when run on a CPU). The pass runs under
    ``use_deterministic_algorithms(True, warn_only=True)``, so ``torch_flagged`` holds what torch
    itself reports on this device. The loss is the sum of all outputs. The model's parameters,
    buffers, gradients, train/eval flags and the RNG streams are restored afterwards, so auditing
    does not change a training run. ``model`` must already be on ``device``.
    """
    device = torch.device(device)
    channels = ch or _input_channels(model)
    generator = torch.Generator().manual_seed(0)  # the input must not draw from the global stream
    image = torch.rand((batch_size, channels, imgsz, imgsz), generator=generator).to(device)
    tracker = _ModuleTracker(model)
    recorder = _make_recorder(tracker)
    flags = []
    try:
        with _model_preserved(model), temporary_determinism(True, warn_only=True):
            model.train()
            with warnings.catch_warnings(record=True) as caught, recorder:
                warnings.simplefilter("always")
                loss = _sum_outputs(model(image))
            flags += _torch_flags(caught, "forward")
            if loss is not None:
                with warnings.catch_warnings(record=True) as caught, recorder:
                    warnings.simplefilter("always")
                    recorder.phase = "backward"
                    loss.backward()
                flags += _torch_flags(caught, "backward")
    finally:
        tracker.remove()
    unique_flags = list({(f["op"], f["phase"]): f for f in flags}.values())
    return AuditReport(device=str(device), imgsz=imgsz, findings=list(recorder.findings.values()),
                       torch_flagged=unique_flags, op_counts=dict(recorder.op_counts))


# ----------------------------------------------------------------------------- command line


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a UserError (one ERROR line) instead of usage text."""

    def error(self, message):
        raise UserError(f"{message}; see python -m utils.torch_utils --help")


def _parse_cli(argv) -> argparse.Namespace:
    """Parse and validate the audit command's flags."""
    parser = _ArgumentParser(prog="python -m utils.torch_utils",
                             description="Audit a model for ops without a deterministic implementation.")
    parser.add_argument("--audit", action="store_true", help="run the determinism op audit")
    parser.add_argument("--cfg", type=str, help="model YAML, e.g. models/ffca-yolo.yaml")
    parser.add_argument("--imgsz", type=int, default=256, help="square input size in pixels")
    parser.add_argument("--device", default="cpu", help="cpu, or a CUDA index such as 0")
    parser.add_argument("--batch-size", type=int, default=1, help="audit batch size")
    opt = parser.parse_args(argv)
    if not opt.audit:
        raise UserError("nothing to do: pass --audit --cfg MODEL.yaml")
    if not opt.cfg:
        raise UserError("--cfg is required: the model YAML to audit, e.g. --cfg models/ffca-yolo.yaml")
    if not Path(opt.cfg).is_file():
        raise UserError(f"--cfg {opt.cfg}: file not found; pass a model YAML such as models/ffca-yolo.yaml")
    if opt.imgsz <= 0:
        raise UserError(f"--imgsz {opt.imgsz}: must be a positive number of pixels, e.g. 256")
    if opt.batch_size <= 0:
        raise UserError(f"--batch-size {opt.batch_size}: must be at least 1")
    return opt


def main(argv=None) -> int:
    """``python -m utils.torch_utils --audit --cfg X.yaml``: 0 clean, 1 findings, 2 bad arguments."""
    try:
        opt = _parse_cli(argv)
        device = select_device(opt.device)
        from models.yolo import Model  # lazily: utils must not import models at module level
        model = Model(opt.cfg).to(device)
        stride = int(model.stride.max())
        if opt.imgsz % stride:
            raise UserError(f"--imgsz {opt.imgsz}: must be a multiple of the model's largest stride {stride}")
        report = audit_model(model, imgsz=opt.imgsz, device=device, batch_size=opt.batch_size)
    except UserError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(report.format())
    return 0 if report.clean else 1


if __name__ == "__main__":
    from utils.torch_utils import main as _main  # the importable module, so models share its classes

    sys.exit(_main())
