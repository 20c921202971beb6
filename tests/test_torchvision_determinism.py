"""The op audit sees torchvision's detection ops, and calls nothing it does not know clean.

torchvision's ``roi_align``, ``roi_pool``, ``ps_roi_align`` and ``ps_roi_pool`` raise in their CUDA
backward under determinism; ``deform_conv2d``'s CUDA backward accumulates with atomics (0.29 raises
for it, earlier releases did not); ``nms`` is deterministic. Any op of a namespace the table does not
know, such as a user's ``torch.library`` op, is "not verified": strict refuses, scoped warns and records.
"""

import ast
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torchvision
from torchvision.ops import DeformConv2d, nms, roi_align, roi_pool

from utils.determinism import op_table
from utils.determinism.op_audit import AuditReport, Finding, audit_model
from utils.determinism.op_table import TORCHVISION_CLEAN, TORCHVISION_OPS, known_op
from utils.errors import UserError
from utils.torch_utils import configure_determinism

TORCHVISION_DIR = Path(torchvision.__file__).parent


class Deformable(nn.Module):
    """A 3x3 deformable convolution whose offsets (and mask) a 3x3 convolution predicts."""

    def __init__(self, masked: bool):
        super().__init__()
        self.masked = masked
        self.offset = nn.Conv2d(4, 27 if masked else 18, 3, padding=1)
        self.deform = DeformConv2d(4, 4, 3, padding=1)

    def forward(self, x):
        if not self.masked:
            return self.deform(x, self.offset(x))
        offset, mask = self.offset(x).split((18, 9), 1)
        return self.deform(x, offset, mask.sigmoid())


class RoIHead(nn.Module):
    """A 1x1 convolution, then ``pool`` over two fixed boxes (a buffer, so it follows the model to meta)."""

    def __init__(self, pool):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.pool = pool
        self.register_buffer("boxes", torch.tensor([[0.0, 0, 0, 4, 4], [1, 2, 2, 7, 6]]))

    def forward(self, x):
        return self.pool(self.conv(x), self.boxes, 2)


class NmsGate(nn.Module):
    """Scales a convolution's output by how many of its fixed boxes NMS keeps."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], device=x.device)
        kept = nms(boxes, torch.tensor([0.5, 0.9, 0.1], device=x.device), 0.5)
        return self.conv(x) * kept.numel()


def cuda_findings(model: nn.Module) -> list:
    """``(op, phase, silent)`` of each CUDA finding of a CPU audit of ``model`` on an 8x8, 4-channel input."""
    report = audit_model(model, imgsz=8, ch=4)
    assert report.cuda_trace == "meta", report.cuda_trace
    assert report.unverified == []
    return sorted((f.op, f.phase, f.silent) for f in report.findings if "cuda" in f.devices)


@pytest.mark.parametrize("masked", [False, True])
def test_deform_conv2d_is_flagged_in_the_cuda_backward_never_clean(masked):
    assert cuda_findings(Deformable(masked)) == [("torchvision::_deform_conv2d_backward", "backward", False)]


def test_deform_conv2d_before_torchvision_0_29_is_flagged_silent(monkeypatch):
    """Before 0.29's Python alert, the CUDA backward accumulated with atomicAdd and raised nothing."""
    monkeypatch.setattr(op_table, "installed_torchvision", lambda: "0.28.0")
    assert cuda_findings(Deformable(False)) == [("torchvision::_deform_conv2d_backward", "backward", True)]


@pytest.mark.parametrize("pool, op", [(roi_align, "_roi_align_backward"), (roi_pool, "_roi_pool_backward")])
def test_roi_pooling_is_flagged_raising_in_the_cuda_backward(pool, op):
    assert cuda_findings(RoIHead(pool)) == [(f"torchvision::{op}", "backward", False)]


def test_nms_is_known_and_clean():
    report = audit_model(NmsGate(), imgsz=8, ch=4)
    assert report.clean and report.unverified == [] and report.findings == []


def test_torch_s_alert_for_a_torchvision_row_is_explained_by_the_row():
    """On a GPU, torch warns 'compute_grad_input does not have...': the row's own finding, not a second one."""
    finding = Finding("torchvision::_deform_conv2d_backward", "backward", "model.deform", ("cuda",), "row")
    flag = {"op": "compute_grad_input", "phase": "backward", "message": "compute_grad_input does not have ..."}
    report = AuditReport(device="cuda:0", imgsz=8, findings=[finding], torch_flagged=[flag])
    assert report.applicable() == [finding]


# ----------------------------------------------------------------------------- ops the table does not know

_library = torch.library.Library("ffca_test_user", "DEF")
_library.define("blur(Tensor x) -> Tensor")
_library.impl("blur", lambda x: (x + x.roll(1, -1)) / 2, "CompositeExplicitAutograd")
_library.impl("blur", lambda x: torch.empty_like(x), "Meta")
_library.define("sharpen(Tensor x) -> Tensor")  # no meta kernel
_library.impl("sharpen", lambda x: 2 * x - x.roll(1, -1), "CPU")


class UserBlur(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.ops.ffca_test_user.blur(self.conv(x).detach()) + self.conv(x)


def test_a_user_library_op_is_not_verified_and_never_clean():
    report = audit_model(UserBlur(), imgsz=8, ch=4)
    assert report.findings == [] and not report.clean
    assert {(u["op"], u["phase"]) for u in report.unverified} == {("ffca_test_user::blur", "forward")}
    assert "not verified: ffca_test_user::blur" in report.format() and "Result: not verified" in report.format()
    assert AuditReport.from_dict(report.to_dict()).unverified == report.unverified


def test_an_op_without_a_meta_kernel_is_named_where_the_cuda_prediction_falls_back():
    class UserSharpen(UserBlur):
        def forward(self, x):
            return torch.ops.ffca_test_user.sharpen(self.conv(x).detach()) + self.conv(x)

    report = audit_model(UserSharpen(), imgsz=8, ch=4)
    assert report.cuda_trace.startswith("cpu (meta has no kernel: ffca_test_user::sharpen")
    assert [u["op"] for u in report.unverified] == ["ffca_test_user::sharpen"] and not report.clean


def test_strict_refuses_an_unverified_op_and_scoped_warns_and_records_it(log_lines):
    report = AuditReport(device="cpu", imgsz=8, unverified=[{"op": "ffca_test_user::blur", "phase": "forward",
                                                             "module": "model.3 (UserBlur)"}])
    with pytest.raises(UserError, match=r"strict: 1 op\(s\) .* outside the determinism table.*ffca_test_user::blur"):
        configure_determinism("strict").adopt_audit(report)
    scoped = configure_determinism("scoped")
    summary = scoped.adopt_audit(report)
    assert "not verified" in summary and "ffca_test_user::blur" in summary and "clean" not in summary
    assert scoped.audit["unverified"] == report.unverified and scoped.audit["clean"] is False
    assert any("not verified" in line and "ffca_test_user::blur" in line for line in log_lines)


def test_known_ops_are_aten_prims_and_the_listed_torchvision_ops():
    assert known_op(torch.ops.aten.add.Tensor) and known_op(torch.ops.torchvision.nms.default)
    assert known_op(torch.ops.torchvision._roi_align_backward.default)
    assert not known_op(torch.ops.ffca_test_user.blur.default)
    assert not known_op(torch.ops.torchvision.qroi_align.default)  # a torchvision op without a row: not verified


# ----------------------------------------------------------------------------- the evidence, re-read


def installed_alerts() -> dict:
    """``{forward op: alert name}`` from the installed torchvision's Python autograd registrations."""
    source = (TORCHVISION_DIR / "_autograd_registrations.py").read_text()
    tree = ast.parse(source)
    alert_of = {}
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            if getattr(call.func, "attr", "") == "alert_not_deterministic":
                alert_of[function.name] = call.args[0].value
    alerts = {}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if getattr(call.func, "attr", "") == "register_autograd" and isinstance(call.args[1], ast.Name):
            backward = call.args[1].id
            if backward in alert_of:
                alerts[call.args[0].value.split("::")[1]] = alert_of[backward]
    return alerts


def table_alerts(version: str) -> dict:
    """``{forward op: alert name}`` of the raising torchvision rows that hold for ``version``."""
    return {row.doc_names[0].split(".")[-1]: row.alert for row in TORCHVISION_OPS
            if row.holds_for(version) and not row.silent}


def test_the_installed_torchvision_s_alerts_are_the_table_s():
    if not (TORCHVISION_DIR / "_autograd_registrations.py").is_file():
        pytest.skip(f"torchvision {torchvision.__version__} registers no Python backward: its alerts are in C++")
    assert op_table.release_name(torchvision.__version__) in op_table.VERIFIED_TORCHVISION, (
        f"the table was not checked against torchvision {torchvision.__version__}: re-read its alerts")
    assert installed_alerts() == table_alerts(torchvision.__version__)
    assert set(installed_alerts()) <= TORCHVISION_CLEAN  # every forward with a raising backward is known


def test_the_installed_library_holds_the_cuda_kernels_the_rows_describe():
    libraries = sorted(TORCHVISION_DIR.glob("_C*.so"))
    if not libraries:
        pytest.skip("this torchvision has no compiled _C library")
    data = libraries[0].read_bytes()
    if b"__cudaRegisterFatBinary" not in data:
        pytest.skip(f"{libraries[0].name} is a build without CUDA kernels: nothing to check the CUDA rows against")
    for row in TORCHVISION_OPS:
        assert row.aten[0].encode() in data, row.aten[0]  # the backward op the row matches is registered
    assert re.search(rb"deformable_col2im_kernel", data)  # the atomicAdd kernel of deform_conv2d's backward
    names = {row.alert for row in TORCHVISION_OPS if row.alert}
    assert all(name.encode() in data for name in names - {"compute_grad_input"})  # the kernels' own names
