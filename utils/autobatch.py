"""AutoBatch (``--batch-size -1``): pick the largest training batch that fits a share of free GPU memory.

A copy of the model runs one forward and backward pass at a few small batch sizes; the peak
memory of each is fitted with a straight line ``memory = slope * batch + intercept`` and the
line is solved for the memory budget. CUDA only: on CPU the default batch size is returned.
"""

from copy import deepcopy

import numpy as np
import torch

from utils.logging import LOGGER, colorstr

PREFIX = colorstr("AutoBatch: ")
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16)
MAX_BATCH_SIZE = 1024
GIB = 1 << 30


def fit_batch_size(batch_sizes, memory_gib, budget_gib: float, default: int = 16) -> tuple[int, np.ndarray | None]:
    """Largest batch whose predicted memory stays within ``budget_gib``, from profiled measurements.

    ``memory_gib[i]`` is the peak memory at ``batch_sizes[i]``, or None where that batch ran out of
    memory. Returns ``(batch, (slope, intercept))``; falls back to ``(default, None)`` when the
    measurements cannot support a fit, and never returns a batch at or above one that failed.
    """
    measured = [(b, m) for b, m in zip(batch_sizes, memory_gib) if m is not None]
    if len(measured) < 2:
        LOGGER.warning(f"{PREFIX}WARNING ⚠️ fewer than two batch sizes profiled, "
                       f"using default batch-size {default}")
        return default, None
    sizes, memory = (np.array(v, dtype=np.float64) for v in zip(*measured))
    slope, intercept = np.polyfit(sizes, memory, deg=1)
    if slope <= 0:
        LOGGER.warning(f"{PREFIX}WARNING ⚠️ memory does not grow with batch size, "
                       f"using default batch-size {default}")
        return default, None
    batch = int(np.floor(round((budget_gib - intercept) / slope, 6)))  # round first: fit noise must not cost a batch
    failed = [b for b, m in zip(batch_sizes, memory_gib) if m is None]
    if failed and batch >= min(failed):
        # the line is optimistic past the first out-of-memory size: fall back to the last size that ran
        batch = max([b for b, _ in measured if b < min(failed)], default=1)
    if not 1 <= batch <= MAX_BATCH_SIZE:
        LOGGER.warning(f"{PREFIX}WARNING ⚠️ fitted batch-size {batch} is outside 1-{MAX_BATCH_SIZE}, "
                       f"using default batch-size {default}")
        return default, None
    return batch, np.array([slope, intercept])


def check_train_batch_size(model, imgsz: int = 640, amp: bool = True, fraction: float = 0.6,
                           default: int = 16) -> int:
    """Batch size that uses about ``fraction`` of the free memory of the model's CUDA device."""
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

    probe = deepcopy(model).train()
    memory = []
    for batch in PROFILE_BATCH_SIZES:  # once one size runs out of memory, larger ones will too
        memory.append(None if None in memory else _peak_memory_gib(probe, batch, imgsz, amp, device))
    del probe
    torch.cuda.empty_cache()

    batch, line = fit_batch_size(PROFILE_BATCH_SIZES, memory, fraction * available, default)
    if line is not None:
        predicted = float(np.polyval(line, batch))
        LOGGER.info(f"{PREFIX}using batch-size {batch}: about {predicted:.2f}G of {available:.2f}G "
                    f"({predicted / available:.0%}) ✅")
    return batch


def _peak_memory_gib(model, batch: int, imgsz: int, amp: bool, device) -> float | None:
    """Peak reserved memory (GiB) of one forward + backward at ``batch``; None when it runs out of memory."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        images = torch.zeros(batch, 3, imgsz, imgsz, device=device)
        with torch.autocast("cuda", enabled=amp):
            outputs = model(images)
        _sum_outputs(outputs).backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_reserved(device) / GIB
    except torch.cuda.OutOfMemoryError:
        LOGGER.info(f"{PREFIX}batch-size {batch} ran out of memory while profiling")
        return None
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def _sum_outputs(outputs) -> torch.Tensor:
    """One scalar from a model output (a tensor or nested lists/tuples of them) to backpropagate."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum()
    return sum(_sum_outputs(o) for o in outputs)
