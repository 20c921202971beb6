"""Batch-invariant inference: an image's raw outputs must not depend on how many images share its forward pass.

A convolution's arithmetic for one image reads only that image, but the kernel that runs it is chosen by the
whole input shape, batch size included. On the CPU, oneDNN and ATen's own convolutions pick other blockings for
other batch sizes: one 3x3 convolution of a fused YOLOv5n gives other last bits for an image alone than for the
same image in a batch of 2, 4 or 16 (docs/determinism.md, "Batch-invariant evaluation"). cuDNN chooses its
algorithm by shape too, batch size included, even with benchmark mode off.

So every forward pass runs at one fixed batch size, :func:`eval_micro_batch`, whatever ``--batch-size`` is:
larger batches are split, and the last chunk is padded with zero images whose outputs are dropped. On the CPU the
micro-batch is :data:`CPU_MICRO_BATCH` images: for yolov5n and ffca-yolo-n, 2 images per pass cost about 10% less
per image than 1 at 352 px and within 3% of it at 640 px, where 4 cost up to 18% more than 1 (ffca-yolo-n;
benchmarks/speed/bench_pass_size.py); and a lone image is padded with one zero image only. On CUDA it is
:data:`CUDA_MICRO_BATCH` images.

An image's bits at that fixed size were found not to depend on its place in the chunk nor on the images beside
it. The callers do not rely on that alone: they cut their batches to :func:`aligned_batch_size`, a multiple of the
micro-batch counted from the start of each run of one shape, so every forward holds the same images (and the same
padding) whatever ``--batch-size`` is.
"""

from typing import Callable

import torch

CPU_MICRO_BATCH = 2  # images per forward on the CPU: never much dearer per image than 1, where 4 can be
CUDA_MICRO_BATCH = 8  # images per forward on CUDA: keeps the GPU busy; zero images pad the last chunk


def eval_micro_batch(device, fixed_shape=None) -> int:
    """Images per forward pass on ``device`` (a torch.device or its string): 2 on the CPU, 8 on CUDA; for a
    static export (``fixed_shape`` ``(batch, h, w)``) its own batch, which it pads to anyway."""
    if fixed_shape is not None:
        return int(fixed_shape[0])
    return CUDA_MICRO_BATCH if torch.device(device).type == "cuda" else CPU_MICRO_BATCH


def aligned_batch_size(batch_size: int, micro_batch: int) -> int:
    """``batch_size`` rounded up to a multiple of ``micro_batch``.

    Batches of this size cut from the start of a run of one shape (the sampler's shape groups, detect.py's runs
    of frames, an image's tiles) split into forward passes that start at multiples of ``micro_batch`` in the run:
    each pass holds the same images, and the run's last pass the same zero padding, at any ``--batch-size``. It
    costs no memory in the model: a shorter batch is padded to a multiple of ``micro_batch`` anyway.
    """
    return -(-int(batch_size) // micro_batch) * micro_batch


def _pad(chunk: torch.Tensor, size: int) -> torch.Tensor:
    """``chunk`` (n, ...) with zero images appended up to ``size`` rows."""
    if len(chunk) == size:
        return chunk
    return torch.cat((chunk, chunk.new_zeros(size - len(chunk), *chunk.shape[1:])))


def _first_rows(output, n: int):
    """The first ``n`` images of a model output: a tensor (bs, ...), a list or tuple of them, or None."""
    if output is None:
        return None
    if isinstance(output, (list, tuple)):
        return type(output)(_first_rows(o, n) for o in output)
    return output[:n]


def _joined(outputs: list):
    """Per-chunk outputs of one structure joined along the batch dimension."""
    first = outputs[0]
    if first is None:
        return None
    if isinstance(first, (list, tuple)):
        return type(first)(_joined([o[k] for o in outputs]) for k in range(len(first)))
    return torch.cat(outputs) if len(outputs) > 1 else first


def forward_in_micro_batches(forward: Callable, images: torch.Tensor, micro_batch: int):
    """``forward(images)`` computed ``micro_batch`` images at a time, each chunk padded to that size.

    ``images`` (bs, 3, h, w); ``forward`` returns a tensor with the batch first, or a (nested) tuple or list of
    them (the eval-mode ``(pred (bs, N, no), raw per level)``) or None. Returns the same structure for ``bs``
    images; each image's rows are the bits it gets from any other batch holding it.
    """
    outputs = []
    for chunk in images.split(micro_batch):
        outputs.append(_first_rows(forward(_pad(chunk, micro_batch)), len(chunk)))
    return _joined(outputs)


def run_batch_invariant(forward: Callable, images: torch.Tensor, fixed_shape=None):
    """``forward(images)`` at :func:`eval_micro_batch` images per pass on the images' device."""
    return forward_in_micro_batches(forward, images, eval_micro_batch(images.device, fixed_shape))


def batch_invariant(forward: Callable, device) -> Callable:
    """``forward`` wrapped to run at :func:`eval_micro_batch` images per pass on ``device``."""
    micro_batch = eval_micro_batch(device)

    def run(images: torch.Tensor):
        return forward_in_micro_batches(forward, images, micro_batch)

    return run
