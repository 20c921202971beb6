"""Determinism policy on CPU: modes, the backward scope, temporary_determinism, the op audit, AutoBatch, seeding.

``Tensor.put_(..., accumulate=False)`` throws under ``use_deterministic_algorithms(True)`` on every
device, so a module whose backward calls it reproduces on a CPU what
``adaptive_max_pool2d_backward_cuda`` does on a GPU server.
"""

import inspect
import json
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from audit import main
from tests.support.nondeterministic_module import PutGradient as PutBlock
from benchmarks.gpu_proof.modules import PutGradientFunction
from tests.support.nondeterministic_module import write_model_yaml, write_put_model_yaml
from utils.autobatch import PROFILE_BATCH_SIZES, profile_memory
from utils.errors import UserError
from utils.files import yaml_load
from utils.determinism.op_audit import (PARALLEL_GRAIN, AuditReport, Finding, audit_model, crowded_targets,
                                        detection_loss)
from utils.determinism.op_table import (DOCUMENTED_OPS, NONDETERMINISTIC_OPS, SILENT_OPS, UNDOCUMENTED_OPS,
                                        VERIFIED_TORCH, documentation_mismatch, documented_names,
                                        match_nondeterministic, release, release_name, rows_for, verified)
from utils.torch_utils import MODES, configure_determinism, temporary_determinism

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HYP = yaml_load(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml")


@pytest.fixture(autouse=True)
def restore_determinism_state(monkeypatch):
    """The cuBLAS variable and the RNG streams back as they were (conftest restores the flags)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored by monkeypatch afterwards
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(rng[0])
    np.random.set_state(rng[1])
    torch.set_rng_state(rng[2])


def flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


class MaxPoolFirst(nn.Module):
    """Runs an adaptive max pool itself, then a PutBlock: tests attribution to outer vs inner module."""

    def __init__(self):
        super().__init__()
        self.inner = PutBlock()

    def forward(self, x):
        pooled = F.adaptive_max_pool2d(x, 4)
        return self.inner(pooled) * 2


class TinyNet(nn.Module):
    """Conv -> BN -> MaxPoolFirst -> conv; training output is a list like YOLO's Detect."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU())
        self.block = MaxPoolFirst()
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        y = self.head(self.block(self.stem(x)))
        return [y, y.mean(1)]


def run_step(model: nn.Module, policy=None) -> None:
    """One forward + backward, the backward inside the policy's scope when given."""
    loss = model(torch.rand(2, 3, 16, 16))[0].sum()
    with policy.backward_scope() if policy else temporary_determinism(*flags()):
        loss.backward()


# ----------------------------------------------------------------------------- modes


@pytest.mark.parametrize("mode, expected", [("off", (False, False)), ("warn", (True, True)),
                                            ("scoped", (True, False)), ("strict", (True, False))])
def test_modes_set_algorithm_and_cudnn_flags(mode, expected):
    policy = configure_determinism(mode, seed=1)
    assert flags() == expected
    assert torch.backends.cudnn.deterministic is (mode != "off")
    assert torch.backends.cudnn.benchmark is (mode == "off")
    state = policy.state()
    assert (state["mode"], state["seed"], state["warn_only"]) == (mode, 1, expected[1])
    assert state["relax_backward"] is (mode == "scoped")


def test_cublas_workspace_exported_only_when_deterministic():
    configure_determinism("off")
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    policy = configure_determinism("strict")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert policy.state()["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.parametrize("bad", ["on", "STRICTER", "", "1"])
def test_unknown_mode_is_user_error_listing_modes(bad):
    with pytest.raises(UserError, match="--deterministic") as info:
        configure_determinism(bad)
    assert all(mode in str(info.value) for mode in MODES)


@pytest.mark.parametrize("bad", [-1, 2 ** 32, 1.5, "7", True])
def test_bad_seed_is_user_error(bad):
    with pytest.raises(UserError, match="--seed"):
        configure_determinism("off", seed=bad)


def test_strict_raises_naming_the_op():
    configure_determinism("strict")
    with pytest.raises(RuntimeError, match="put_"):
        run_step(TinyNet())


def test_scoped_completes_backward_and_restores_flags_exactly():
    policy = configure_determinism("scoped")
    model = TinyNet()
    run_step(model, policy)
    assert flags() == (True, False)
    assert all(p.grad is not None for p in model.parameters())


def test_backward_scope_restores_flags_when_backward_raises():
    policy = configure_determinism("scoped")
    with pytest.raises(ValueError), policy.backward_scope():
        assert flags() == (False, False)
        raise ValueError("boom")
    assert flags() == (True, False)


@pytest.mark.parametrize("mode", ["off", "warn", "strict"])
def test_backward_scope_is_a_no_op_outside_scoped(mode):
    policy = configure_determinism(mode)
    before = flags()
    with policy.backward_scope():
        assert flags() == before


def test_scoped_after_clean_audit_keeps_full_determinism():
    policy = configure_determinism("scoped")
    summary = policy.adopt_audit(AuditReport(device="cpu", imgsz=64))
    assert policy.relax_backward is False and "clean" in summary
    with pytest.raises(RuntimeError, match="put_"):
        run_step(TinyNet(), policy)


def test_warn_completes_with_a_warning_naming_the_op():
    policy = configure_determinism("warn")
    with pytest.warns(UserWarning, match="put_"):
        run_step(TinyNet(), policy)
    assert flags() == (True, True)


def test_seeding_twice_gives_identical_streams():
    def draw():
        return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()

    configure_determinism("off", seed=123)
    first = draw()
    configure_determinism("strict", seed=123)
    assert draw() == first
    configure_determinism("off", seed=124)
    assert draw() != first


# ----------------------------------------------------------------------------- temporary_determinism


def test_temporary_determinism_restores_mode_and_warn_only_after_exception():
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(KeyError), temporary_determinism(False):
        assert flags() == (False, False)
        raise KeyError("inside")
    assert flags() == (True, True)


def test_temporary_determinism_nested_restores_each_level():
    torch.use_deterministic_algorithms(False)
    with temporary_determinism(True, warn_only=True):
        with temporary_determinism(True):
            with temporary_determinism(False):
                assert flags() == (False, False)
            assert flags() == (True, False)
        assert flags() == (True, True)
    assert flags() == (False, False)


# ----------------------------------------------------------------------------- the op table


def test_op_table_matches_installed_torch_documentation():
    """The rows for the installed release against its docstring, both ways (run on 2.9 and 2.11 by
    benchmarks/gpu_proof/torch_versions.sh)."""
    if not verified(torch.__version__):
        pytest.skip(f"the op table was checked against torch {', '.join(VERIFIED_TORCH)}, not "
                    f"{release_name(torch.__version__)}: add its rows and release to utils/determinism/op_table.py")
    assert len(documented_names(torch.use_deterministic_algorithms.__doc__)) > 10, "could not parse the docstring"
    missing, retired = documentation_mismatch(torch.use_deterministic_algorithms.__doc__, torch.__version__)
    assert not missing, f"torch documents ops the table lacks: {missing}"
    assert not retired, f"table lists ops torch no longer documents: {retired}"


def test_the_docstring_line_for_bilinear_is_stale_and_the_audit_says_it_runs_on_cuda():
    """Issue 37 finding 1: this test used to pin the docstring's bilinear entry as a CUDA failure.

    The docstring still lists bilinear and trilinear under interpolate, but since torch 2.5
    F.interpolate takes a decomposition for non-CPU input under determinism, whose backward is a
    deterministic index_put_; only its CPU branch reaches the alerting kernel. If torch drops the
    stale line, or the branch, this test says so.
    """
    doc = torch.use_deterministic_algorithms.__doc__
    modes = doc.split(":func:`torch.nn.functional.interpolate`")[1].split("* :class:")[0]
    assert "``bilinear``" in modes and "``trilinear``" in modes, "torch fixed its docstring: drop this exemption"
    assert "not input.is_cpu and torch.are_deterministic_algorithms_enabled()" in inspect.getsource(F.interpolate)

    class Upsample(nn.Module):
        def __init__(self, mode: str):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode=self.mode)

    bilinear = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1), Upsample("bilinear")), imgsz=8)
    assert bilinear.cuda_trace == "meta" and bilinear.clean
    bicubic = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1), Upsample("bicubic")), imgsz=8)
    assert [(f.op, f.devices) for f in bicubic.findings] == [("upsample_bicubic2d_backward", ("cuda",))]


def test_a_model_meta_cannot_run_is_predicted_from_the_cpu_trace_and_says_so():
    class Weighted(nn.Module):
        def forward(self, x):
            return x.mean(), torch.bincount(torch.arange(4) % 3, weights=x.detach().flatten()[:4])

    report = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1), Weighted()), imgsz=8)
    assert report.cuda_trace == "cpu (meta has no kernel: aten::bincount)"
    [finding] = report.findings
    assert finding.op == "bincount" and finding.devices == ("cuda",)
    assert "CUDA predicted from the CPU trace: meta has no kernel (aten::bincount)" in finding.reason
    assert "CUDA predicted from: cpu (meta has no kernel" in report.format()


@pytest.mark.parametrize("version, integer_histc", [("2.7.1", ("cuda",)), ("2.8.0", None), ("2.14.1", None)])
def test_rows_hold_for_their_torch_releases(version, integer_histc):
    row = match_nondeterministic(torch.ops.aten.histc.default, (torch.arange(3),), {}, version)
    assert (row.devices if row else None) == integer_histc
    kthvalue = match_nondeterministic(torch.ops.aten.kthvalue.default, (None, 1), {}, version)
    assert (kthvalue is not None) is (release(version) < (2, 10))
    assert all(row.versions == "every torch" or "torch" in row.versions for row in NONDETERMINISTIC_OPS)


def test_torch_s_own_alert_names_do_not_double_the_table_s_findings():
    """Issue 37 finding 8: the kernel names torch warns with did not prefix-match the table's aten ops."""
    findings = [Finding(op, "backward", "m", ("cuda",)) for op in
                ("_adaptive_avg_pool2d_backward", "histc", "bincount", "_upsample_bilinear2d_aa_backward")]
    flags = [{"op": op, "phase": "backward", "message": f"{op} does not have a deterministic implementation"}
             for op in ("adaptive_avg_pool2d_backward_cuda", "_histc_cuda", "_bincount_cuda",
                        "upsample_bilinear2d_aa_backward_out_cuda", "grid_sampler_2d_backward_cuda")]
    applicable = AuditReport(device="cuda:0", imgsz=8, findings=findings, torch_flagged=flags).applicable()
    assert [f.op for f in applicable] == [f.op for f in findings] + ["grid_sampler_2d_backward_cuda"]


def test_undocumented_rows_are_the_known_extras_with_their_kernel():
    """CUDA failures torch raises but does not document; if torch starts documenting them, move the rows."""
    extras = {name for row in UNDOCUMENTED_OPS for name in row.aten}
    # The replicate-pad and max_pool3d kernels alert, but torch documents the modules as deterministic on
    # CUDA: F.pad and F.max_pool3d(return_indices=True) decompose there (utils/determinism/cuda_trace.py).
    assert extras == {"_upsample_bilinear2d_aa_backward", "_upsample_bicubic2d_aa_backward",
                      "index_reduce", "index_reduce_", "replication_pad1d_backward", "replication_pad2d_backward",
                      "replication_pad3d_backward", "max_pool3d_with_indices_backward"}
    for version in VERIFIED_TORCH:
        rows = rows_for(version)
        assert not ({name for row in rows if row in UNDOCUMENTED_OPS for name in row.aten}
                    & {name for row in rows if row in DOCUMENTED_OPS for name in row.aten}), version
    assert all(row.kernel.startswith(("upsample_", "index_reduce", "replication_pad", "max_pool3d"))
               and row.devices == ("cuda",) for row in UNDOCUMENTED_OPS)
    doc = torch.use_deterministic_algorithms.__doc__
    assert "index_reduce" not in doc and "antialias" not in doc
    assert set(NONDETERMINISTIC_OPS) == set(DOCUMENTED_OPS) | set(UNDOCUMENTED_OPS) | set(SILENT_OPS)


def test_op_table_names_real_aten_ops():
    for row in NONDETERMINISTIC_OPS:
        for name in row.aten:
            assert hasattr(torch.ops.aten, name), f"{name} is not an aten op in this torch"


@pytest.mark.parametrize("op, args, kwargs, devices", [
    (torch.ops.aten.put_.default, (None, None, None), {}, ("cpu", "cuda")),
    (torch.ops.aten.put_.default, (None, None, None, True), {}, ("cuda",)),
    (torch.ops.aten.scatter_reduce.two, (None, 0, None, None, "prod"), {}, ("cuda",)),
    (torch.ops.aten.scatter_reduce.two, (None, 0, None, None, "sum"), {}, None),
    (torch.ops.aten.bincount.default, (None,), {"weights": torch.ones(1)}, ("cuda",)),
    (torch.ops.aten.bincount.default, (None,), {}, None),
    (torch.ops.aten.median.dim, (None, 0), {}, ("cuda",)),
    (torch.ops.aten.median.default, (None,), {}, None),
    (torch.ops.aten.adaptive_max_pool2d_backward.default, (None, None, None), {}, ("cuda",)),
    (torch.ops.aten.max_pool2d_with_indices_backward.default, (), {}, None),
    (torch.ops.aten.nll_loss2d_forward.default, (None, None, None, 1, -100), {}, ("cuda",)),  # mean
    (torch.ops.aten.nll_loss2d_forward.default, (None, None, None, 2, -100), {}, ("cuda",)),  # sum
    (torch.ops.aten.nll_loss2d_forward.default, (None, None, None, 0, -100), {}, None),  # none
    (torch.ops.aten.histc.default, (torch.rand(3),), {}, ("cuda",)),
    (torch.ops.aten.histc.default, (torch.arange(3),), {}, None),
    (torch.ops.aten.index_reduce.default, (None, 0, None, None, "amax"), {}, ("cuda",)),
    (torch.ops.aten._upsample_bicubic2d_aa_backward.default, (), {}, ("cuda",)),
])
def test_argument_dependent_rows(op, args, kwargs, devices):
    row = match_nondeterministic(op, args, kwargs)
    assert (row.devices if row else None) == devices


def test_documented_cpu_failures_really_throw_on_cpu():
    """Rows marked for CPU must fail under strict on this machine (guards the devices column)."""
    unpool_input, indices = F.max_pool2d(torch.rand(1, 1, 4, 4), 2, return_indices=True)
    with temporary_determinism(True):
        with pytest.raises(RuntimeError, match="put_"):
            torch.zeros(4).put_(torch.tensor([1]), torch.ones(1))
        with pytest.raises(RuntimeError, match="deterministic"):
            F.max_unpool2d(unpool_input, indices, 2)


# ----------------------------------------------------------------------------- the audit


def model_fingerprint(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def findings_of(report) -> set:
    return {(f.op, f.phase, f.module) for f in report.findings}


def test_audit_finds_ops_with_phase_and_innermost_module():
    report = audit_model(TinyNet(), imgsz=16)
    found = {(f.op, f.phase, f.module): f.devices for f in report.findings}
    assert found == {("adaptive_max_pool2d_backward", "backward", "block (MaxPoolFirst)"): ("cuda",),
                     ("put_", "backward", "block.inner (PutGradient)"): ("cpu", "cuda")}
    assert not report.clean
    assert [(f["op"], f["phase"]) for f in report.torch_flagged] == [("put_", "backward")]
    assert all(report.op_counts[phase] > 0 for phase in ("forward", "backward", "step"))
    text = report.format()
    assert "block.inner (PutGradient)" in text and "adaptive_max_pool2d_backward" in text


def test_audit_runs_on_meta_where_the_cpu_has_no_kernel():
    """The GPU proof's 'histc int' row audits on meta (no integer histc on a CPU); autocast must not stop it."""
    class Histograms(nn.Module):
        def forward(self, x):
            return x.mean(), torch.histc(x.detach(), bins=4, min=0, max=1), torch.histc(
                (x.detach() * 4).long(), bins=4, min=0, max=4)

    model = nn.Sequential(nn.Conv2d(3, 2, 1), Histograms()).to("meta")
    report = audit_model(model, imgsz=8, device="meta")
    assert report.device == "meta" and report.op_counts["forward"] > 0
    assert findings_of(report) == {("histc", "forward", "1 (Histograms)")}  # the float one only
    assert report.findings[0].devices == ("cuda",)


def test_audit_reports_forward_ops():
    class Unpool(nn.Module):
        def forward(self, x):
            pooled, indices = F.max_pool2d(x, 2, return_indices=True)
            return F.max_unpool2d(pooled, indices, 2)

    model = nn.Sequential(nn.Conv2d(3, 2, 1), Unpool())
    report = audit_model(model, imgsz=8)
    assert [(f.op, f.phase, f.module) for f in report.findings] == [("max_unpool2d", "forward", "1 (Unpool)")]


def test_audit_sees_antialiased_interpolate_backward():
    class Downsample(nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)

    report = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1), Downsample()), imgsz=8)
    assert findings_of(report) == {("_upsample_bilinear2d_aa_backward", "backward", "1 (Downsample)")}
    assert "upsample_bilinear2d_aa_backward_out_cuda" in report.findings[0].reason


def nll_loss_factory(reduction: str):
    """A loss factory: per-pixel NLL of the model's (B, C, H, W) output against class 0."""
    def factory(model, images):
        target = torch.zeros(images.shape[0], images.shape[2], images.shape[3], dtype=torch.long)
        return lambda output: F.nll_loss(F.log_softmax(output, 1), target, reduction=reduction).sum()
    return factory


def test_loss_ops_are_attributed_to_the_loss_and_nll_none_is_clean():
    model = nn.Sequential(nn.Conv2d(3, 3, 1))
    reduced = audit_model(model, imgsz=8, loss_factory=nll_loss_factory("mean"))
    assert findings_of(reduced) == {("nll_loss2d_forward", "forward", "loss")}
    assert audit_model(model, imgsz=8, loss_factory=nll_loss_factory("none")).clean


def test_loss_backward_ops_are_attributed_to_the_loss():
    def factory(model, images):
        return lambda output: PutGradientFunction.apply(output).sum()

    report = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1)), imgsz=8, loss_factory=factory)
    assert findings_of(report) == {("put_", "backward", "loss")}


def put_op():
    torch.zeros(4).put_(torch.tensor([1]), torch.ones(1))


def test_optimizer_and_ema_ops_are_attributed_and_cannot_be_relaxed(monkeypatch):
    import utils.determinism.op_audit as op_audit

    real_update = op_audit.ModelEMA.update
    monkeypatch.setattr(op_audit.ModelEMA, "update", lambda self, model: (put_op(), real_update(self, model)))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda parameters, max_norm: put_op())
    report = audit_model(nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2)), imgsz=8)
    assert findings_of(report) == {("put_", "step", "optimizer"), ("put_", "step", "ema")}
    with pytest.raises(UserError, match=r"scoped.*optimizer.*ema") as stopped:
        configure_determinism("scoped").adopt_audit(report)
    assert "--deterministic warn" in str(stopped.value)
    with pytest.raises(UserError, match="optimizer"):
        configure_determinism("strict").adopt_audit(report)


@pytest.mark.parametrize("start_flags", [(False, False), (True, True)])
def test_audit_leaves_model_grads_flags_and_rng_untouched(start_flags):
    # The process may already run under a mode (train.run applies one for the whole process), so the
    # audit must restore whatever it found, not a fixed state.
    with temporary_determinism(*start_flags):
        check_audit_restores_state()
        assert flags() == start_flags


def check_audit_restores_state():
    model = TinyNet()
    model.stem[1].eval()  # a mixed train/eval state must come back as it was
    model.head.weight.grad = torch.full_like(model.head.weight, 0.5)
    before = model_fingerprint(model)
    torch.manual_seed(7)
    expected_next = torch.rand(3)
    torch.manual_seed(7)
    audit_model(model, imgsz=16, batch_size=2)
    assert torch.equal(torch.rand(3), expected_next)
    after = model_fingerprint(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(model.head.weight.grad, torch.full_like(model.head.weight, 0.5))
    assert model.stem[0].weight.grad is None
    assert model.training and not model.stem[1].training


def test_audit_is_clean_for_a_deterministic_model():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Upsample(scale_factor=2),
                          nn.AdaptiveAvgPool2d(1))  # global average pooling decomposes into mean
    report = audit_model(model, imgsz=16, batch_size=2)
    assert report.clean and report.findings == []
    assert "Result: clean" in report.format()
    assert report.to_dict()["clean"] is True


def test_audit_batch_must_be_at_least_two():
    with pytest.raises(ValueError, match="at least 2"):
        audit_model(TinyNet(), imgsz=16, batch_size=1)


def test_crowded_targets_fill_every_level_past_the_parallel_grain():
    detect = nn.Module()
    detect.nl, detect.na, detect.nc, detect.no = 3, 3, 1, 6
    detect.stride = torch.tensor([4.0, 8.0, 16.0])
    detect.anchors = torch.tensor([[1.5, 2.0], [2.0, 3.0], [3.5, 2.5]]).repeat(3, 1, 1)
    targets = crowded_targets(detect, batch_size=3, imgsz=64, generator=torch.Generator().manual_seed(0))
    assert targets.shape[1] == 6 and len(targets) * detect.no / detect.nl >= PARALLEL_GRAIN
    assert set(targets[:, 0].long().tolist()) == {0, 1, 2} and set(targets[:, 1].tolist()) == {0.0}
    xy, wh = targets[:, 2:4], targets[:, 4:6]
    assert (wh > 0).all() and (xy - wh / 2 >= 0).all() and (xy + wh / 2 <= 1 + 1e-6).all()
    pixel_sizes = (detect.anchors * detect.stride.view(-1, 1, 1)).reshape(-1, 2)
    ratio = wh[:9] * 64 / pixel_sizes  # the first boxes cycle through every anchor of every level
    assert ((ratio >= 0.8 - 1e-6) & (ratio <= 1.25 + 1e-6)).all()


def test_detection_loss_needs_hyperparameters():  # the loss's gains are passed in, never read off the model
    from models.yolo import Model

    model = Model(ROOT / "tests" / "models" / "tiny.yaml")
    with pytest.raises(UserError, match="hyp"):
        audit_model(model, imgsz=32, loss_factory=detection_loss(None))


class IndexPutSizes(TorchDispatchMode):
    """A dispatch mode recording the element count of every accumulating ``index_put``."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in ("index_put", "index_put_", "_index_put_impl_"):
            if (args[3] if len(args) > 3 else kwargs.get("accumulate", False)):
                self.sizes.append(args[2].numel())
        return func(*args, **kwargs)


@pytest.mark.slow
def test_whole_step_audit_of_a_yolo_model(tiny_cfg):
    """The loss runs on crowded targets (the parallel index_put_ path), the model is left untouched."""
    from models.yolo import Model

    model = Model(tiny_cfg)
    model.eval()
    before = model_fingerprint(model)
    with IndexPutSizes() as sizes:
        report = audit_model(model, imgsz=32, loss_factory=detection_loss(DEFAULT_HYP))
    assert report.clean, report.format()
    assert max(sizes.sizes) >= PARALLEL_GRAIN
    assert not hasattr(model, "hyp") and not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------- adopting an audit

PUT_FINDING = Finding("put_", "backward", "model.2 (PutGradient)", ("cpu", "cuda"), "torch.Tensor.put_")
POOL_FINDING = Finding("adaptive_max_pool2d_backward", "backward", "model.24 (SCAM)", ("cuda",), "")
UNPOOL_FINDING = Finding("max_unpool2d", "forward", "model.5 (Unpool)", ("cpu", "cuda"), "")


def test_strict_adoption_stops_with_ways_out():
    policy = configure_determinism("strict")
    with pytest.raises(UserError) as info:
        policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[PUT_FINDING]))
    message = str(info.value)
    for part in ("put_", "backward", "model.2 (PutGradient)", "--deterministic scoped", "warn",
                 "replace the module", "docs/determinism.md"):
        assert part in message
    assert "\n" not in message


def test_strict_adoption_ignores_ops_that_fail_only_on_other_devices():
    policy = configure_determinism("strict")
    summary = policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[POOL_FINDING]))
    assert "cuda" in summary and "model.24 (SCAM)" in summary
    assert policy.audit["findings"][0]["op"] == "adaptive_max_pool2d_backward"


def test_strict_adoption_stops_on_what_torch_flagged():
    policy = configure_determinism("strict")
    flagged = [{"op": "new_op_cuda", "phase": "backward", "message": "new_op_cuda does not have ..."}]
    with pytest.raises(UserError, match="new_op_cuda"):
        policy.adopt_audit(AuditReport(device="cuda:0", imgsz=64, torch_flagged=flagged))


def test_scoped_adoption_relaxes_only_for_backward_findings():
    policy = configure_determinism("scoped")
    summary = policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[PUT_FINDING]))
    assert policy.relax_backward is True and "backward relaxed because of put_" in summary
    policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[]))
    assert policy.relax_backward is False


@pytest.mark.parametrize("findings", [[UNPOOL_FINDING], [PUT_FINDING, UNPOOL_FINDING]])
def test_scoped_stops_at_start_up_on_a_forward_finding(findings):
    """Issue 23 finding 10: scoped used to log it and let torch raise at batch 1 with a traceback."""
    policy = configure_determinism("scoped")
    with pytest.raises(UserError) as stop:
        policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=findings))
    message = str(stop.value)
    assert message.startswith("--deterministic scoped: 1 op(s) outside the backward pass") and "\n" not in message
    assert "max_unpool2d" in message and "put_" not in message and "--deterministic warn" in message


def test_warn_reports_a_forward_finding_and_goes_on():
    policy = configure_determinism("warn")
    summary = policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[UNPOOL_FINDING]))
    assert "max_unpool2d" in summary and "cannot fix" in summary and policy.relax_backward is False


def test_guarantee_names_the_relaxed_or_warned_ops_with_counts():
    from utils.determinism.reproducibility import run_guarantee

    second_put = Finding("put_", "backward", "model.7 (PutGradient)", ("cpu", "cuda"), "torch.Tensor.put_")
    findings = [PUT_FINDING, second_put, UNPOOL_FINDING]
    scoped = configure_determinism("scoped")
    scoped.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=findings[:2]))  # a forward one stops scoped
    assert scoped.nondeterministic_ops == {"put_": 2}
    assert run_guarantee(scoped) == "may differ in the last bits because the backward ran relaxed for: put_ x2"
    warn = configure_determinism("warn")
    warn.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=findings))
    assert warn.nondeterministic_ops == {"max_unpool2d": 1, "put_": 2}
    assert "warned" in run_guarantee(warn) and "max_unpool2d x1" in run_guarantee(warn)
    clean = configure_determinism("scoped")
    clean.adopt_audit(AuditReport(device="cpu", imgsz=64))
    assert clean.nondeterministic_ops == {} and run_guarantee(clean).startswith("bit-identical on this stack")
    assert run_guarantee(configure_determinism("off")).startswith("may differ")


def test_determinism_report_holds_the_audit_and_relaxed_ops_once():
    from types import SimpleNamespace

    from utils.ddp import DistInfo
    from utils.determinism.reproducibility import determinism_report

    policy = configure_determinism("scoped")
    audit = AuditReport(device="cpu", imgsz=64, findings=[PUT_FINDING])
    policy.adopt_audit(audit)
    report = determinism_report(policy=policy, audit=audit.to_dict(), opt=SimpleNamespace(seed=0, workers=0),
                                dist=DistInfo(), dataset=SimpleNamespace(im_files=[], label_files=[]),
                                device=torch.device("cpu"))
    assert report["audit"]["findings"][0]["op"] == "put_" and report["nondeterministic_ops"] == {"put_": 1}
    assert report["policy_state"]["mode"] == "scoped" and report["policy_state"]["relax_backward"] is True
    text = json.dumps(report, default=str)
    assert text.count('"findings"') == 1 and text.count('"nondeterministic_ops"') == 1

# ----------------------------------------------------------------------------- AutoBatch under the policy


def test_autobatch_trial_backward_runs_in_the_policy_scope(tmp_path):
    """AutoBatch's trial steps relax exactly what training relaxes; under strict they hit torch's error."""
    from models.yolo import Model

    model = Model(write_put_model_yaml(tmp_path))
    policy = configure_determinism("scoped")
    policy.adopt_audit(audit_model(model, imgsz=32))
    assert policy.relax_backward is True and flags() == (True, False)
    devices = []

    def measure(step, device):
        step()
        devices.append(device.type)
        return float(len(devices))

    assert profile_memory(model, 32, False, policy, measure) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert devices == ["cpu"] * len(PROFILE_BATCH_SIZES) and flags() == (True, False)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(RuntimeError, match="put_"):
        profile_memory(model, 32, False, configure_determinism("strict"), measure)


@pytest.mark.slow
def test_train_batch_size_minus_one_under_scoped_with_a_relaxed_model(tmp_path, shapes_data, monkeypatch):
    """train.py runs the audit first, then AutoBatch with the audited policy (profiled here on CPU)."""
    import train

    seen = {}

    def cpu_autobatch(model, imgsz, amp, policy=None):
        seen["relax"] = policy.relax_backward and policy.audit is not None and torch.are_deterministic_algorithms_enabled()
        profile_memory(model, imgsz, amp, policy, lambda step, device: (step(), 1.0)[1])
        return 4

    monkeypatch.setattr(train, "check_train_batch_size", cpu_autobatch)
    train.run(cfg=str(write_put_model_yaml(tmp_path)), data=str(shapes_data), imgsz=64, batch_size=-1, epochs=1,
              workers=0, device="cpu", deterministic="scoped", project=str(tmp_path), name="exp", exist_ok=True,
              noplots=True)
    assert seen == {"relax": True}
    last = torch.load(tmp_path / "exp" / "weights" / "last.pt", weights_only=True)
    assert last["opt"]["batch_size"] == 4  # recorded for a resume


# ----------------------------------------------------------------------------- YOLO models and the command


def small_model_dict(yaml_path: Path) -> dict:
    """The YAML with the smallest width/depth: same module types, a fraction of the cost."""
    cfg = yaml_load(yaml_path)
    cfg.update(depth_multiple=0.33, width_multiple=0.125)
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("yaml_path", sorted((ROOT / "models").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_model_is_clean(yaml_path):
    from models.yolo import Model

    report = audit_model(Model(small_model_dict(yaml_path)), imgsz=64, loss_factory=detection_loss(DEFAULT_HYP))
    assert report.clean, report.format()


def test_yolo_model_with_put_block_names_layer(tmp_path):
    from models.yolo import Model

    report = audit_model(Model(write_put_model_yaml(tmp_path)), imgsz=32)
    assert findings_of(report) == {("put_", "backward", "model.2 (PutGradient)")}


@pytest.fixture
def maxpool_yaml(tmp_path) -> Path:
    return write_model_yaml(tmp_path, "MaxPoolAttention", nc=2, width=8)


def test_command_reports_adaptive_max_pool_with_module_path(maxpool_yaml, capsys):
    assert main(["--cfg", str(maxpool_yaml), "--imgsz", "32"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"adaptive_max_pool2d_backward\s+backward\s+cuda\s+model\.2\.pool \(AdaptiveMaxPool2d\)", out)


class SqueezeExcite(nn.Module):
    """SE block from YOLO Convs: BatchNorm on a 1x1 map, which batch 1 cannot train."""

    def __init__(self, c1: int):
        super().__init__()
        from models.common import Conv

        self.squeeze = Conv(c1, max(c1 // 2, 1), 1)
        self.excite = Conv(max(c1 // 2, 1), c1, 1, act=False)

    def forward(self, x):
        return x * torch.sigmoid(self.excite(self.squeeze(x.mean((2, 3), keepdim=True))))


class FailsInTraining(nn.Module):
    """Identity in eval mode (the stride probe), an error in training mode."""

    def __init__(self, c1: int):
        super().__init__()

    def forward(self, x):
        if self.training:
            raise RuntimeError("kernel exploded\nsecond line of detail")
        return x


@pytest.fixture
def registered_blocks():
    from models.yolo import register_module

    for block in (SqueezeExcite, FailsInTraining):
        register_module(block, style="same", override=True)


def test_command_audits_batchnorm_on_a_1x1_map(tmp_path, capsys, registered_blocks):
    cfg = write_model_yaml(tmp_path, "SqueezeExcite", nc=2, width=8)
    assert main(["--cfg", str(cfg), "--imgsz", "32"]) == 0
    assert "Result: clean" in capsys.readouterr().out


def test_command_exits_three_when_the_audit_cannot_run(tmp_path, capsys, registered_blocks):
    cfg = write_model_yaml(tmp_path, "FailsInTraining", nc=2, width=8)
    assert main(["--cfg", str(cfg), "--imgsz", "32"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == "ERROR: the determinism audit could not run: RuntimeError: kernel exploded"


def yaml_dump_small(yaml_path: Path) -> str:
    import yaml

    return yaml.safe_dump(small_model_dict(yaml_path))


@pytest.mark.parametrize("argv, needle", [
    (["--cfg", "no/such/model.yaml"], "--cfg no/such/model.yaml: file not found"),
    (["--audit"], "--cfg is required"),
    (["--cfg", "models/yolov5n.yaml", "--imgsz", "0"], "--imgsz 0"),
    (["--cfg", "models/yolov5n.yaml", "--imgsz", "abc"], "--imgsz"),
    (["--cfg", "models/yolov5n.yaml", "--batch-size", "1"], "--batch-size 1: must be at least 2"),
    (["--cfg", "models/yolov5n.yaml", "--bogus"], "--bogus"),
])
def test_command_bad_arguments_exit_two_with_one_error_line(argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR: ") and needle in err and "\n" not in err


def test_command_rejects_imgsz_not_multiple_of_stride(tmp_path, capsys):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml_dump_small(ROOT / "models" / "yolov5n.yaml"))
    assert main(["--cfg", str(cfg), "--imgsz", "100"]) == 2
    assert "multiple of the model's largest stride" in capsys.readouterr().err


@pytest.mark.slow
def test_audit_command_as_a_program(tiny_cfg):
    import subprocess
    import sys

    command = ["audit.py"]
    result = subprocess.run([sys.executable, *command, "--cfg", str(tiny_cfg), "--imgsz", "32"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "training step (batch 2, 32x32)" in result.stdout and "Result: clean" in result.stdout
    bad = subprocess.run([sys.executable, *command, "--cfg", str(tiny_cfg), "--imgsz", "30"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("ERROR: --imgsz 30") and "Traceback" not in bad.stderr
