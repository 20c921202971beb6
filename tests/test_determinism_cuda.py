"""Determinism policy on a real GPU (skipped without CUDA).

The same checks as tests/test_determinism.py, plus the failure this project exists to fix:
``nn.AdaptiveMaxPool2d`` crashes the backward under strict determinism on CUDA, the audit predicts
it, and the scoped mode cures it while keeping the forward deterministic.
"""

import os
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.nondeterministic_module import MaxPoolAttention, PutGradient as PutBlock
from utils.errors import UserError
from utils.op_audit import audit_model
from utils.torch_utils import configure_determinism, get_rng_state, set_rng_state, temporary_determinism

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICE = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def export_cublas_workspace(monkeypatch):
    """The cuBLAS variable is exported before CUDA work (conftest restores the determinism flags)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def net(block: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), block, nn.Conv2d(8, 2, 1)).to(DEVICE)


def step(model: nn.Module, policy=None) -> None:
    loss = model(torch.rand(2, 3, 32, 32, device=DEVICE)).sum()
    with policy.backward_scope() if policy else temporary_determinism(*flags()):
        loss.backward()


def test_adaptive_max_pool_crashes_under_strict():
    configure_determinism("strict")
    with pytest.raises(RuntimeError, match="adaptive_max_pool2d_backward_cuda"):
        step(net(MaxPoolAttention(8)))


def test_scoped_cures_adaptive_max_pool_and_restores_flags():
    policy = configure_determinism("scoped")
    model = net(MaxPoolAttention(8))
    step(model, policy)
    assert flags() == (True, False)
    assert model[2].fc.weight.grad is not None


def test_audit_predicts_and_torch_confirms_on_cuda():
    model = net(MaxPoolAttention(8))
    report = audit_model(model, imgsz=32, device=DEVICE, batch_size=2)
    assert [(f.op, f.phase, f.module) for f in report.findings] == [
        ("adaptive_max_pool2d_backward", "backward", "2.pool (AdaptiveMaxPool2d)")]
    assert any(flag["op"].startswith("adaptive_max_pool2d_backward") for flag in report.torch_flagged)
    strict = configure_determinism("strict")
    with pytest.raises(UserError, match=r"adaptive_max_pool2d_backward \(backward, 2.pool"):
        strict.adopt_audit(report)
    scoped = configure_determinism("scoped")
    scoped.adopt_audit(report)
    assert scoped.relax_backward is True


def test_put_fails_under_strict_and_passes_scoped_and_warn():
    configure_determinism("strict")
    with pytest.raises(RuntimeError, match="put_"):
        step(net(PutBlock()))
    step(net(PutBlock()), configure_determinism("scoped"))
    policy = configure_determinism("warn")
    with pytest.warns(UserWarning, match="put_"):
        step(net(PutBlock()), policy)


def test_temporary_determinism_restores_after_exception_and_nesting():
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(KeyError), temporary_determinism(False):
        with temporary_determinism(True):
            assert flags() == (True, False)
        raise KeyError("inside")
    assert flags() == (True, True)


def test_strict_training_is_bit_identical_on_gpu():
    def train() -> torch.Tensor:
        configure_determinism("strict", seed=5)
        model = net(nn.Upsample(scale_factor=1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.rand(4, 3, 32, 32, device=DEVICE)).square().mean().backward()
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.equal(train(), train())


def test_seeding_and_rng_state_cover_cuda(tmp_path):
    configure_determinism("off", seed=9)
    first = (random.random(), np.random.rand(), torch.rand(2, device=DEVICE).tolist())
    configure_determinism("off", seed=9)
    assert (random.random(), np.random.rand(), torch.rand(2, device=DEVICE).tolist()) == first
    path = tmp_path / "rng.pt"
    state = get_rng_state()
    assert len(state["cuda"]) == torch.cuda.device_count()
    torch.save(state, path)
    expected = torch.rand(3, device=DEVICE).tolist()
    set_rng_state(torch.load(path, weights_only=True))
    assert torch.rand(3, device=DEVICE).tolist() == expected
