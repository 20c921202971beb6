"""AutoBatch (``--batch-size -1``): pick the largest training batch that fits a share of free GPU memory.

A copy of the model runs one forward and backward pass at a few small batch sizes; the peak
memory of each is fitted with a straight line ``memory = slope * batch + intercept`` and the
line is solved for the memory budget. CUDA only: on CPU the default batch size is returned.
The trial backward passes run inside the run's determinism policy's ``backward_scope``, so a
model whose backward ``scoped`` relaxes profiles under the same rules it trains under.
"""

import contextlib
from copy import deepcopy
from typing import Callable

import numpy as np
import torch

from utils.logging import LOGGER, colorstr
from utils.out_of_memory import out_of_memory_hint
from utils.rng_state import preserved_rng_state

PREFIX = colorstr("AutoBatch: ")
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16)
MAX_BATCH_SIZE = 1024
GIB = 1 << 30
AUTOBATCH_ADVICE = "a smaller --imgsz or a smaller model (--cfg)"


def fit_batch_size(batch_sizes, memory_gib, budget_gib: float, default: int = 16) -> tuple[int, np.ndarray | None]:
    """Largest batch whose predicted memory stays within ``budget_gib``, from profiled measurements.

    ``memory_gib[i]`` is the peak memory at ``batch_sizes[i]``, or None where that batch ran out of
    memory. Returns ``(batch, (slope, intercept))``; falls back to ``(default, None)`` when the
    measurements cannot support a fit, and never returns a batch at or above one that failed.
    """
    measured = [(b, m) for b, m in zip(batch_sizes, memory_gib) if m is not None]
    if len(measured) < 2:
        LOGGER.warning(f"{PREFIX}fewer than two batch sizes profiled, "
                       f"using default batch-size {default}")
        return default, None
    sizes, memory = (np.array(v, dtype=np.float64) for v in zip(*measured))
    slope, intercept = np.polyfit(sizes, memory, deg=1)
    if slope <= 0:
        LOGGER.warning(f"{PREFIX}memory does not grow with batch size, "
                       f"using default batch-size {default}")
        return default, None
    batch = int(np.floor(round((budget_gib - intercept) / slope, 6)))  # round first: fit noise must not cost a batch
    failed = [b for b, m in zip(batch_sizes, memory_gib) if m is None]
    if failed and batch >= min(failed):
        # the line is optimistic past the first out-of-memory size: fall back to the last size that ran
        batch = max([b for b, _ in measured if b < min(failed)], default=1)
    if not 1 <= batch <= MAX_BATCH_SIZE:
        LOGGER.warning(f"{PREFIX}fitted batch-size {batch} is outside 1-{MAX_BATCH_SIZE}, "
                       f"using default batch-size {default}")
        return default, None
    return batch, np.array([slope, intercept])


def check_train_batch_size(model, imgsz: int = 640, amp: bool = True, fraction: float = 0.6,
                           default: int = 16, policy=None) -> int:
    """Batch size that uses about ``fraction`` of the free memory of the model's CUDA device.

    ``policy`` is the run's ``DeterminismPolicy`` (after its start-up audit); its backward scope
    wraps every trial backward pass. None: no scope.
    """
    device = next(model.parameters()).device
    if device.type != "cuda":
        LOGGER.info(f"{PREFIX}AutoBatch needs a CUDA device, using default batch-size {default} on {device.type}")
        return default
    if torch.backends.cudnn.benchmark:
        LOGGER.info(f"{PREFIX}cudnn.benchmark=True makes memory use unpredictable, "
                    f"using default batch-size {default}")
        return default

    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    # memory this process's allocator already holds is as usable as free memory
    available = (free + torch.cuda.memory_reserved(device)) / GIB
    name = torch.cuda.get_device_name(device)
    LOGGER.info(f"{PREFIX}{name} {total / GIB:.2f}G total, {available:.2f}G available, aiming for {fraction:.0%}")

    memory = profile_or_fail(model, imgsz, amp, policy, _cuda_peak_gib)
    torch.cuda.empty_cache()

    batch, line = fit_batch_size(PROFILE_BATCH_SIZES, memory, fraction * available, default)
    if line is not None:
        predicted = float(np.polyval(line, batch))
        LOGGER.info(f"{PREFIX}using batch-size {batch}: about {predicted:.2f}G of {available:.2f}G "
                    f"({predicted / available:.0%}) ✅")
    return batch


def profile_or_fail(model, imgsz: int, amp: bool, policy, measure: Callable) -> list:
    """:func:`profile_memory`, where a smallest trial batch that does not fit is the one-line out-of-memory error:
    the default batch size it would fall back to fits even less."""
    device = next(model.parameters()).device
    with out_of_memory_hint("AutoBatch", PROFILE_BATCH_SIZES[0], imgsz, device, AUTOBATCH_ADVICE):
        memory = profile_memory(model, imgsz, amp, policy, measure)
        if memory[0] is None:
            raise torch.OutOfMemoryError(f"AutoBatch's trial at batch size {PROFILE_BATCH_SIZES[0]}: out of memory")
    return memory


def profile_memory(model, imgsz: int, amp: bool, policy, measure: Callable) -> list:
    """Memory (GiB, None once out of memory) of a trial step at each of PROFILE_BATCH_SIZES, on a copy.

    ``measure(step, device)`` runs ``step()`` and returns its peak memory, or None when it ran out
    of memory; once one size runs out of memory, larger ones are not tried.
    """
    probe = deepcopy(model).train()
    device = next(probe.parameters()).device
    memory = []
    with preserved_rng_state(device):  # DropPath draws in the trial steps; the run's streams must not move
        for batch in PROFILE_BATCH_SIZES:
            if None in memory:
                memory.append(None)
                continue
            memory.append(measure(lambda: trial_step(probe, batch, imgsz, amp, policy), device))
            if memory[-1] is None:
                LOGGER.info(f"{PREFIX}batch-size {batch} ran out of memory while profiling")
    return memory


def trial_step(model, batch: int, imgsz: int, amp: bool, policy) -> None:
    """One forward (through ``policy``'s twins) on a ``(batch, 3, imgsz, imgsz)`` zero image and a backward in
    ``policy``'s scope."""
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    try:
        images = torch.zeros(batch, 3, imgsz, imgsz, device=device)
        with policy.forward_scope() if policy is not None else contextlib.nullcontext(), \
                torch.autocast(device.type, enabled=amp):
            outputs = model(images)
        with policy.backward_scope() if policy is not None else contextlib.nullcontext():
            _sum_outputs(outputs).backward()
    finally:
        model.zero_grad(set_to_none=True)


def _cuda_peak_gib(step: Callable, device) -> float | None:
    """Peak reserved memory (GiB) of ``step()`` on ``device``; None when it runs out of memory."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device) / GIB
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def _sum_outputs(outputs) -> torch.Tensor:
    """One scalar from a model output (a tensor or nested lists/tuples of them) to backpropagate."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum()
    return sum(_sum_outputs(o) for o in outputs)
