"""Determinism policy on CPU: modes, the backward scope, temporary_determinism, the op audit, seeding.

``Tensor.put_(..., accumulate=False)`` throws under ``use_deterministic_algorithms(True)`` on every
device, so a module whose backward calls it reproduces on a CPU what
``adaptive_max_pool2d_backward_cuda`` does on a GPU server.
"""

import os
import random
import re
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.nondeterministic_module import PutGradient as PutBlock
from utils.errors import UserError
from utils.files import yaml_load
from utils.torch_utils import (EXEMPT_DOC_NAMES, MODES, NONDETERMINISTIC_OPS, AuditReport, Finding, audit_model,
                               configure_determinism, main, match_nondeterministic, temporary_determinism)

ROOT = Path(__file__).resolve().parents[1]


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


def documented_throwing_ops() -> set[str]:
    """Names in the installed torch's 'will throw a RuntimeError' list of use_deterministic_algorithms."""
    doc = torch.use_deterministic_algorithms.__doc__
    section = doc.split("nondeterministic operations will throw a")[1].split("In addition")[0]
    return set(re.findall(r"^\s*\* :(?:class|func|meth):`([^`]+)`", section, flags=re.M))


def test_op_table_matches_installed_torch_documentation():
    documented = documented_throwing_ops()
    assert len(documented) > 10, "could not parse torch.use_deterministic_algorithms.__doc__"
    in_table = {name for row in NONDETERMINISTIC_OPS for name in row.doc_names}
    assert not documented - in_table - set(EXEMPT_DOC_NAMES), "torch documents ops the table lacks"
    assert not (in_table | set(EXEMPT_DOC_NAMES)) - documented, "table lists ops torch no longer documents"


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


def test_audit_finds_ops_with_phase_and_innermost_module():
    report = audit_model(TinyNet(), imgsz=16)
    found = {(f.op, f.phase, f.module): f.devices for f in report.findings}
    assert found == {("adaptive_max_pool2d_backward", "backward", "block (MaxPoolFirst)"): ("cuda",),
                     ("put_", "backward", "block.inner (PutGradient)"): ("cpu", "cuda")}
    assert not report.clean
    assert [(f["op"], f["phase"]) for f in report.torch_flagged] == [("put_", "backward")]
    assert report.op_counts["forward"] > 0 and report.op_counts["backward"] > 0
    text = report.format()
    assert "block.inner (PutGradient)" in text and "adaptive_max_pool2d_backward" in text


def test_audit_reports_forward_ops():
    class Unpool(nn.Module):
        def forward(self, x):
            pooled, indices = F.max_pool2d(x, 2, return_indices=True)
            return F.max_unpool2d(pooled, indices, 2)

    model = nn.Sequential(nn.Conv2d(3, 2, 1), Unpool())
    report = audit_model(model, imgsz=8)
    assert [(f.op, f.phase, f.module) for f in report.findings] == [("max_unpool2d", "forward", "1 (Unpool)")]


def test_audit_leaves_model_grads_flags_and_rng_untouched():
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
    assert flags() == (False, False)


def test_audit_is_clean_for_a_deterministic_model():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Upsample(scale_factor=2),
                          nn.AdaptiveAvgPool2d(1))  # global average pooling decomposes into mean
    report = audit_model(model, imgsz=16, batch_size=2)
    assert report.clean and report.findings == []
    assert "Result: clean" in report.format()
    assert report.to_dict()["clean"] is True


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
    assert policy.state()["audit"]["findings"][0]["op"] == "adaptive_max_pool2d_backward"


def test_strict_adoption_stops_on_what_torch_flagged():
    policy = configure_determinism("strict")
    flagged = [{"op": "new_op_cuda", "phase": "backward", "message": "new_op_cuda does not have ..."}]
    with pytest.raises(UserError, match="new_op_cuda"):
        policy.adopt_audit(AuditReport(device="cuda:0", imgsz=64, torch_flagged=flagged))


def test_scoped_adoption_relaxes_only_for_backward_findings():
    policy = configure_determinism("scoped")
    summary = policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[PUT_FINDING, UNPOOL_FINDING]))
    assert policy.relax_backward is True
    assert "put_" in summary and "max_unpool2d" in summary and "cannot fix" in summary
    policy.adopt_audit(AuditReport(device="cpu", imgsz=64, findings=[UNPOOL_FINDING]))
    assert policy.relax_backward is False


# ----------------------------------------------------------------------------- YOLO models and the command


def small_model_dict(yaml_path: Path) -> dict:
    """The YAML with the smallest width/depth: same module types, a fraction of the cost."""
    cfg = yaml_load(yaml_path)
    cfg.update(depth_multiple=0.33, width_multiple=0.125)
    return cfg


@pytest.mark.parametrize("yaml_path", sorted((ROOT / "models").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_model_is_clean(yaml_path):
    from models.yolo import Model

    report = audit_model(Model(small_model_dict(yaml_path)), imgsz=64)
    assert report.clean, report.format()


def test_yolo_model_with_put_block_names_layer(tmp_path):
    from models.yolo import Model
    from tests.nondeterministic_module import write_put_model_yaml

    model = Model(write_put_model_yaml(tmp_path))
    report = audit_model(model, imgsz=64)
    assert [(f.op, f.phase, f.module) for f in report.findings] == [("put_", "backward", "model.2 (PutGradient)")]


@pytest.fixture
def maxpool_yaml(tmp_path) -> Path:
    from tests.nondeterministic_module import write_model_yaml

    return write_model_yaml(tmp_path, "MaxPoolAttention", nc=2, width=8)


def test_command_reports_adaptive_max_pool_with_module_path(maxpool_yaml, capsys):
    assert main(["--audit", "--cfg", str(maxpool_yaml), "--imgsz", "64"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"adaptive_max_pool2d_backward\s+backward\s+cuda\s+model\.2\.pool \(AdaptiveMaxPool2d\)", out)


def test_command_exits_zero_on_clean_model(tmp_path, capsys):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml_dump_small(ROOT / "models" / "yolov5n.yaml"))
    assert main(["--audit", "--cfg", str(cfg), "--imgsz", "64"]) == 0
    assert "Result: clean" in capsys.readouterr().out


def yaml_dump_small(yaml_path: Path) -> str:
    import yaml

    return yaml.safe_dump(small_model_dict(yaml_path))


@pytest.mark.parametrize("argv, needle", [
    (["--audit", "--cfg", "no/such/model.yaml"], "--cfg no/such/model.yaml: file not found"),
    (["--cfg", "models/yolov5n.yaml"], "--audit"),
    (["--audit"], "--cfg is required"),
    (["--audit", "--cfg", "models/yolov5n.yaml", "--imgsz", "0"], "--imgsz 0"),
    (["--audit", "--cfg", "models/yolov5n.yaml", "--imgsz", "abc"], "--imgsz"),
    (["--audit", "--cfg", "models/yolov5n.yaml", "--bogus"], "--bogus"),
])
def test_command_bad_arguments_exit_two_with_one_error_line(argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ERROR: ") and needle in err and "\n" not in err


def test_command_rejects_imgsz_not_multiple_of_stride(tmp_path, capsys):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml_dump_small(ROOT / "models" / "yolov5n.yaml"))
    assert main(["--audit", "--cfg", str(cfg), "--imgsz", "100"]) == 2
    assert "multiple of the model's largest stride" in capsys.readouterr().err


def test_audit_does_not_change_a_yolo_model(tmp_path):
    from models.yolo import Model

    model = Model(small_model_dict(ROOT / "models" / "ffca-yolo.yaml"))
    model.eval()
    before = deepcopy(model.state_dict())
    audit_model(model, imgsz=64)
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
