"""Out of memory, on CPU or CUDA, as one line that says what ran out and what to try, with exit code 1.

A step that does not fit (a training or validation batch, a detection batch, AutoBatch's smallest
trial) raises PyTorch's ``OutOfMemoryError`` on CUDA, a ``RuntimeError`` from the CPU allocator
("can't allocate memory"), NumPy's ``MemoryError`` or OpenCV's ``cv2.error`` "Insufficient memory" (also
when a data-loader worker raised it: the loader raises it again in the main process with the worker's
text). :func:`out_of_memory_hint` wraps the step and turns any of them into :class:`utils.errors.OutOfMemory`,
whose line ``exit_on_user_error`` prints; :func:`out_of_memory_anywhere` does the same for an entry script's
whole run (start-up, the data scan, plots), with what to lower but without a step's sizes.
The run stops where it stands: files already written (checkpoints included) are complete.
"""

from contextlib import contextmanager

import cv2
import torch

from utils.errors import OutOfMemory, first_line

# What CPU allocators and CUDA say when an allocation fails (torch, c10 and the caching allocator).
MARKERS = ("out of memory", "can't allocate memory", "not enough memory")
OPENCV_MARKER = "Insufficient memory"  # OpenCV's text for its error code StsNoMem
TRAIN_ADVICE = "a smaller --batch-size or --imgsz, --cache disk instead of ram, or fewer --workers"
VAL_ADVICE = "a smaller --batch-size or --imgsz, or fewer --workers"
DETECT_ADVICE = "a smaller --batch-size or --imgsz (or --slice-batch with --slice)"


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(error, cv2.error):
        return getattr(error, "code", None) == cv2.Error.StsNoMem or OPENCV_MARKER in str(error)
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in MARKERS)


def out_of_memory_line(stage: str, batch_size, imgsz, device, advice: str = TRAIN_ADVICE, saved: str = "") -> str:
    """``out of memory in training (batch size 16, image size 640, device cpu): try ...``."""
    saved = f" {saved}" if saved else ""
    return (f"out of memory in {stage} (batch size {batch_size}, image size {imgsz}, device {device}): "
            f"try {advice}.{saved}")


@contextmanager
def out_of_memory_hint(stage: str, batch_size, imgsz, device, advice: str = TRAIN_ADVICE, saved=None):
    """Run the block; an allocation that fails in it becomes :class:`OutOfMemory` with the hint line.

    ``saved``: a callable giving what is on disk now (the checkpoints), read when the error happens."""
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # what the failed step held is garbage now: give it back before exiting
        raise OutOfMemory(out_of_memory_line(stage, batch_size, imgsz, device, advice,
                                             saved() if saved else "")) from None


@contextmanager
def out_of_memory_anywhere(program: str, advice: str):
    """Run an entry script's ``program`` (e.g. 'train.py'); running out of memory where no step's hint applies
    becomes :class:`OutOfMemory`: ``out of memory in train.py (what failed): try <advice>.``"""
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise OutOfMemory(f"out of memory in {program} ({first_line(e, 120)}): try {advice}.") from None
