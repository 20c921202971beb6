"""Deterministic twins: equal to the native ops forward and backward, routed by the policy, clean in the audit.

Tolerances (the native CPU kernels as reference, random normal inputs of odd sizes):
- adaptive max pooling: values, indices and gradients bit-identical (the same maxima and the same sums);
- adaptive average pooling and interpolation: float64 within 1e-12, float32 within torch's float32
  defaults (rtol 1.3e-6, atol 1e-5): a matmul adds the same products in another order.
"""

import contextlib
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from utils.determinism.op_audit import AuditReport, Finding, audit_model
from utils.determinism.twins import NATIVE, TWINS, Twin, routing, twin_named, twins_resolving
from utils.determinism.twins.interpolation import interpolate
from utils.determinism.twins.plan import TwinPlan
from utils.determinism.twins.pooling import (adaptive_avg_pool2d, adaptive_avg_pool3d, adaptive_max_pool2d,
                                             adaptive_max_pool3d, windows)
from utils.determinism.twins.torchvision_routes import deform_conv2d_routes, roi_align_routes, torchvision_operator
from utils.torch_utils import configure_determinism

ROOT = Path(__file__).resolve().parents[1]
FLOAT64 = dict(rtol=1e-12, atol=1e-12)


def gradient(fn, x: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(fn(x), x, upstream)[0]


def random_input(shape, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=dtype).requires_grad_(True)


class OpRecorder(TorchDispatchMode):
    """The aten op names a block runs."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------- pooling


def test_windows_overlap_as_aten_computes_them():
    assert windows(7, 3) == [(0, 3), (2, 5), (4, 7)]
    assert windows(5, 7) == [(0, 1), (0, 2), (1, 3), (2, 3), (2, 4), (3, 5), (4, 5)]


MAX_CASES = [((2, 3, 11, 7), (4, 3)), ((2, 3, 11, 7), (None, 3)), ((3, 13, 5), (5, None)), ((2, 3, 9, 9), 1),
             ((1, 2, 5, 5), (7, 9)), ((2, 3, 7, 11, 5), (3, 4, 2)), ((2, 5, 6, 7), (None, 2, 5))]


@pytest.mark.parametrize("shape,size", MAX_CASES)
def test_adaptive_max_pool_is_bit_identical_forward_indices_and_backward(shape, size):
    dims = len(size) if isinstance(size, tuple) else 2
    native = {2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}[dims]
    twin = {2: adaptive_max_pool2d, 3: adaptive_max_pool3d}[dims]
    x = random_input(shape, torch.float32)
    expected, expected_indices = native(x, size, return_indices=True)
    output, indices = twin(x, size, return_indices=True)
    assert torch.equal(output, expected) and torch.equal(indices, expected_indices)
    upstream = torch.randn_like(expected)
    assert torch.equal(gradient(lambda t: twin(t, size), x, upstream), gradient(lambda t: native(t, size), x, upstream))


def test_adaptive_max_pool_takes_the_first_maximum_of_a_tie_as_aten_does():
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[0, 0, 2, 1] = 1.0  # one window holds three equal maxima
    assert torch.equal(adaptive_max_pool2d(x, 2, return_indices=True)[1], F.adaptive_max_pool2d(x, 2, True)[1])


AVG_CASES = [((2, 3, 11, 7), (4, 3)), ((2, 3, 11, 7), (None, 1)), ((3, 13, 5), (1, None)), ((2, 3, 9, 9), 1),
             ((1, 2, 5, 5), (7, 9)), ((2, 3, 7, 11, 5), (3, 4, 2)), ((2, 5, 6, 7), (None, 2, 5)),
             ((2, 3, 8, 8), (8, 8))]


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, FLOAT64), (torch.float32, {})])
@pytest.mark.parametrize("shape,size", AVG_CASES)
def test_adaptive_avg_pool_matches_native_forward_and_backward(shape, size, dtype, tolerance):
    dims = len(size) if isinstance(size, tuple) else 2
    native = {2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[dims]
    twin = {2: adaptive_avg_pool2d, 3: adaptive_avg_pool3d}[dims]
    x = random_input(shape, dtype)
    expected = native(x, size)
    torch.testing.assert_close(twin(x, size), expected, **tolerance)
    upstream = torch.randn_like(expected)
    torch.testing.assert_close(gradient(lambda t: twin(t, size), x, upstream),
                               gradient(lambda t: native(t, size), x, upstream), **tolerance)


def test_pool_twins_refuse_a_wrong_number_of_sizes_in_one_line():
    with pytest.raises(ValueError, match="expected 2 sizes"):
        adaptive_avg_pool2d(torch.zeros(1, 1, 4, 4), (1, 2, 3))


# ----------------------------------------------------------------------------- interpolation


def interpolation_cases():
    sized = {1: (13,), 2: (13, 5), 3: (13, 5, 9)}
    for mode, shape in [("linear", (2, 3, 11)), ("bilinear", (2, 3, 7, 11)), ("trilinear", (1, 2, 5, 7, 3)),
                        ("bicubic", (2, 3, 7, 11))]:
        for align_corners in (False, True):
            for call in (dict(scale_factor=2), dict(scale_factor=1.7), dict(scale_factor=0.6),
                         dict(scale_factor=2.5, recompute_scale_factor=True), dict(size=sized[len(shape) - 2]),
                         dict(size=shape[2:])):
                yield mode, shape, dict(align_corners=align_corners, **call)
    for mode in ("bilinear", "bicubic"):
        for align_corners in (False, True):
            for call in (dict(scale_factor=0.4), dict(scale_factor=2), dict(size=(3, 17)),
                         dict(scale_factor=0.7, recompute_scale_factor=True)):
                yield mode, (2, 3, 13, 11), dict(align_corners=align_corners, antialias=True, **call)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, FLOAT64), (torch.float32, {})])
@pytest.mark.parametrize("mode,shape,call", list(interpolation_cases()))
def test_interpolate_matches_native_forward_and_backward(mode, shape, call, dtype, tolerance):
    x = random_input(shape, dtype)
    expected = F.interpolate(x, mode=mode, **call)
    output = interpolate(x, mode=mode, **call)
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected, **tolerance)
    upstream = torch.randn_like(expected)
    torch.testing.assert_close(gradient(lambda t: interpolate(t, mode=mode, **call), x, upstream),
                               gradient(lambda t: F.interpolate(t, mode=mode, **call), x, upstream), **tolerance)


def test_interpolate_leaves_other_modes_and_bad_arguments_to_native():
    x = torch.randn(1, 2, 5, 5)
    with OpRecorder() as recorder:
        interpolate(x, scale_factor=2, mode="nearest")
    assert "upsample_nearest2d" in recorder.ops
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        interpolate(x, size=3, scale_factor=2, mode="bilinear")


# ----------------------------------------------------------------------------- the router


class RoutedBlocks(nn.Module):
    """Every routed spelling: nn modules, F functions with and without indices, 1-D pools and area mode."""

    def __init__(self):
        super().__init__()
        self.max_pool = nn.AdaptiveMaxPool2d((None, 3))
        self.avg_pool = nn.AdaptiveAvgPool2d((3, None))
        self.upsample = nn.Upsample(scale_factor=1.5, mode="bicubic", align_corners=True)

    def forward(self, x):
        flat = x.flatten(2)
        parts = [self.max_pool(x), self.avg_pool(x), self.upsample(x), F.adaptive_max_pool2d(x, 3, True)[0],
                 F.interpolate(x, size=(4, 4), mode="area"), F.adaptive_max_pool1d(flat, 5),
                 F.adaptive_avg_pool1d(flat, 4), F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
                 F.adaptive_max_pool3d(x.unsqueeze(1), (2, 3, 2)), F.adaptive_avg_pool3d(x.unsqueeze(1), 2)]
        return sum(p.sum() for p in parts)


def test_router_sends_every_spelling_to_a_twin_and_native_kernels_never_run():
    x = torch.randn(2, 3, 9, 7, requires_grad=True)
    block = RoutedBlocks()
    with OpRecorder() as recorder:
        with routing(TWINS):
            routed = block(x)
        routed.backward()
    native_kernels = {op for op in recorder.ops if "pool" in op or "upsample" in op}
    assert native_kernels == set() and {"gather", "scatter_add"} <= recorder.ops
    torch.testing.assert_close(routed, block(x))


def test_router_passes_what_no_twin_covers_to_native():
    with OpRecorder() as recorder, routing(TWINS):
        F.interpolate(torch.randn(1, 1, 4, 4), scale_factor=2, mode="nearest")
    assert "upsample_nearest2d" in recorder.ops


def test_a_twin_is_one_table_entry_and_an_adapter_may_decline():
    calls = []

    def doubling_relu(input, inplace=False):
        calls.append(input.shape)
        return NATIVE if input.dim() == 1 else input.clamp(min=0) * 2

    twin = Twin("relu", ("relu_backward_test",), ((F.relu, doubling_relu),))
    with routing([twin]):
        assert torch.equal(F.relu(torch.tensor([[-1.0, 2.0]])), torch.tensor([[0.0, 4.0]]))
        assert torch.equal(F.relu(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
    assert len(calls) == 2 and twins_resolving(["relu_backward_test"]) == ()


def test_twins_resolve_the_op_table_names_of_their_findings():
    assert [t.name for t in twins_resolving(["adaptive_max_pool2d_backward", "put_"])] == ["adaptive_max_pool2d"]
    assert "upsample_bicubic2d_backward" in twin_named("interpolate").resolves
    # the audit names torchvision's findings with their namespace
    namespaced = ["torchvision::_roi_align_backward", "torchvision::_deform_conv2d_backward"]
    assert [t.name for t in twins_resolving(namespaced)] == ["deform_conv2d", "roi_align"]


def test_torchvision_operators_reach_the_router_with_their_own_arguments():
    """torchvision.ops.roi_align and RoIAlign call torch.ops.torchvision.roi_align: the mode sees that packet."""
    seen = []

    def roi_align_twin(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
        seen.append((boxes.shape, output_size, spatial_scale, sampling_ratio, aligned))
        return torch.zeros(boxes.shape[0], input.shape[1], *output_size)

    x, rois = torch.randn(1, 2, 8, 8), torch.tensor([[0.0, 0, 0, 4, 4]])
    with routing([Twin("roi_align", ("_roi_align_backward",), roi_align_routes(roi_align_twin))]):
        out = torch.ops.torchvision.roi_align(x, rois, 0.5, 3, 2, 2, True)
    assert out.shape == (1, 2, 3, 2) and seen == [((1, 5), (3, 2), 0.5, 2, True)]
    assert torchvision_operator("no_such_operator") is None
    assert len(deform_conv2d_routes(lambda *a, **k: None)) == 2


def test_roi_align_s_deterministic_python_path_runs_the_twin_while_routing(monkeypatch):
    """On CUDA under determinism torchvision.ops.roi_align skips its operator for the module function
    _roi_align, which the mode cannot see. Forced here by torchvision's own switch (no operators), with
    _roi_align made to fail: while routing the twin answers, and afterwards _roi_align is put back."""
    import sys

    import torchvision.ops as tvo

    module = sys.modules["torchvision.ops.roi_align"]
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64, requires_grad=True)
    boxes = torch.tensor([[0, 1.0, 1.5, 7.0, 6.0], [1, 0.0, 2.0, 9.5, 8.0]], dtype=torch.float64)
    expected = tvo.roi_align(x, boxes, (3, 2), 0.5, 2, True)

    def torchvision_fallback(*args):
        raise AssertionError("torchvision's pure-PyTorch roi_align ran")

    monkeypatch.setattr(module, "_roi_align", torchvision_fallback)
    monkeypatch.setattr(module, "_has_ops", lambda: False)
    with OpRecorder() as recorder, routing([twin_named("roi_align")]):
        routed = tvo.roi_align(x, boxes, (3, 2), 0.5, 2, True)
    torch.testing.assert_close(routed, expected, **FLOAT64)
    assert "roi_align" not in recorder.ops and module._roi_align is torchvision_fallback
    with pytest.raises(AssertionError, match="pure-PyTorch"):
        tvo.roi_align(x, boxes, (3, 2), 0.5, 2, True)


# ----------------------------------------------------------------------------- audit and policy


class TwinnedBlock(nn.Module):
    """One of each twinned op, after a convolution so the backward reaches a parameter."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.max_pool = nn.AdaptiveMaxPool2d((None, 3))
        self.avg_pool = nn.AdaptiveAvgPool2d(5)
        self.max_pool3d = nn.AdaptiveMaxPool3d((2, 3, 3))
        self.avg_pool3d = nn.AdaptiveAvgPool3d(2)

    def forward(self, x):
        y = self.conv(x)
        volume = y.unsqueeze(1)
        return (F.interpolate(self.max_pool(y), size=(7, 7), mode="bicubic").sum()
                + F.interpolate(self.avg_pool(y), size=(7, 7), mode="bilinear", antialias=True).sum()
                + self.max_pool3d(volume).sum() + self.avg_pool3d(volume).sum()
                + F.interpolate(y.flatten(2), scale_factor=1.3, mode="linear").sum())


EXPECTED_NATIVE = {"adaptive_max_pool2d_backward", "_adaptive_avg_pool2d_backward", "adaptive_max_pool3d_backward",
                   "_adaptive_avg_pool3d_backward", "upsample_bicubic2d_backward", "_upsample_bilinear2d_aa_backward",
                   "upsample_linear1d_backward"}


def test_the_audit_predicts_cuda_failures_natively_and_none_with_the_twins():
    native = audit_model(TwinnedBlock(), imgsz=13)
    assert {f.op for f in native.findings} == EXPECTED_NATIVE
    twins = TwinPlan.candidates(native)
    assert {t.name for t in twins} == {"adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool2d",
                                       "adaptive_avg_pool3d", "interpolate"}
    twinned = audit_model(TwinnedBlock(), imgsz=13, forward_scope=lambda: routing(twins))
    assert twinned.clean and twinned.cuda_trace == "meta"
    plan = TwinPlan.confirmed(twins, native, twinned)
    assert {f.op for f in plan.replaced} == EXPECTED_NATIVE
    assert "max_pool (AdaptiveMaxPool2d) adaptive_max_pool2d_backward -> twin adaptive_max_pool2d" in plan.describe()


POOL = Finding("adaptive_max_pool2d_backward", "backward", "model.7.max_pool (AdaptiveMaxPool2d)", ("cuda",))
PUT = Finding("put_", "backward", "model.2 (PutGradient)", ("cpu", "cuda"))


def test_a_finding_the_twinned_audit_still_has_is_not_counted_replaced():
    twins = TwinPlan.candidates(AuditReport("cpu", 64, findings=[POOL, PUT]))
    assert [t.name for t in twins] == ["adaptive_max_pool2d"]
    plan = TwinPlan.confirmed(twins, AuditReport("cpu", 64, findings=[POOL, PUT]),
                              AuditReport("cpu", 64, findings=[PUT]))
    assert plan.replaced == (POOL,) and plan.to_dict()["replaced"][0]["module"] == POOL.module
    unresolved = TwinPlan.confirmed(twins, AuditReport("cpu", 64, findings=[POOL]), AuditReport("cpu", 64, findings=[POOL]))
    assert unresolved.replaced == () and unresolved.twins == ()


def start_up(mode: str, model: nn.Module):
    from utils.determinism.audit_cache import start_up_audit

    from utils.extra_hyps import with_extra_hyp
    from utils.files import yaml_load

    policy = configure_determinism(mode)
    hyp = with_extra_hyp(yaml_load(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"), "test")
    report, _ = start_up_audit(policy, model, 64, torch.device("cpu"), hyp, amp=False)
    return policy, report


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["scoped", "strict", "warn"])
def test_scoped_and_strict_use_twins_and_keep_full_determinism_warn_keeps_native(mode, tmp_path, log_lines):
    from models.yolo import Model
    from tests.support.twin_blocks import write_twin_model_yaml

    model = Model(write_twin_model_yaml(tmp_path))
    policy, report = start_up(mode, model)
    if mode == "warn":
        assert policy.twins is None and not report["clean"]
        assert isinstance(policy.forward_scope(), contextlib.nullcontext)
        return
    assert report["clean"] and policy.relax_backward is False and policy.nondeterministic_ops == {}
    replaced = {item["module"] for item in policy.twins.to_dict()["replaced"]}
    # AdaptiveAvgPool2d(1) is not among them: aten computes a 1x1 average pool as a mean
    assert replaced == {"model.2.max_pool (AdaptiveMaxPool2d)", "model.4 (CoordinatePyramid)",
                        "model.4.pool_h (AdaptiveAvgPool2d)",
                        "model.4.pool_w (AdaptiveAvgPool2d)", "model.4.pyramid (AdaptiveMaxPool2d)"}
    assert any(f"audit ({mode}): clean with twins" in line for line in log_lines)
    assert sum("deterministic twins replace 5 op(s): model.2.max_pool (AdaptiveMaxPool2d)" in line
               for line in log_lines) == 1
    with OpRecorder() as recorder, policy.forward_scope():
        model.train()(torch.rand(2, 3, 64, 64))
    assert not {op for op in recorder.ops if "adaptive" in op or "upsample_bicubic" in op}


@pytest.mark.slow
def test_a_cached_start_up_audit_brings_back_the_same_twins(tmp_path, monkeypatch):
    from models.yolo import Model
    from tests.support.twin_blocks import write_twin_model_yaml
    from utils.determinism import audit_cache

    monkeypatch.setenv(audit_cache.CACHE_ENV, str(tmp_path / "cache"))
    model = Model(write_twin_model_yaml(tmp_path))
    first, first_report = start_up("strict", model)
    second, second_report = start_up("strict", model)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2  # the native audit and the one with twins
    assert first.twins.to_dict() == second.twins.to_dict() and first_report == second_report


@pytest.mark.slow
def test_audit_command_says_what_the_twins_make_of_a_flagged_model(tmp_path, capsys):
    from audit import EXIT_FINDINGS, main
    from tests.support.twin_blocks import write_twin_model_yaml

    assert main(["--cfg", str(write_twin_model_yaml(tmp_path)), "--imgsz", "64"]) == EXIT_FINDINGS  # natively
    printed = capsys.readouterr().out
    assert re.search(r"adaptive_max_pool2d_backward +backward +cuda", printed)
    twins_line = printed.strip().splitlines()[-1]
    assert twins_line.startswith("With twins (--deterministic scoped and strict): deterministic twins replace 5 op(s)")
    assert twins_line.endswith("Audit with twins: clean")
