"""Determinism policy on a real GPU (skipped without CUDA).

The bit-identity test trains a workload that is *not* bit-identical on a GPU without determinism
(its forward sums a thousand values into each slot with ``index_add_``, which CUDA does with
atomics in a varying order); a companion test shows that ``off`` really does vary, so the strict
test can fail. The other tests pin what the audit promises about ``nn.AdaptiveMaxPool2d``.
"""

import hashlib
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.support.nondeterministic_module import MaxPoolAttention
from utils.errors import UserError
from utils.determinism.op_audit import audit_model
from utils.rng_state import get_rng_state, set_rng_state
from utils.torch_utils import configure_determinism

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def export_cublas_workspace(monkeypatch):
    """The cuBLAS variable is exported before CUDA work (conftest restores the determinism flags)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class BinSum(nn.Module):
    """``(B, C, H, W) -> (4B, C)``: every pixel's features summed into one of ``4B`` bins by ``index_add``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(b * h * w, c)
        bins = torch.arange(b * h * w, device=x.device) % (4 * b)
        return x.new_zeros(4 * b, c).index_add(0, bins, rows)


def net(block: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), block, nn.Conv2d(8, 2, 1)).to(DEVICE)


def train_bin_sum(mode: str, steps: int = 5) -> str:
    """SHA-256 of the weights after ``steps`` SGD steps of a conv net whose forward ends in :class:`BinSum`."""
    configure_determinism(mode, seed=5)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 16, 3, padding=1),
                          BinSum()).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        images = torch.rand((4, 3, 64, 64), generator=generator).to(DEVICE)
        optimizer.zero_grad()
        model(images).sin().square().mean().backward()
        optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    return hashlib.sha256(weights.numpy().tobytes()).hexdigest()


def test_strict_training_is_bit_identical_on_gpu():
    assert train_bin_sum("strict") == train_bin_sum("strict")


def test_the_same_training_varies_without_determinism():
    """The workload above is sensitive: under ``off`` CUDA's atomic adds change the weights' last bits."""
    assert len({train_bin_sum("off") for _ in range(4)}) > 1


def test_adaptive_max_pool_crashes_under_strict():
    configure_determinism("strict")
    model = net(MaxPoolAttention(8))
    loss = model(torch.rand(2, 3, 32, 32, device=DEVICE)).sum()
    with pytest.raises(RuntimeError, match="adaptive_max_pool2d_backward_cuda"):
        loss.backward()


def test_scoped_cures_adaptive_max_pool_and_restores_flags():
    policy = configure_determinism("scoped")
    model = net(MaxPoolAttention(8))
    loss = model(torch.rand(2, 3, 32, 32, device=DEVICE)).sum()
    with policy.backward_scope():
        loss.backward()
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) \
        == (True, False)
    assert model[2].fc.weight.grad is not None


def test_audit_predicts_and_torch_confirms_on_cuda():
    model = net(MaxPoolAttention(8))
    report = audit_model(model, imgsz=32, device=DEVICE, batch_size=2)
    assert [(f.op, f.phase, f.module) for f in report.findings] == [
        ("adaptive_max_pool2d_backward", "backward", "2.pool (AdaptiveMaxPool2d)")]
    assert any(flag["op"].startswith("adaptive_max_pool2d_backward") for flag in report.torch_flagged)
    with pytest.raises(UserError, match=r"adaptive_max_pool2d_backward \(backward, 2.pool"):
        configure_determinism("strict").adopt_audit(report)
    scoped = configure_determinism("scoped")
    scoped.adopt_audit(report)
    assert scoped.relax_backward is True


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
