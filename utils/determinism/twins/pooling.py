"""Deterministic twins of adaptive max and average pooling (2-D and 3-D).

Both use aten's windows: output cell ``k`` of a dimension of input size ``n`` and output size ``m``
covers ``[floor(k * n / m), ceil((k + 1) * n / m))``; windows overlap when ``m`` does not divide
``n``. Nothing here accumulates with atomics:

- average pooling is one matmul per pooled dimension with a pooling matrix (``m x n``, ``1 / len``
  inside each window); the backward is the transposed matmul;
- max pooling finds each window's first maximum (aten's row-major order) with ``index_select`` and
  ``max`` without grad, one dimension at a time, then takes the values with ``gather``, whose
  backward is a ``scatter_add`` (deterministic under ``torch.use_deterministic_algorithms(True)``).

Shapes: ``input`` is ``(N, C, *spatial)`` or ``(C, *spatial)`` with 2 or 3 spatial dimensions;
the output is ``(..., *output_size)``, an entry ``None`` of ``output_size`` keeping that size.
"""

import functools
import math

import torch


def output_sizes(input: torch.Tensor, output_size, dims: int) -> tuple:
    """``output_size`` (int, or a sequence with ``None`` meaning "as the input") as ``dims`` ints."""
    sizes = (output_size,) * dims if isinstance(output_size, int) else tuple(output_size)
    if len(sizes) != dims:
        raise ValueError(f"output_size {output_size!r}: expected {dims} sizes for a {dims}-D adaptive pool")
    return tuple(int(input.shape[-dims + i]) if s is None else int(s) for i, s in enumerate(sizes))


def _check_input(input: torch.Tensor, dims: int) -> None:
    if input.dim() not in (dims + 1, dims + 2) or any(s == 0 for s in input.shape[-dims:]):
        raise ValueError(f"adaptive {dims}-D pool: expected a {dims + 1}-D or {dims + 2}-D input with non-empty "
                         f"spatial dimensions, got shape {tuple(input.shape)}")


def windows(in_size: int, out_size: int) -> list:
    """``[(start, end)]`` of each output cell, as aten's adaptive pools compute them."""
    return [(k * in_size // out_size, -(-(k + 1) * in_size // out_size)) for k in range(out_size)]


@functools.lru_cache(maxsize=256)
def _window_index(in_size: int, out_size: int) -> torch.Tensor:
    """``(out_size, longest window)`` input indices; a short window repeats its last index (a duplicate
    never changes a maximum, and it comes after the window's own entries, so the first maximum stays)."""
    spans = windows(in_size, out_size)
    longest = max(end - start for start, end in spans)
    return torch.tensor([[min(start + j, end - 1) for j in range(longest)] for start, end in spans])


@functools.lru_cache(maxsize=256)
def _pooling_matrix(in_size: int, out_size: int, dtype: torch.dtype) -> torch.Tensor:
    """``(out_size, in_size)``: row ``k`` holds ``1 / len`` on output cell ``k``'s window."""
    matrix = torch.zeros(out_size, in_size, dtype=torch.float64)
    for k, (start, end) in enumerate(windows(in_size, out_size)):
        matrix[k, start:end] = 1.0 / (end - start)
    return matrix.to(dtype)


def along(x: torch.Tensor, matrix: torch.Tensor, dim: int) -> torch.Tensor:
    """``matrix`` (``m x n``) applied along ``dim`` (size ``n``) of ``x``: that dimension becomes ``m``.

    One 2-D matmul ``(rest, n) @ (n, m)``: a batched matmul of a strided view would run one tiny product
    per row (14x slower on the CPU for an 8x64x40x40 map).
    """
    moved = x.movedim(dim, -1)
    out = (moved.reshape(-1, moved.shape[-1]) @ matrix.T).view(*moved.shape[:-1], matrix.shape[0])
    return out.movedim(-1, dim)


def _adaptive_avg_pool(input: torch.Tensor, output_size, dims: int) -> torch.Tensor:
    _check_input(input, dims)
    sizes = output_sizes(input, output_size, dims)
    out = input
    for i, out_size in enumerate(sizes):
        dim = input.dim() - dims + i
        if out_size != input.shape[dim]:  # equal sizes: every window is one element, the pool is the identity
            out = along(out, _pooling_matrix(input.shape[dim], out_size, input.dtype).to(input.device), dim)
    return out if out is not input else input.clone()


def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """Twin of ``F.adaptive_avg_pool2d``: ``(N, C, H, W)`` or ``(C, H, W)`` -> ``(..., oh, ow)``."""
    return _adaptive_avg_pool(input, output_size, 2)


def adaptive_avg_pool3d(input: torch.Tensor, output_size) -> torch.Tensor:
    """Twin of ``F.adaptive_avg_pool3d``: ``(N, C, D, H, W)`` or ``(C, D, H, W)`` -> ``(..., od, oh, ow)``."""
    return _adaptive_avg_pool(input, output_size, 3)


def _first_maximum(values: torch.Tensor, positions: list, dim: int, in_size: int, out_size: int) -> tuple:
    """Pool ``values`` along ``dim`` to ``out_size`` windows, keeping each window's first maximum.

    ``positions`` (same shape as ``values``) are the coordinates already chosen in later dimensions;
    they follow the chosen entry. Returns ``(values, positions + [this dimension's coordinate])``.
    """
    index = _window_index(in_size, out_size).to(values.device)
    longest = index.shape[1]

    def windowed(t):
        if in_size % out_size == 0:  # windows tile the dimension: a view, no copy
            return t.unflatten(dim, (out_size, longest))
        return t.index_select(dim, index.flatten()).unflatten(dim, (out_size, longest))

    pooled, choice = windowed(values).max(dim + 1)  # torch.max returns the first maximal entry's index
    picked = choice.unsqueeze(dim + 1)
    kept = [windowed(p).gather(dim + 1, picked).squeeze(dim + 1) for p in positions]
    offsets = (torch.arange(out_size, device=values.device) * longest).view(-1, *([1] * (values.dim() - dim - 1)))
    coordinate = index.flatten()[choice + offsets]
    return pooled, kept + [coordinate]


def max_pool_indices(input: torch.Tensor, sizes: tuple) -> torch.Tensor:
    """Flat indices into the pooled dimensions (as aten returns them) of each window's first maximum.

    Separable: the first maximum of a box in row-major order is, along the first dimension, the
    first slice holding the box's maximum, and within it the first maximum of the later dimensions.
    """
    dims = len(sizes)
    values, positions = input.detach(), []
    for i in reversed(range(dims)):
        dim = input.dim() - dims + i
        values, positions = _first_maximum(values, positions, dim, input.shape[dim], sizes[i])
    flat = torch.zeros_like(positions[0])
    for i, coordinate in enumerate(reversed(positions)):  # positions run from the last dimension to the first
        flat = flat + coordinate * math.prod(input.shape[input.dim() - dims + i + 1:])
    return flat


def _adaptive_max_pool(input: torch.Tensor, output_size, return_indices: bool, dims: int):
    _check_input(input, dims)
    sizes = output_sizes(input, output_size, dims)
    with torch.no_grad():
        indices = max_pool_indices(input, sizes)
    flat_input = input.flatten(-dims)
    output = flat_input.gather(-1, indices.flatten(-dims)).view(indices.shape)
    return (output, indices) if return_indices else output


def adaptive_max_pool2d(input: torch.Tensor, output_size, return_indices: bool = False):
    """Twin of ``F.adaptive_max_pool2d``: ``(N, C, H, W)`` or ``(C, H, W)`` -> ``(..., oh, ow)``, and with
    ``return_indices`` the int64 flat indices into ``H * W`` that aten returns."""
    return _adaptive_max_pool(input, output_size, return_indices, 2)


def adaptive_max_pool3d(input: torch.Tensor, output_size, return_indices: bool = False):
    """Twin of ``F.adaptive_max_pool3d``: ``(N, C, D, H, W)`` or ``(C, D, H, W)`` -> ``(..., od, oh, ow)``,
    indices into ``D * H * W``."""
    return _adaptive_max_pool(input, output_size, return_indices, 3)
