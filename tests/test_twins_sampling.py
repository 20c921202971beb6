"""The deterministic twins of grid_sample, deform_conv2d, roi_align and roi_pool against the native ops.

Tolerances (absolute, on unit-scale random data): float64 forward 1e-12, backward 1e-10; float32
forward 1e-5, backward 1e-4. Nearest grid_sample and roi_pool are compared bit for bit (same
arithmetic: a copy and a maximum); bilinear blends and the convolution's matmul sum in another order.
"""

import itertools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.ops as tvo
from torch.utils._python_dispatch import TorchDispatchMode

from utils.determinism.op_audit import audit_model
from utils.determinism.twins.sampling import grid_sample
from utils.determinism.twins.vision_ops import deform_conv2d, roi_align, roi_pool
from utils.torch_utils import temporary_determinism

TOLERANCE = {torch.float64: (1e-12, 1e-10), torch.float32: (1e-5, 1e-4)}  # (forward, backward)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_twin_matches(native, twin, inputs: tuple, exact: bool = False, seed: int = 0) -> None:
    """Forward and the gradients of every input that requires grad agree within TOLERANCE (or exactly)."""
    expected, got = native(*inputs), twin(*inputs)
    dtype = expected.dtype
    forward_tol, backward_tol = (0.0, 0.0) if exact else TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, rtol=0, atol=forward_tol)
    upstream = torch.randn(expected.shape, generator=generator(seed), dtype=dtype)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    got_grads = torch.autograd.grad(got, leaves, upstream)
    for index, (g, e) in enumerate(zip(got_grads, expected_grads)):
        torch.testing.assert_close(g, e, rtol=0, atol=backward_tol, msg=lambda m, i=index: f"grad {i}: {m}")


# ----------------------------------------------------------------------------- grid_sample


def sampling_grid(n: int, h: int, w: int, dtype, seed: int) -> torch.Tensor:
    """Random points in [-1.6, 1.6] (inside and outside the map) plus the exact edges -1, 0 and 1."""
    grid = torch.rand((n, h, w, 2), generator=generator(seed), dtype=dtype) * 3.2 - 1.6
    grid[:, 0, :3] = torch.tensor([[-1.0, -1.0], [0.0, 1.0], [1.0, 1.0]], dtype=dtype)
    return grid.requires_grad_()


@pytest.mark.parametrize("mode,padding_mode,align_corners",
                         list(itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection"),
                                                (False, True))))
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_grid_sample_matches_native(mode, padding_mode, align_corners, dtype):
    image = torch.randn((2, 3, 5, 7), generator=generator(1), dtype=dtype).requires_grad_()
    grid = sampling_grid(2, 4, 9, dtype, seed=2)
    options = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    assert_twin_matches(lambda x, g: F.grid_sample(x, g, **options), lambda x, g: grid_sample(x, g, **options),
                        (image, grid), exact=mode == "nearest")


@pytest.mark.parametrize("padding_mode", ("border", "reflection"))
def test_grid_sample_identity_grid_edges(padding_mode):
    """affine_grid's identity puts points exactly on the border, where aten's clip passes no gradient."""
    image = torch.randn((1, 2, 4, 6), generator=generator(3), dtype=torch.float64).requires_grad_()
    grid = F.affine_grid(torch.eye(2, 3, dtype=torch.float64)[None], (1, 2, 5, 3), align_corners=True)
    options = dict(padding_mode=padding_mode, align_corners=True)
    assert_twin_matches(lambda x, g: F.grid_sample(x, g, **options), lambda x, g: grid_sample(x, g, **options),
                        (image, grid.requires_grad_()))


def test_grid_sample_single_pixel_maps():
    """Maps of size 1: reflection with align_corners has one point, and its grid gradient is 0."""
    image = torch.randn((2, 3, 1, 1), generator=generator(4), dtype=torch.float64).requires_grad_()
    for padding_mode, align_corners in itertools.product(("zeros", "border", "reflection"), (False, True)):
        options = dict(padding_mode=padding_mode, align_corners=align_corners)
        assert_twin_matches(lambda x, g: F.grid_sample(x, g, **options), lambda x, g: grid_sample(x, g, **options),
                            (image, sampling_grid(2, 3, 4, torch.float64, seed=5)))


@pytest.mark.parametrize("image_shape,grid_shape,options,words", [
    ((1, 2, 3, 4, 5), (1, 2, 2, 2, 3), {}, "4-D"),
    ((1, 2, 3, 4), (1, 2, 2, 2), {"mode": "bicubic"}, "mode='bicubic'"),
    ((1, 2, 3, 4), (1, 2, 2, 2), {"padding_mode": "wrap"}, "padding_mode='wrap'"),
    ((1, 2, 3, 4), (2, 2, 2, 2), {}, "grid must be"),
])
def test_grid_sample_refuses_what_it_does_not_cover(image_shape, grid_shape, options, words):
    with pytest.raises(ValueError, match=words):
        grid_sample(torch.zeros(image_shape), torch.zeros(grid_shape), **options)


# ----------------------------------------------------------------------------- roi_align, roi_pool

# Boxes inside, partly and wholly outside the map, thin, wider than the map, with .5 edges after scaling.
BOXES = [[0, 1.3, 2.2, 9.7, 8.1], [1, -2.0, -1.5, 5.0, 3.0], [1, 3.0, 4.0, 3.2, 4.1], [0, 0.0, 0.0, 30.0, 25.0],
         [1, 10.6, 9.4, 12.9, 10.9], [0, 40.0, 40.0, 44.0, 46.0], [1, 5.0, 3.0, 9.0, 7.0]]


def feature_map(dtype, seed: int = 6) -> torch.Tensor:
    return torch.randn((2, 5, 11, 13), generator=generator(seed), dtype=dtype).requires_grad_()


@pytest.mark.parametrize("aligned,sampling_ratio,spatial_scale",
                         list(itertools.product((False, True), (-1, 0, 2, 3), (1.0, 0.5))))
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_roi_align_matches_native(aligned, sampling_ratio, spatial_scale, dtype):
    boxes = torch.tensor(BOXES, dtype=dtype)
    arguments = ((3, 4), spatial_scale, sampling_ratio, aligned)
    assert_twin_matches(lambda x: tvo.roi_align(x, boxes, *arguments), lambda x: roi_align(x, boxes, *arguments),
                        (feature_map(dtype),))


def test_roi_align_reads_no_sample_it_does_not_use():
    """Pixels that only a small box's unused samples reach (past its grid, which the large box
    sets) are never read: an inf there must not turn the small box's bins into NaN."""
    features = feature_map(torch.float64).detach()
    features[0, :, 8:, :] = float("inf")
    features.requires_grad_()
    boxes = torch.tensor([[0, 0.0, 0.0, 24.0, 24.0], [0, 11.0, 11.0, 12.0, 12.0]], dtype=torch.float64)
    assert_twin_matches(lambda x: tvo.roi_align(x, boxes, 2, 0.5)[1], lambda x: roi_align(x, boxes, 2, 0.5)[1],
                        (features,))
    assert roi_align(features, boxes, 2, 0.5)[1].isfinite().all()


def test_roi_align_takes_a_list_of_boxes_per_image():
    boxes = torch.tensor(BOXES, dtype=torch.float64)
    per_image = [boxes[boxes[:, 0] == i, 1:] for i in range(2)]
    assert_twin_matches(lambda x: tvo.roi_align(x, per_image, 3, 0.5), lambda x: roi_align(x, per_image, 3, 0.5),
                        (feature_map(torch.float64),))


@pytest.mark.parametrize("spatial_scale", (1.0, 0.5, 0.7))
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_roi_pool_matches_native_bit_for_bit(spatial_scale, dtype):
    boxes = torch.tensor(BOXES, dtype=dtype)
    assert_twin_matches(lambda x: tvo.roi_pool(x, boxes, (3, 4), spatial_scale),
                        lambda x: roi_pool(x, boxes, (3, 4), spatial_scale), (feature_map(dtype),), exact=True)


def test_roi_pool_ties_and_half_pixel_rounding():
    """Equal maxima (ReLU zeros) send the gradient to the first; 2.5 rounds away from zero, as C's round."""
    features = feature_map(torch.float64).detach().relu().round().requires_grad_()
    boxes = [torch.tensor([[2.5, 0.5, 8.5, 6.5], [1.0, 1.0, 12.0, 10.0]], dtype=torch.float64)] * 2
    assert_twin_matches(lambda x: tvo.roi_pool(x, boxes, 3), lambda x: roi_pool(x, boxes, 3), (features,),
                        exact=True)


def test_roi_pool_skips_nan_and_starts_at_minus_float_max():
    """As torchvision's scan: NaN never wins a bin, and a bin of -inf pools to -FLT_MAX."""
    features = feature_map(torch.float32).detach()
    features[0, :, 2:5, 1:4] = float("nan")
    features[1, :, 6:9, 4:8] = float("-inf")
    features.requires_grad_()
    boxes = torch.tensor([[0, 1.0, 2.0, 9.0, 8.0], [1, 4.0, 6.0, 7.0, 8.0]])
    expected, got = tvo.roi_pool(features, boxes, 2), roi_pool(features, boxes, 2)
    assert got.isnan().any() == expected.isnan().any()
    assert (expected == -torch.finfo(torch.float32).max).any()
    assert torch.equal(got, expected)
    upstream = torch.randn(expected.shape, generator=generator(11))
    assert torch.equal(torch.autograd.grad(got, features, upstream)[0],
                       torch.autograd.grad(expected, features, upstream)[0])


@pytest.mark.parametrize("op", (roi_align, roi_pool))
def test_roi_ops_refuse_malformed_boxes(op):
    with pytest.raises(ValueError, match=r"\[K, 5\]"):
        op(torch.zeros(1, 2, 4, 4), torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match=r"\[L, 4\]"):
        op(torch.zeros(1, 2, 4, 4), [torch.zeros(3, 5)], 2)
    with pytest.raises(ValueError, match="outside"):
        op(torch.zeros(1, 2, 4, 4), torch.tensor([[1.0, 0, 0, 2, 2]]), 2)


# ----------------------------------------------------------------------------- deform_conv2d

DEFORM_CASES = {  # in, out, groups, offset groups, kernel, stride, padding, dilation, mask
    "plain": (4, 6, 1, 1, (3, 3), 1, 1, 1, False),
    "modulated": (4, 6, 1, 1, (3, 3), 1, 1, 1, True),
    "groups-strided-dilated": (4, 6, 2, 2, (3, 2), 2, (1, 0), (2, 1), True),
    "offset-groups": (6, 4, 2, 3, (3, 3), 1, 0, 1, False),
    "one-by-one": (3, 5, 1, 1, (1, 1), (1, 2), 0, 1, True),
}


def deform_inputs(case: tuple, dtype, seed: int = 7) -> tuple:
    """Random (input, offset, weight, bias, mask, options) with offsets of +-2 pixels, reaching past the borders."""
    c_in, c_out, groups, offset_groups, kernel, stride, padding, dilation, masked = case
    g = generator(seed)
    size = (9, 10)
    image = torch.randn((2, c_in, *size), generator=g, dtype=dtype)
    weight = torch.randn((c_out, c_in // groups, *kernel), generator=g, dtype=dtype)
    bias = torch.randn((c_out,), generator=g, dtype=dtype)
    out_h, out_w = ((n + 2 * p - d * (k - 1) - 1) // s + 1
                    for n, p, d, k, s in zip(size, _pair(padding), _pair(dilation), kernel, _pair(stride)))
    taps = offset_groups * kernel[0] * kernel[1]
    offset = torch.randn((2, 2 * taps, out_h, out_w), generator=g, dtype=dtype) * 2
    mask = torch.rand((2, taps, out_h, out_w), generator=g, dtype=dtype) if masked else None
    for t in (image, offset, weight, bias, mask):
        if t is not None:
            t.requires_grad_()
    return image, offset, weight, bias, mask, dict(stride=stride, padding=padding, dilation=dilation)


def _pair(value) -> tuple:
    return (value, value) if isinstance(value, int) else value


@pytest.mark.parametrize("case", DEFORM_CASES.values(), ids=DEFORM_CASES.keys())
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_deform_conv2d_matches_native(case, dtype):
    image, offset, weight, bias, mask, options = deform_inputs(case, dtype)
    inputs = (image, offset, weight, bias) + ((mask,) if mask is not None else ())

    def call(op):
        return lambda x, o, w, b, m=None: op(x, o, w, b, mask=m, **options)

    assert_twin_matches(call(tvo.deform_conv2d), call(deform_conv2d), inputs)


def test_deform_conv2d_without_bias():
    image, offset, weight, _, mask, options = deform_inputs(DEFORM_CASES["modulated"], torch.float64)
    assert_twin_matches(lambda x, o, w, m: tvo.deform_conv2d(x, o, w, mask=m, **options),
                        lambda x, o, w, m: deform_conv2d(x, o, w, mask=m, **options), (image, offset, weight, mask))


@pytest.mark.parametrize("change,words", [
    ({"weight": torch.zeros(6, 3, 3, 3)}, "weight"),
    ({"offset": torch.zeros(2, 17, 9, 10)}, "offset"),
    ({"offset": torch.zeros(2, 18, 8, 10)}, "offset"),
    ({"mask": torch.zeros(2, 8, 9, 10)}, "mask"),
    ({"bias": torch.zeros(5)}, "bias"),
])
def test_deform_conv2d_refuses_mismatched_shapes(change, words):
    arguments = {"input": torch.zeros(2, 4, 9, 10), "offset": torch.zeros(2, 18, 9, 10),
                 "weight": torch.zeros(6, 4, 3, 3), "bias": None, "padding": 1, "mask": None, **change}
    with pytest.raises(ValueError, match=words):
        deform_conv2d(**arguments)


@pytest.mark.parametrize("name", ("grid_sample", "roi_align", "roi_pool", "deform_conv2d"))
def test_twins_under_bfloat16_autocast(name):
    """Under autocast (half-precision features, float32 grids, boxes and offsets) each twin runs,
    returns the dtype torchvision's and aten's autocast rules give, and stays within bfloat16
    rounding of the float32 native op."""
    features = torch.randn((2, 4, 9, 10), generator=generator(12))
    boxes = torch.tensor(BOXES)
    grid = sampling_grid(2, 4, 5, torch.float32, seed=13).detach()
    offset = torch.randn((2, 18, 9, 10), generator=generator(14))
    weight = torch.randn((3, 4, 3, 3), generator=generator(15))
    calls = {"grid_sample": (lambda op, x: op(x, grid, align_corners=False), F.grid_sample, grid_sample,
                             torch.float32),
             "roi_align": (lambda op, x: op(x, boxes, 3, 0.5), tvo.roi_align, roi_align, torch.bfloat16),
             "roi_pool": (lambda op, x: op(x, boxes, 3, 0.5), tvo.roi_pool, roi_pool, torch.bfloat16),
             "deform_conv2d": (lambda op, x: op(x, offset, weight, padding=1), tvo.deform_conv2d, deform_conv2d,
                               torch.bfloat16)}
    call, native, twin, dtype = calls[name]
    expected = call(native, features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = call(twin, features.bfloat16())
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=0.03 * expected.abs().max().item())


# ----------------------------------------------------------------------------- determinism and the audit


class Warp(nn.Module):
    """A spatial transformer: a conv predicts a small warp of the identity grid."""

    def __init__(self, sample=grid_sample):
        super().__init__()
        self.conv, self.sample = nn.Conv2d(3, 2, 3, padding=1), sample

    def forward(self, x):
        identity = F.affine_grid(torch.eye(2, 3).to(x).expand(len(x), 2, 3), x.shape, align_corners=True)
        grid = identity + 0.1 * torch.tanh(self.conv(x)).permute(0, 2, 3, 1)
        return self.sample(x, grid, align_corners=True)  # bilinear, zeros, align_corners: cuDNN's sampler natively


class Deform(nn.Module):
    """A modulated deformable convolution (DCNv2) whose offsets and mask come from a conv."""

    def __init__(self, op=deform_conv2d):
        super().__init__()
        self.offsets, self.op = nn.Conv2d(3, 27, 3, padding=1), op
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3, generator=generator(8)) * 0.1)

    def forward(self, x):
        shifts = self.offsets(x)
        return self.op(x, shifts[:, :18], self.weight, None, 1, 1, 1, torch.sigmoid(shifts[:, 18:]))


class Regions(nn.Module):
    """Fixed boxes pooled from a conv's features, aligned (adaptive samples) or max-pooled."""

    def __init__(self, op=roi_align):
        super().__init__()
        self.conv, self.op = nn.Conv2d(3, 4, 3, padding=1), op

    def forward(self, x):
        boxes = torch.tensor([[0, 1.0, 2.0, 20.0, 30.0], [1, 5.0, 5.0, 9.0, 9.0]]).to(x)
        return self.op(self.conv(x), boxes, 3, 0.5)


TWIN_BLOCKS = {"grid_sample": Warp, "deform_conv2d": Deform, "roi_align": Regions,
               "roi_pool": lambda: Regions(roi_pool)}


@pytest.mark.parametrize("name", TWIN_BLOCKS)
def test_twin_backward_raises_nothing_under_deterministic_algorithms(name):
    block = TWIN_BLOCKS[name]()
    images = torch.rand((2, 3, 16, 16), generator=generator(9), requires_grad=True)
    with temporary_determinism(True), warnings.catch_warnings():
        warnings.simplefilter("error")
        block(images).square().sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    assert all(p.grad is not None for p in block.parameters())


class OpNames(TorchDispatchMode):
    """Records the name of every op dispatched, e.g. 'aten::index_select', 'torchvision::roi_align'."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name().split(".")[0])
        return func(*args, **(kwargs or {}))


def ops_of_step(block: nn.Module) -> set:
    with OpNames() as recorder:
        block(torch.rand((2, 3, 16, 16), generator=generator(10))).sum().backward()
    return recorder.names


NATIVE_BLOCKS = {"grid_sample": (lambda: Warp(F.grid_sample), "aten::grid_sampler_2d_backward"),
                 "deform_conv2d": (lambda: Deform(tvo.deform_conv2d), "torchvision::_deform_conv2d_backward"),
                 "roi_align": (lambda: Regions(tvo.roi_align), "torchvision::_roi_align_backward"),
                 "roi_pool": (lambda: Regions(tvo.roi_pool), "torchvision::_roi_pool_backward")}


@pytest.mark.parametrize("name", TWIN_BLOCKS)
def test_twin_runs_no_sampler_and_no_torchvision_kernel(name):
    """The twin's step dispatches only aten ops and none of the native op's; the native step does (control)."""
    make_native, native_backward = NATIVE_BLOCKS[name]
    assert native_backward in ops_of_step(make_native())
    twin_ops = ops_of_step(TWIN_BLOCKS[name]())
    assert all(op.startswith("aten::") for op in twin_ops), twin_ops
    assert not {op for op in twin_ops if any(word in op for word in ("grid_sampler", "roi", "deform"))}
    assert "aten::index_select" in twin_ops


@pytest.mark.parametrize("name", TWIN_BLOCKS)
def test_twin_audits_clean_with_a_meta_cuda_trace(name):
    report = audit_model(TWIN_BLOCKS[name](), imgsz=16, ch=3)
    assert report.clean, report.format()
    assert report.cuda_trace == "meta", report.cuda_trace  # CUDA predicted from CUDA's branches, not the CPU's


def test_native_grid_sample_block_is_flagged():
    """Control for the audit test: the same block with F.grid_sample is predicted to fail on CUDA."""
    report = audit_model(Warp(F.grid_sample), imgsz=16, ch=3)
    assert {f.op for f in report.findings if "cuda" in f.devices} >= {"cudnn_grid_sampler_backward"}
