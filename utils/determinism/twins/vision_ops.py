"""Deterministic twins of torchvision's ``deform_conv2d``, ``roi_align`` and ``roi_pool``.

torchvision's CUDA backward kernels accumulate with atomics: ``deform_conv2d``'s silently (no
alert), ``roi_align``'s and ``roi_pool``'s with an alert that makes ``strict`` training raise. The
twins keep torchvision's public signatures and semantics and are built, like the ``grid_sample``
twin (``utils/determinism/twins/sampling.py``), from rows of channels read with ``index_select``
(backward: ``index_add_``, deterministic on CUDA under the flag), ``gather`` (backward: a
deterministic ``scatter_add_``), elementwise math and matmuls. As in torchvision, the boxes get
no gradient.
"""

import torch

from utils.determinism.twins.sampling import bilinear_corners, input_rows, pixel_index


def _pair(value, name: str) -> tuple:
    """``int`` or a pair of ints -> ``(a, b)``."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"{name}={value!r}: give an int or a pair of ints")
    return pair


def as_rois(boxes, input: torch.Tensor) -> torch.Tensor:
    """torchvision's boxes (``Tensor[K, 5]`` or a list of ``Tensor[L, 4]``, one per image) -> ``(K, 5)``.

    Column 0 is the image index; the result is detached, in ``input``'s dtype and at least float32
    (box geometry in half precision would be off by pixels, and under autocast torchvision computes
    in float32 too).
    """
    dtype = torch.promote_types(input.dtype, torch.float32)
    if isinstance(boxes, torch.Tensor):
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ValueError(f"boxes: a Tensor must be [K, 5] (image index, x1, y1, x2, y2), got {tuple(boxes.shape)}")
        return boxes.detach().to(device=input.device, dtype=dtype)
    if not isinstance(boxes, (list, tuple)) or not all(isinstance(b, torch.Tensor) for b in boxes):
        raise ValueError("boxes: give a Tensor[K, 5] or a list of Tensor[L, 4], one per image")
    if any(b.dim() != 2 or b.shape[1] != 4 for b in boxes):
        raise ValueError(f"boxes: each Tensor of the list must be [L, 4], got {[tuple(b.shape) for b in boxes]}")
    if not boxes:
        return input.new_zeros((0, 5), dtype=dtype)
    image = torch.cat([torch.full((len(b), 1), i, dtype=dtype, device=input.device) for i, b in enumerate(boxes)])
    return torch.cat([image, torch.cat(list(boxes)).detach().to(device=input.device, dtype=dtype)], dim=1)


def _roi_align_axis(start, bin_size, grid, pooled: int, most: int, size: int) -> tuple:
    """Sample points of one axis, each ``(K, pooled, most)``: ``(used, (low, high), (weight_low, weight_high))``.

    ``grid`` holds each box's number of samples per bin (``(K,)``); points past it, and points
    further than one pixel outside the map, are not ``used`` and weigh 0, as in torchvision's kernel.
    """
    bins = torch.arange(pooled, device=start.device, dtype=start.dtype).view(1, -1, 1)
    steps = torch.arange(most, device=start.device, dtype=start.dtype).view(1, 1, -1) + 0.5
    grid_f = grid.to(start.dtype).view(-1, 1, 1)
    point = (start.view(-1, 1, 1) + bins * bin_size.view(-1, 1, 1)) + steps * bin_size.view(-1, 1, 1) / grid_f
    used = (steps < grid_f) & (point >= -1.0) & (point <= size)
    point = point.clamp(min=0)
    low = point.long()  # truncation, as the kernel's (int) cast; point >= 0 here
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, size - 1, low + 1)
    point = torch.where(at_edge, low.to(point.dtype), point)
    weight_high = point - low
    zero = torch.zeros((), dtype=point.dtype, device=point.device)
    return used, (low, high), (torch.where(used, 1 - weight_high, zero), torch.where(used, weight_high, zero))


def _grid_counts(extent: torch.Tensor, pooled: int, sampling_ratio: int) -> torch.Tensor:
    """Samples per bin along one axis for each box: ``sampling_ratio``, or adaptive ``ceil(extent / pooled)``."""
    if sampling_ratio > 0:
        return torch.full_like(extent, sampling_ratio, dtype=torch.long)
    return torch.ceil(extent / pooled).long()


def _largest(values: torch.Tensor) -> int:
    """``max(values.max(), 1)`` as a Python int (a host sync), sizing a gather.

    On ``meta`` (the op audit's shape-only trace of CUDA) there are no values, and 1 gives the same ops.
    """
    if values.device.type == "meta" or values.numel() == 0:
        return 1
    return max(int(values.max()), 1)


def _check_feature_map(input: torch.Tensor, rois: torch.Tensor, op: str) -> None:
    if input.dim() != 4 or not input.is_floating_point():
        raise ValueError(f"{op} twin: input must be a floating Tensor[N, C, H, W], got {input.dim()}-D {input.dtype}")
    if len(rois) and rois.device.type != "meta" and not (0 <= int(rois[:, 0].min()) and int(rois[:, 0].max()) < input.shape[0]):
        raise ValueError(f"{op} twin: boxes name images outside [0, {input.shape[0] - 1}] (column 0 of Tensor[K, 5])")


def roi_align(input: torch.Tensor, boxes, output_size, spatial_scale: float = 1.0, sampling_ratio: int = -1,
              aligned: bool = False) -> torch.Tensor:
    """``torchvision.ops.roi_align`` with a backward that is deterministic on CUDA.

    input ``(N, C, H, W)``; boxes ``Tensor[K, 5]`` or a list of ``Tensor[L, 4]``; returns
    ``(K, C, output_size[0], output_size[1])``. With ``sampling_ratio <= 0`` (adaptive) the largest
    box sets the number of samples per bin read for every box (one host sync); smaller boxes
    weigh their extra samples 0.
    """
    rois = as_rois(boxes, input)
    _check_feature_map(input, rois, "roi_align")
    pooled_h, pooled_w = _pair(output_size, "output_size")
    n, c, height, width = input.shape
    offset = 0.5 if aligned else 0.0
    start_w, start_h = rois[:, 1] * spatial_scale - offset, rois[:, 2] * spatial_scale - offset
    extent_w, extent_h = rois[:, 3] * spatial_scale - offset - start_w, rois[:, 4] * spatial_scale - offset - start_h
    if not aligned:
        extent_w, extent_h = extent_w.clamp(min=1.0), extent_h.clamp(min=1.0)
    bin_h, bin_w = extent_h / pooled_h, extent_w / pooled_w
    grid_h, grid_w = _grid_counts(extent_h, pooled_h, sampling_ratio), _grid_counts(extent_w, pooled_w, sampling_ratio)
    k = len(rois)
    y_used, y_rows, y_weights = _roi_align_axis(start_h, bin_h, grid_h, pooled_h, _largest(grid_h), height)
    x_used, x_cols, x_weights = _roi_align_axis(start_w, bin_w, grid_w, pooled_w, _largest(grid_w), width)
    # broadcast to (K, pooled_h, pooled_w, samples_h, samples_w)
    y_used, x_used = y_used[:, :, None, :, None], x_used[:, None, :, None, :]
    image = rois[:, 0].long().view(-1, 1, 1, 1, 1)
    indices, weights = [], []
    for row, weight_y in zip(y_rows, y_weights):
        for col, weight_x in zip(x_cols, x_weights):  # the kernel's corner order: hy*hx, hy*lx, ly*hx, ly*lx
            # unused samples read the zeros row: torchvision never reads them, even where they are not finite
            indices.append(pixel_index(image, row[:, :, None, :, None], col[:, None, :, None, :], y_used & x_used,
                                       height, width, n * height * width))
            weights.append(weight_y[:, :, None, :, None] * weight_x[:, None, :, None, :])
    bins = k * pooled_h * pooled_w
    index = torch.stack(indices, dim=-1).reshape(bins, -1)
    weight = torch.stack(weights, dim=-1).reshape(bins, 1, -1).to(input.dtype)
    samples = input_rows(input).index_select(0, index.reshape(-1)).view(bins, index.shape[1], c)
    count = (grid_h * grid_w).clamp(min=1).to(input.dtype).repeat_interleave(pooled_h * pooled_w).view(-1, 1)
    pooled = torch.bmm(weight, samples).view(bins, c) / count
    return pooled.view(k, pooled_h, pooled_w, c).permute(0, 3, 1, 2).contiguous()


def _round_half_away(value: torch.Tensor) -> torch.Tensor:
    """C's ``round`` (halves away from zero); ``torch.round`` rounds halves to even."""
    return torch.where(value >= 0, torch.floor(value + 0.5), torch.ceil(value - 0.5))


def _roi_pool_windows(start: torch.Tensor, end: torch.Tensor, pooled: int, size: int, dtype) -> tuple:
    """Bin windows ``[first, stop)`` of one axis, each ``(K, pooled)``, clipped to ``[0, size]``."""
    extent = (end - start + 1).clamp(min=1)
    bin_size = extent.to(dtype).view(-1, 1) / pooled
    bins = torch.arange(pooled, device=start.device, dtype=dtype).view(1, -1)
    first = torch.floor(bins * bin_size).long() + start.view(-1, 1)
    stop = torch.ceil((bins + 1) * bin_size).long() + start.view(-1, 1)
    return first.clamp(0, size), stop.clamp(0, size)


def roi_pool(input: torch.Tensor, boxes, output_size, spatial_scale: float = 1.0) -> torch.Tensor:
    """``torchvision.ops.roi_pool`` with a backward that is deterministic on CUDA.

    input ``(N, C, H, W)``; boxes ``Tensor[K, 5]`` or a list of ``Tensor[L, 4]``; returns
    ``(K, C, output_size[0], output_size[1])``: the maximum of each bin, 0 for an empty bin. The
    gradient goes to the first maximum in row-major order, as torchvision's argmax. The largest
    bin sets the window read for every bin (one host sync), and the scan over it is a Python loop
    of that many elementwise steps.
    """
    rois = as_rois(boxes, input)
    _check_feature_map(input, rois, "roi_pool")
    pooled_h, pooled_w = _pair(output_size, "output_size")
    n, c, height, width = input.shape
    corners = _round_half_away(rois[:, 1:] * spatial_scale).long()
    first_h, stop_h = _roi_pool_windows(corners[:, 1], corners[:, 3], pooled_h, height, rois.dtype)
    first_w, stop_w = _roi_pool_windows(corners[:, 0], corners[:, 2], pooled_w, width, rois.dtype)
    k = len(rois)
    y = first_h[:, :, None, None, None] + torch.arange(_largest(stop_h - first_h), device=input.device).view(-1, 1)
    x = first_w[:, None, :, None, None] + torch.arange(_largest(stop_w - first_w), device=input.device)
    inside = (y < stop_h[:, :, None, None, None]) & (x < stop_w[:, None, :, None, None])
    image = rois[:, 0].long().view(-1, 1, 1, 1, 1)
    index = pixel_index(image, y, x, inside, height, width, n * height * width)
    bins = k * pooled_h * pooled_w
    window = input_rows(input, fill=float("-inf")).index_select(0, index.reshape(-1)).view(bins, -1, c)
    # torchvision's scan: start at -FLT_MAX (-inf in half precision, where it overflows), keep a
    # value only when strictly greater, so the first of equal maxima wins and NaN never does. The
    # scan runs on values only; one gather of the winners carries the gradient (to them alone).
    float_max = torch.finfo(torch.float32).max
    start = -float_max if torch.finfo(input.dtype).max >= float_max else float("-inf")
    best = torch.full((bins, c), start, dtype=input.dtype, device=input.device)
    winner = torch.zeros((bins, c), dtype=torch.long, device=input.device)
    for position, value in enumerate(window.detach().unbind(1)):
        better = value > best
        best = torch.where(better, value, best)
        winner = winner.masked_fill(better, position)
    found = best > start
    peak = torch.where(found, window.gather(1, winner.unsqueeze(1)).squeeze(1), start)
    empty = ((stop_h <= first_h)[:, :, None] | (stop_w <= first_w)[:, None, :]).reshape(bins, 1)
    peak = torch.where(empty, torch.zeros((), dtype=peak.dtype, device=peak.device), peak)
    peak = peak.view(k, pooled_h, pooled_w, c)
    return peak.permute(0, 3, 1, 2).contiguous()


def _check_deform_shapes(input, offset, weight, bias, mask, out_size: tuple) -> tuple:
    """``(groups, offset_groups)`` from the shapes, as torchvision infers them; ValueError names the mismatch."""
    n, in_channels, _, _ = input.shape
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    taps = kernel_h * kernel_w
    if group_channels == 0 or in_channels % group_channels or out_channels % (in_channels // group_channels):
        raise ValueError(f"deform_conv2d twin: weight {tuple(weight.shape)} does not fit {in_channels} input "
                         "channels: weight.shape[1] * groups must equal them, and groups divide the outputs")
    if offset.dim() != 4 or offset.shape[1] % (2 * taps) or offset.shape[1] == 0:
        raise ValueError(f"deform_conv2d twin: offset {tuple(offset.shape)} must be [N, 2 * offset_groups * "
                         f"{kernel_h} * {kernel_w}, H_out, W_out]")
    offset_groups = offset.shape[1] // (2 * taps)
    if in_channels % offset_groups:
        raise ValueError(f"deform_conv2d twin: {offset_groups} offset groups do not divide {in_channels} channels")
    if offset.shape[0] != n or tuple(offset.shape[2:]) != out_size:
        raise ValueError(f"deform_conv2d twin: offset {tuple(offset.shape)} must be [{n}, ..., {out_size[0]}, "
                         f"{out_size[1]}] for this input, stride, padding and dilation")
    if mask is not None and tuple(mask.shape) != (n, offset_groups * taps, *out_size):
        raise ValueError(f"deform_conv2d twin: mask {tuple(mask.shape)} must be "
                         f"[{n}, {offset_groups * taps}, {out_size[0]}, {out_size[1]}]")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"deform_conv2d twin: bias {tuple(bias.shape)} must be [{out_channels}]")
    return in_channels // group_channels, offset_groups


def _deform_columns(input, offset, mask, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple,
                    offset_groups: int) -> torch.Tensor:
    """Modulated bilinear samples ``(N, offset_groups, taps, H_out, W_out, C / offset_groups)``."""
    n, in_channels, height, width = input.shape
    out_h, out_w = offset.shape[2:]
    taps, group_channels = kernel[0] * kernel[1], in_channels // offset_groups
    shifts = offset.view(n, offset_groups, taps, 2, out_h, out_w)
    tap = torch.arange(taps, device=input.device)
    base_y = (torch.arange(out_h, device=input.device) * stride[0] - padding[0]).view(-1, 1) + \
        (tap // kernel[1] * dilation[0]).view(-1, 1, 1)
    base_x = (torch.arange(out_w, device=input.device) * stride[1] - padding[1]) + \
        (tap % kernel[1] * dilation[1]).view(-1, 1, 1)
    # positions at least in float32, as torchvision's autocast computes (half is off by pixels)
    dtype = torch.promote_types(offset.dtype, torch.float32)
    y = base_y.to(dtype) + shifts[:, :, :, 0]  # (N, offset_groups, taps, H_out, W_out)
    x = base_x.to(dtype) + shifts[:, :, :, 1]
    image = (torch.arange(n, device=input.device).view(-1, 1) * offset_groups +
             torch.arange(offset_groups, device=input.device)).view(n, offset_groups, 1, 1, 1)
    # torchvision reads nothing for a point one pixel or more outside the map: all corners -> zeros row
    sentinel = n * offset_groups * height * width
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    indices, weights = bilinear_corners(y, x, image, height, width, sentinel)
    rows = input_rows(input.reshape(n * offset_groups, group_channels, height, width))
    samples = None
    for index, weight in zip(indices, weights):
        index = torch.where(inside, index, sentinel)
        term = rows.index_select(0, index.reshape(-1)) * weight.reshape(-1, 1)
        samples = term if samples is None else samples + term
    if mask is not None:
        samples = mask.reshape(-1, 1) * samples
    return samples.to(input.dtype).view(n, offset_groups, taps, out_h, out_w, group_channels)


def deform_conv2d(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride=1, padding=0, dilation=1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``torchvision.ops.deform_conv2d`` with a backward that is deterministic on CUDA.

    input ``(N, C_in, H, W)``; offset ``(N, 2 * offset_groups * kh * kw, H_out, W_out)`` holding
    ``(dy, dx)`` per offset group and kernel tap; weight ``(C_out, C_in / groups, kh, kw)``; bias
    ``(C_out,)``; mask ``(N, offset_groups * kh * kw, H_out, W_out)`` or None (no modulation).
    Returns ``(N, C_out, H_out, W_out)``. ``groups`` and ``offset_groups`` follow from the shapes.
    """
    if input.dim() != 4 or weight.dim() != 4:
        raise ValueError(f"deform_conv2d twin: input and weight must be 4-D, got {input.dim()}-D and {weight.dim()}-D")
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    dilation, kernel = _pair(dilation, "dilation"), tuple(weight.shape[2:])
    out_size = tuple((input.shape[2 + i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                     for i in (0, 1))
    groups, offset_groups = _check_deform_shapes(input, offset, weight, bias, mask, out_size)
    n, in_channels = input.shape[:2]
    out_channels, taps = weight.shape[0], kernel[0] * kernel[1]
    samples = _deform_columns(input, offset, mask, kernel, stride, padding, dilation, offset_groups)
    # (N, og, taps, H_out, W_out, C/og) -> (N, groups, H_out*W_out, C/groups*taps), channel-major like weight
    columns = samples.permute(0, 3, 4, 1, 5, 2).reshape(n, out_size[0] * out_size[1], groups, -1).transpose(1, 2)
    kernels = weight.reshape(groups, out_channels // groups, in_channels // groups * taps).transpose(1, 2)
    out = torch.matmul(columns, kernels).transpose(2, 3).reshape(n, out_channels, *out_size)
    return out if bias is None else out + bias.view(1, -1, 1, 1)
