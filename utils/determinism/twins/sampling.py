"""A deterministic twin of ``F.grid_sample`` (4-D input, bilinear and nearest, every padding mode).

The native CUDA backward (``grid_sampler_2d_backward``, and cuDNN's sampler) accumulates the input
gradient with atomics. The twin computes the same samples from ops whose CUDA kernels are
deterministic under ``torch.use_deterministic_algorithms(True)``: the input is laid out as rows of
channels (``(N*H*W, C)``), each sample's corners are read with ``index_select`` (whose backward is
``index_add_``, deterministic on CUDA under the flag) and blended with elementwise math. Corners
outside the input point at an extra row of zeros, so zeros padding needs no mask on the values.

The helpers :func:`input_rows` and :func:`bilinear_corners` are shared with the torchvision twins
(``utils/determinism/twins/vision_ops.py``).
"""

import torch

MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")


def input_rows(input: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``(N, C, H, W)`` -> ``(N*H*W + 1, C)``: one row per pixel, then a sentinel row of ``fill``."""
    n, c, h, w = input.shape
    rows = input.permute(0, 2, 3, 1).reshape(n * h * w, c)
    return torch.cat([rows, rows.new_full((1, c), fill)])


def pixel_index(batch: torch.Tensor, y: torch.Tensor, x: torch.Tensor, valid: torch.Tensor,
                height: int, width: int, sentinel: int) -> torch.Tensor:
    """Row index of pixel ``(batch, y, x)`` in :func:`input_rows`; ``sentinel`` where not ``valid``."""
    index = (batch * height + y) * width + x
    return torch.where(valid, index, torch.full_like(index, sentinel))


def bilinear_corners(y: torch.Tensor, x: torch.Tensor, batch: torch.Tensor, height: int, width: int,
                     sentinel: int) -> tuple:
    """The four corners of each sample point ``(y, x)`` (float, any shape) with their weights.

    Returns ``(indices, weights)``, each a tuple in the order north-west, north-east, south-west,
    south-east; a corner outside the ``height x width`` map gets the ``sentinel`` row. The weights
    stay differentiable in ``y`` and ``x``; the corners are computed from a detached copy clamped to
    ``[-2, size + 1]`` so that far-away or non-finite points give valid integers.
    """
    y0 = torch.floor(torch.nan_to_num(y.detach(), nan=-2.0).clamp(-2, height + 1))
    x0 = torch.floor(torch.nan_to_num(x.detach(), nan=-2.0).clamp(-2, width + 1))
    south, east = y - y0, x - x0
    north, west = 1 - south, 1 - east
    yi, xi = y0.long(), x0.long()
    rows_in = ((yi >= 0) & (yi < height), (yi + 1 >= 0) & (yi + 1 < height))
    cols_in = ((xi >= 0) & (xi < width), (xi + 1 >= 0) & (xi + 1 < width))
    indices = tuple(pixel_index(batch, yi + dy, xi + dx, rows_in[dy] & cols_in[dx], height, width, sentinel)
                    for dy in (0, 1) for dx in (0, 1))
    weights = (north * west, north * east, south * west, south * east)
    return indices, weights


def _check_arguments(input: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str) -> None:
    """Raise ValueError, naming the argument, for what the twin does not cover."""
    if input.dim() != 4:
        raise ValueError(f"grid_sample twin: input must be 4-D (N, C, H, W), got {input.dim()}-D; "
                         "use torch.nn.functional.grid_sample for volumetric input")
    if mode not in MODES:
        raise ValueError(f"grid_sample twin: mode={mode!r} is not covered; use one of {MODES}")
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"grid_sample twin: padding_mode={padding_mode!r} is not valid; use one of {PADDING_MODES}")
    if grid.dim() != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
        raise ValueError(f"grid_sample twin: grid must be (N, H_out, W_out, 2) with N={input.shape[0]}, "
                         f"got {tuple(grid.shape)}")
    if not (input.is_floating_point() and grid.is_floating_point()):
        raise ValueError(f"grid_sample twin: input and grid must be floating, got {input.dtype} and {grid.dtype}")


def _reflect(coord: torch.Tensor, twice_low: int, twice_high: int) -> torch.Tensor:
    """Reflect ``coord`` into ``[twice_low / 2, twice_high / 2]``; gradient +-1 by the number of flips.

    At ``coord == twice_low / 2`` abs() passes gradient 0 where aten passes 1, but there the clamp
    that follows passes 0 either way.
    """
    if twice_low == twice_high:  # a map of size 1 with align_corners: one point, no gradient
        return torch.where(torch.zeros_like(coord, dtype=torch.bool), coord, 0.0)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = (coord - low).abs()
    extra = torch.fmod(distance, span)
    even_flips = torch.remainder(torch.floor(distance / span), 2) == 0
    return torch.where(even_flips, extra + low, span - extra + low)


def source_coordinate(coord: torch.Tensor, size: int, padding_mode: str, align_corners: bool) -> torch.Tensor:
    """Normalized grid coordinates in ``[-1, 1]`` -> pixel coordinates, padded as grid_sample pads."""
    if align_corners:
        pixel = (coord + 1) * ((size - 1) / 2)
    else:
        pixel = (coord + 1) * (size / 2) - 0.5
    if padding_mode == "reflection":
        pixel = _reflect(pixel, 0, 2 * (size - 1)) if align_corners else _reflect(pixel, -1, 2 * size - 1)
    if padding_mode != "zeros":
        # clamp's gradient is 0 on the bounds as well, like aten's clip_coordinates_set_grad (tested)
        pixel = pixel.clamp(0, size - 1)
    return pixel


def _nearest(rows: torch.Tensor, y: torch.Tensor, x: torch.Tensor, batch: torch.Tensor, height: int,
             width: int) -> torch.Tensor:
    """Rows of the nearest pixels (ties to even, as aten's nearbyint); the grid gets a zero gradient."""
    y_round = torch.round(torch.nan_to_num(y, nan=-2.0).clamp(-2, height + 1))
    x_round = torch.round(torch.nan_to_num(x, nan=-2.0).clamp(-2, width + 1))
    yi, xi = y_round.detach().long(), x_round.detach().long()
    valid = (yi >= 0) & (yi < height) & (xi >= 0) & (xi < width)
    index = pixel_index(batch, yi, xi, valid, height, width, rows.shape[0] - 1)
    # round() has a zero gradient: this factor is exactly 1 and ties the grid to the graph, so
    # grid.grad is zeros (as native) rather than None.
    unit = (y_round - y_round.detach()) + (x_round - x_round.detach()) + 1
    return rows.index_select(0, index.reshape(-1)) * unit.reshape(-1, 1)


def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool = False) -> torch.Tensor:
    """``F.grid_sample`` for 4-D input with a backward that is deterministic on CUDA.

    input ``(N, C, H, W)``, grid ``(N, H_out, W_out, 2)`` holding ``(x, y)`` in ``[-1, 1]``;
    returns ``(N, C, H_out, W_out)``. ``mode`` 'bilinear' or 'nearest'; ``padding_mode`` 'zeros',
    'border' or 'reflection'; ``align_corners`` as in ``F.grid_sample`` (default False, not None).
    """
    _check_arguments(input, grid, mode, padding_mode)
    dtype = torch.promote_types(input.dtype, grid.dtype)  # as autocast runs the native op
    input, grid = input.to(dtype), grid.to(dtype)
    n, c, height, width = input.shape
    out_h, out_w = grid.shape[1:3]
    rows = input_rows(input)
    x = source_coordinate(grid[..., 0], width, padding_mode, align_corners)
    y = source_coordinate(grid[..., 1], height, padding_mode, align_corners)
    batch = torch.arange(n, device=input.device).view(n, 1, 1)
    if mode == "nearest":
        samples = _nearest(rows, y, x, batch, height, width)
    else:
        indices, weights = bilinear_corners(y, x, batch, height, width, rows.shape[0] - 1)
        samples = None
        for index, weight in zip(indices, weights):
            term = rows.index_select(0, index.reshape(-1)) * weight.reshape(-1, 1)
            samples = term if samples is None else samples + term
    return samples.view(n, out_h, out_w, c).permute(0, 3, 1, 2).contiguous()
