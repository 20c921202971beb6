"""The CPU audit's CUDA prediction takes CUDA's branches, not meta's, and flags CUDA kernels that vary without an alert.

The meta device takes CUDA's side where torch branches on ``not input.is_cpu``, but not where it
branches on ``input.is_cuda`` (``F.pad(mode="replicate")``, ``F.max_pool3d(return_indices=True)``)
nor where aten hands a call to cuDNN (``grid_sample`` with ``align_corners=True``, ``ctc_loss``).
``adaptive_max_pool3d``'s CUDA backward accumulates with atomics when the sizes do not divide, and
cuDNN's grid sampler backward is documented as not reproducible; torch raises for neither.
"""

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.gpu_proof import ops as proof_ops
from utils.determinism.cuda_trace import (PYTHON_BRANCHES, CudaBranchTensor, as_cuda_branch, cuda_branch_trace,
                                          cudnn_ctc, cudnn_samples)
from utils.determinism.op_audit import AuditReport, Finding, audit_model
from utils.determinism.op_table import SILENT_OPS, match_nondeterministic
from utils.errors import UserError
from utils.torch_utils import configure_determinism, temporary_determinism


class Op(nn.Module):
    """A 1x1 convolution (so the backward reaches a parameter) followed by ``op``."""

    def __init__(self, op, channels: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 1)
        self.op = op

    def forward(self, x):
        return self.op(self.conv(x))


def cuda_findings(op, version: str = torch.__version__) -> list:
    """``(op, silent)`` of each CUDA finding of a CPU audit of ``Op(op)`` on an 8x8, 4-channel input."""
    report = audit_model(Op(op), imgsz=8, ch=4, torch_version=version)
    assert report.cuda_trace == "meta", report.cuda_trace
    return sorted((f.op, f.silent) for f in report.findings if "cuda" in f.devices)


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def traced_ops(op, version: str = torch.__version__, branches: bool = True, backward: bool = True) -> set:
    """The aten ops of a forward (and backward) of ``op`` on a meta input, with or without CUDA's branches."""
    x = torch.empty(2, 4, 8, 8, device="meta", requires_grad=True)
    with cuda_branch_trace(version), temporary_determinism(True), OpNames() as seen:
        y = op(as_cuda_branch(x) if branches else x).sum()
        if backward:
            y.backward()
    return seen.names


def volume(x):
    return x[:, :, None].repeat(1, 1, 4, 1, 1) * 1.0


def test_a_cuda_branch_tensor_answers_is_cuda_and_stays_one():
    x = as_cuda_branch(torch.empty(2, 3, device="meta"))
    y = (x * 2).sum(0)
    assert isinstance(y, CudaBranchTensor) and y.is_cuda and y.is_meta and not torch.empty(1, device="meta").is_cuda


def test_replicate_pad_takes_cuda_s_decomposition_whose_native_kernel_alerts():
    """On plain meta F.pad traces replication_pad2d_backward; on CUDA it decomposes (torch/nn/functional.py)."""
    assert "input.is_cuda" in inspect.getsource(F.pad), "torch dropped F.pad's CUDA branch: revisit cuda_trace.py"
    pad = lambda x: F.pad(x, (2, 2, 2, 2), mode="replicate")  # noqa: E731
    assert "replication_pad2d_backward" in traced_ops(pad, branches=False)
    assert "replication_pad2d_backward" not in traced_ops(pad)
    row = match_nondeterministic(torch.ops.aten.replication_pad2d_backward.default)
    assert row is not None and row.devices == ("cuda",) and not row.silent
    assert cuda_findings(pad) == []


@pytest.mark.parametrize("version, flagged", [("2.14.1", False), ("2.13.0", False), ("2.11.0", True),
                                              ("2.9.0", True)])
def test_max_pool3d_with_indices_decomposes_on_cuda_from_2_13(version, flagged):
    pool = lambda x: F.max_pool3d(volume(x), 2, return_indices=True)[0]  # noqa: E731
    assert cuda_findings(pool, version) == ([("max_pool3d_with_indices_backward", False)] if flagged else [])
    assert PYTHON_BRANCHES == {F.max_pool3d_with_indices: "2.13"}


@pytest.mark.parametrize("version", ["2.9.0", "2.14.1"])
def test_max_pool3d_without_indices_reaches_the_alerting_kernel_on_every_release(version):
    assert cuda_findings(lambda x: F.max_pool3d(volume(x), 2), version) == [("max_pool3d_with_indices_backward", False)]


def grid(x, align_corners):
    theta = torch.tensor([[0.9, 0.1, 0.0], [-0.1, 0.9, 0.0]], dtype=x.dtype, device=x.device)
    return F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=align_corners)


def test_grid_sample_with_align_corners_goes_to_cudnn_which_varies_without_an_alert():
    sample = lambda x: F.grid_sample(x, grid(x, True), align_corners=True)  # noqa: E731
    assert {"cudnn_grid_sampler", "cudnn_grid_sampler_backward"} <= traced_ops(sample)
    assert "grid_sampler_2d_backward" in traced_ops(sample, branches=False)
    assert cuda_findings(sample) == [("cudnn_grid_sampler_backward", True)]
    bicubic = lambda x: F.grid_sample(x, grid(x, True), mode="bicubic", align_corners=True)  # noqa: E731
    assert cuda_findings(bicubic) == [("grid_sampler_2d_backward", False)]
    assert cuda_findings(lambda x: F.grid_sample(x, grid(x, False), align_corners=False)) == [
        ("grid_sampler_2d_backward", False)]


def test_grid_sample_follows_cudnn_being_switched_off(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    assert cuda_findings(lambda x: F.grid_sample(x, grid(x, True), align_corners=True)) == [
        ("grid_sampler_2d_backward", False)]


def log_probs(x):
    return F.log_softmax(x.flatten(2).permute(2, 0, 1), 2)  # (T=64, N=2, C=4)


INT32_TARGETS = torch.tensor([1, 2, 3, 1, 2], dtype=torch.int32)


@pytest.mark.parametrize("targets, input_lengths, cudnn", [
    (INT32_TARGETS, [64, 64], True),
    (INT32_TARGETS.long(), [64, 64], False),  # int64 targets: aten's kernel
    (INT32_TARGETS, [64, 60], False),  # an input shorter than T
])
def test_ctc_loss_takes_cudnn_s_deterministic_path_when_cudnn_accepts_it(targets, input_lengths, cudnn):
    ctc = lambda x: F.ctc_loss(log_probs(x), targets, input_lengths, [3, 2])  # noqa: E731
    ops = traced_ops(ctc, backward=False)  # meta has no kernel for aten's CTC backward
    assert ("_cudnn_ctc_loss" in ops) is cudnn and ("_ctc_loss" in ops) is not cudnn
    assert "_ctc_loss" in traced_ops(ctc, branches=False, backward=False)
    if cudnn:
        assert cuda_findings(ctc) == []


def test_ctc_lengths_a_meta_trace_cannot_read_count_as_aten_s_kernel():
    lp = torch.empty(8, 2, 5, device="meta")
    lengths = torch.tensor([8, 8], dtype=torch.int32)
    assert cudnn_ctc(lp, INT32_TARGETS, lengths, torch.tensor([3, 2], dtype=torch.int32))
    assert not cudnn_ctc(lp, INT32_TARGETS, lengths.to("meta"), torch.tensor([3, 2], dtype=torch.int32))
    assert not cudnn_ctc(lp, INT32_TARGETS, [8, 8], [3, 300])  # cuDNN takes targets shorter than 256


@pytest.mark.parametrize("output, silent", [(3, True), (2, False), ((1, 3, 3), True)])
def test_adaptive_max_pool3d_backward_is_flagged_silent_when_the_sizes_do_not_divide(output, silent):
    """Input (4, 8, 8): 3 divides none of them, 2 all of them, (1, 3, 3) the depth only."""
    found = cuda_findings(lambda x: F.adaptive_max_pool3d(volume(x), output))
    assert found == ([("adaptive_max_pool3d_backward", True)] if silent else [])


def test_silent_rows_are_cuda_only_and_say_why():
    assert {name for row in SILENT_OPS for name in row.aten} == {"adaptive_max_pool3d_backward",
                                                                 "cudnn_grid_sampler_backward"}
    assert all(row.devices == ("cuda",) and row.silent and "silent: no alert" in row.reason for row in SILENT_OPS)


SILENT = Finding("adaptive_max_pool3d_backward", "backward", "model.3 (Pool3d)", ("cuda",), "why", silent=True)


def test_a_silent_finding_survives_the_report_s_round_trip_and_is_marked():
    report = AuditReport(device="cpu", imgsz=8, findings=[SILENT])
    again = AuditReport.from_dict(report.to_dict())
    assert again.findings == [SILENT] and not again.clean
    assert "cuda silent" in report.format()
    data = report.to_dict()
    del data["findings"][0]["silent"]
    with pytest.raises(KeyError):  # a cache file written before the field is recomputed, not half-read
        AuditReport.from_dict(data)


def test_strict_stops_on_a_silent_cuda_finding_and_scoped_reports_it_without_relaxing():
    on_cuda = AuditReport(device="cuda:0", imgsz=8, findings=[SILENT])
    with pytest.raises(UserError, match="adaptive_max_pool3d_backward"):
        configure_determinism("strict").adopt_audit(on_cuda)
    scoped = configure_determinism("scoped")
    summary = scoped.adopt_audit(on_cuda)
    assert scoped.relax_backward is False and scoped.nondeterministic_ops == {"adaptive_max_pool3d_backward": 1}
    assert "without torch raising" in summary and "adaptive_max_pool3d_backward" in summary
    on_cpu = configure_determinism("strict")
    assert "cuda only" in on_cpu.adopt_audit(AuditReport(device="cpu", imgsz=8, findings=[SILENT]))


def test_the_battery_names_silent_ops_and_does_not_count_them_as_raising():
    predicted, ops, where = proof_ops.predicted_failures(proof_ops.CASES["adaptive_max_pool3d output 3"], "cuda")
    assert (predicted, ops, where) == (False, ["adaptive_max_pool3d_backward (backward, silent)"], "meta")
    predicted, ops, _ = proof_ops.predicted_failures(proof_ops.CASES["ctc_loss native"], "cuda")
    assert predicted and ops == ["_ctc_loss_backward (backward)"]


def test_ctc_tensor_lengths_the_tensor_rule_refuses_fall_to_the_list_rule():
    """ATen's Tensor overload reads refused lengths into lists and asks the list rule: int64 lengths with
    int32 targets on the CPU, every input as long as log_probs, still run cuDNN's CTC."""
    lp = torch.empty(8, 2, 5, device="meta")
    int64 = torch.tensor([8, 8]), torch.tensor([3, 2])
    assert cudnn_ctc(lp, INT32_TARGETS, *int64)
    assert not cudnn_ctc(lp, INT32_TARGETS.to("meta"), *int64)  # the list rule wants the targets on the CPU
    assert not cudnn_ctc(lp, INT32_TARGETS, torch.tensor([8, 7]), int64[1])  # nor an input shorter than T


def test_unbatched_ctc_is_refused_by_the_tensor_rule_and_judged_by_the_list_rule():
    """The Tensor rule sees the 2-D input as it is and refuses it; the list rule sees it with its batch dimension."""
    lp = torch.empty(8, 5, device="meta")
    length, target_length = torch.tensor(8, dtype=torch.int32), torch.tensor(3, dtype=torch.int32)
    targets = INT32_TARGETS[:3]
    assert not cudnn_ctc(lp, targets.to("meta"), length, target_length)  # targets off the CPU: aten's kernel
    assert cudnn_ctc(lp, targets, length, target_length)
    assert not cudnn_ctc(lp, targets, torch.tensor(7, dtype=torch.int32), target_length)  # shorter than T


def test_cudnn_refuses_a_tensor_of_int32_max_elements_as_canuse32bitindexmath_does():
    """canUse32BitIndexMath accepts fewer than 2**31 - 1 elements, whose last offset is below it too."""
    grid = torch.empty(1, 1, 1, 2, device="meta")
    assert cudnn_samples(torch.empty(1, 1, 1, 2 ** 31 - 2, device="meta"), grid, align_corners=True)
    assert not cudnn_samples(torch.empty(1, 1, 1, 2 ** 31 - 1, device="meta"), grid, align_corners=True)
    strided = torch.empty(1, 1, 3, 2 ** 30, device="meta")[..., ::2]  # fewer elements, the last one far out
    assert strided.numel() < 2 ** 31 - 2 and not cudnn_samples(strided, grid, align_corners=True)
