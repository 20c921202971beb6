"""Every random stream a training run draws from, as plain data for checkpoints, and seeding.

Python ``random``, NumPy's legacy global generator, torch's CPU generator and each CUDA device's
generator; :func:`preserved_rng_state` puts them back after trial work (AutoBatch, the op audit).
"""

import contextlib
import random

import numpy as np
import torch

from utils.errors import UserError
from utils.logging import LOGGER


def _cuda_ready() -> bool:
    """True once this process has initialised CUDA (before that no CUDA stream has been drawn from)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _cuda_index(device) -> int:
    """The CUDA device index of ``device`` (None or ``'cuda'``: the current device)."""
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def cuda_rng_state(device=None) -> torch.Tensor | None:
    """This process's CUDA generator state on ``device`` (default: the current device) as a uint8 CPU
    tensor; None for a non-CUDA ``device`` or when CUDA is not initialised (querying would allocate
    a context on the GPU)."""
    if not _cuda_ready() or (device is not None and torch.device(device).type != "cuda"):
        return None
    return torch.cuda.get_rng_state(_cuda_index(device)).clone()


def get_rng_state(cuda_by_rank: list | None = None, device=None) -> dict:
    """Every RNG stream as plain data that survives ``torch.save`` + ``torch.load(weights_only=True)``.

    Keys: ``python`` ([version, 625 ints, gauss_next]), ``numpy`` ([name, 624 ints, pos,
    has_gauss, cached_gaussian]), ``torch`` (uint8 CPU tensor) and ``cuda``: a list indexed by
    DDP rank, ``cuda[k]`` being rank k's own device generator (uint8 tensor, or None where that
    rank had not initialised CUDA). Under DDP every rank calls :func:`cuda_rng_state` on its
    device and the saving rank passes the gathered list as ``cuda_by_rank``; without it the list
    holds ``device``'s generator (default: the current device; empty before CUDA is initialised).
    """
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    if cuda_by_rank is None:
        own = cuda_rng_state(device)
        cuda_by_rank = [] if own is None else [own]
    return {
        "python": [py_version, list(py_internal), py_gauss],
        "numpy": [np_name, [int(k) for k in np_keys], int(np_pos), int(np_has_gauss), float(np_cached)],
        "torch": torch.get_rng_state().clone(),
        "cuda": [None if s is None else s.clone() for s in cuda_by_rank],
    }


@contextlib.contextmanager
def preserved_rng_state(device=None):
    """Every RNG stream as it was before the block, ``device``'s CUDA generator included: trial work
    (AutoBatch, the audit) may run DropPath in training mode without moving the run's streams."""
    saved = get_rng_state(device=device)
    try:
        yield
    finally:
        set_rng_state(saved, device=device)


def set_rng_state(state: dict, rank: int = -1, device=None) -> None:
    """Restore streams saved by :func:`get_rng_state`; a malformed state is a UserError.

    ``rank`` (-1 outside DDP, read as 0) picks this process's entry of ``state["cuda"]``, which is
    restored into ``device``'s generator (default: the current CUDA device).
    """
    try:
        py_version, py_internal, py_gauss = state["python"]
        random.setstate((int(py_version), tuple(int(v) for v in py_internal), py_gauss))
        np_name, np_keys, np_pos, np_has_gauss, np_cached = state["numpy"]
        np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), int(np_pos),
                             int(np_has_gauss), float(np_cached)))
        torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
        cuda_states = list(state.get("cuda") or [])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"RNG state in the checkpoint is malformed ({type(e).__name__}: {e}); "
                        "the checkpoint was not written by this project's train.py") from None
    slot = max(rank, 0)
    on_cpu = device is not None and torch.device(device).type != "cuda"
    if not cuda_states or on_cpu or not torch.cuda.is_available():
        return
    if slot >= len(cuda_states) or cuda_states[slot] is None:
        LOGGER.warning(f"checkpoint holds no CUDA RNG state for rank {slot} ({len(cuda_states)} saved); "
                       "this rank's CUDA random stream restarts from the seed")
        return
    torch.cuda.set_rng_state(cuda_states[slot].cpu().to(torch.uint8), _cuda_index(device))


def seed_everything(seed: int) -> None:
    """Seed Python ``random``, NumPy, torch CPU and every CUDA device (lazily, if CUDA is not up yet)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also queues the seed for every CUDA device
    torch.cuda.manual_seed_all(seed)
