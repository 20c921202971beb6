"""A user's zoo of nine YOLO blocks (tests/support/user_block_zoo.py) against the audit and the twins.

Each block, after a convolution (so its backward reaches the block's input), is audited natively and
with the twins the policy would route (``twinned_audit``, as the start-up audit runs it): the CUDA
findings are the ones the op table predicts, and the twins remove every one of them. One slow test
trains a model holding every block under ``--deterministic strict`` twice and compares checksums.
"""

import json

import pytest
import torch
import torch.nn as nn

from tests.support.user_block_zoo import (CBAM, ZOO, CoordAttention, DeformableConv, MaxPyramid, PooledBicubic,
                                          PyramidPooling, RegionContext, SpatialTransformer, SqueezeExcite,
                                          write_zoo_model_yaml)
from utils.determinism.op_audit import audit_model
from utils.determinism.twins.plan import twinned_audit

# block -> (CUDA findings of the native block as {(op, module under the block)}, twins that replace them)
EXPECTED = {
    # aten computes a 1x1 average pool as a mean, whose CUDA backward is deterministic: nothing to replace
    SqueezeExcite: (set(), set()),
    CBAM: ({("adaptive_max_pool2d_backward", "max_pool")}, {"adaptive_max_pool2d"}),
    CoordAttention: ({("_adaptive_avg_pool2d_backward", "pool_h"), ("_adaptive_avg_pool2d_backward", "pool_w")},
                     {"adaptive_avg_pool2d"}),
    # the 1-cell stage is a mean; CUDA takes bilinear upsampling's deterministic decomposition
    PyramidPooling: ({("_adaptive_avg_pool2d_backward", f"stages.{i}.0") for i in (1, 2, 3)},
                     {"adaptive_avg_pool2d"}),
    MaxPyramid: ({("adaptive_max_pool2d_backward", f"pools.{i}") for i in range(3)}, {"adaptive_max_pool2d"}),
    SpatialTransformer: ({("grid_sampler_2d_backward", "")}, {"grid_sample"}),
    PooledBicubic: ({("_adaptive_avg_pool2d_backward", "pool"), ("upsample_bicubic2d_backward", "")},
                    {"adaptive_avg_pool2d", "interpolate"}),
    DeformableConv: ({("torchvision::_deform_conv2d_backward", "deform")}, {"deform_conv2d"}),
    RegionContext: ({("torchvision::_roi_align_backward", "")}, {"roi_align"}),
}


def after_a_conv(block_cls) -> nn.Module:
    """``(B, 3, H, W) -> (B, 8, H, W)``: a conv, then the block (at index 1, so modules read ``1.<name>``)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), block_cls(8))


def module_name(finding_module: str) -> str:
    """``'1.pools.0 (AdaptiveMaxPool2d)' -> 'pools.0'``; ``'1 (MaxPyramid)' -> ''`` (the block itself)."""
    path = finding_module.split(" ")[0]
    return path.split(".", 1)[1] if "." in path else ""


def audit_with_twins(model: nn.Module):
    native = audit_model(model, imgsz=16)
    plan, twinned = twinned_audit(native, lambda scope: audit_model(model, imgsz=16, forward_scope=scope))
    return native, plan, twinned


def check_block(block_cls) -> None:
    findings, twins = EXPECTED[block_cls]
    native, plan, twinned = audit_with_twins(after_a_conv(block_cls))
    assert {(f.op, module_name(f.module)) for f in native.findings if "cuda" in f.devices} == findings
    assert twinned.clean, twinned.format()
    assert twinned.cuda_trace == "meta"  # CUDA predicted from CUDA's own branches
    if not findings:
        assert plan is None
        return
    assert set(plan.names) == twins
    assert {(f.op, module_name(f.module)) for f in plan.replaced} == findings


@pytest.mark.parametrize("block_cls", ZOO, ids=lambda b: b.__name__)
def test_block_is_flagged_natively_and_clean_with_twins(block_cls):
    """deform_conv2d and roi_align (alerts in torchvision's CUDA backward) included: never clean natively."""
    check_block(block_cls)


@pytest.mark.parametrize("block_cls", ZOO, ids=lambda b: b.__name__)
def test_block_keeps_the_map_shape_and_the_twins_keep_its_values(block_cls):
    """Routed through the twins, each block gives the native block's output and input gradient."""
    from utils.determinism.twins import TWINS, routing

    model = after_a_conv(block_cls).double()
    x = torch.rand((2, 3, 16, 12), generator=torch.Generator().manual_seed(1), dtype=torch.float64,
                   requires_grad=True)
    native = model(x)
    with routing(TWINS):
        routed = model(x)
    assert native.shape == (2, 8, 16, 12)
    torch.testing.assert_close(routed, native, rtol=1e-10, atol=1e-10)
    upstream = torch.randn(native.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(routed, x, upstream)[0], torch.autograd.grad(native, x, upstream)[0],
                               rtol=1e-9, atol=1e-9)


def test_the_zoo_model_yaml_places_every_block(tmp_path):
    from models.yolo import Model

    model = Model(write_zoo_model_yaml(tmp_path))
    assert [type(m).__name__ for m in model.model if type(m) in ZOO] == [b.__name__ for b in ZOO]


@pytest.mark.slow
def test_zoo_model_trains_under_strict_with_twins_and_a_rerun_repeats_its_checksum(shapes_data, tmp_path):
    from tests.support.training_runs import train_run

    cfg = write_zoo_model_yaml(tmp_path)
    runs = [train_run(tmp_path, shapes_data, cfg, name=name, deterministic="strict", epochs=1, noplots=True,
                      noval=True) for name in ("first", "rerun")]
    reports = [json.loads((run / "determinism.json").read_text()) for run in runs]
    expected_twins = {"adaptive_max_pool2d", "adaptive_avg_pool2d", "grid_sample", "interpolate", "deform_conv2d",
                      "roi_align"}
    for report in reports:
        assert report["audit"]["clean"] and report["relaxed_backward"] is False
        assert set(report["twins"]["twins"]) == expected_twins
        modules = {r["module"] for r in report["twins"]["replaced"]}
        assert {"model.3.max_pool (AdaptiveMaxPool2d)", "model.8 (SpatialTransformer)"} <= modules
        assert report["guarantee"].startswith("bit-identical")
    assert reports[0]["final_ema_sha256"] == reports[1]["final_ema_sha256"]
