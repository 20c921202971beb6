"""AutoBatch: the line fit that picks the batch size, and the CPU fallback."""


import numpy as np
import pytest
import torch
from torch import nn

from utils.autobatch import PROFILE_BATCH_SIZES, check_train_batch_size, fit_batch_size


def linear_memory(slope, intercept, sizes=PROFILE_BATCH_SIZES):
    """Synthetic peak-memory measurements that follow a straight line exactly."""
    return [intercept + slope * b for b in sizes]


def test_fit_solves_the_line_for_the_budget():
    batch, line = fit_batch_size(PROFILE_BATCH_SIZES, linear_memory(0.25, 0.5), budget_gib=10.0)
    assert batch == 38  # (10 - 0.5) / 0.25 = 38
    np.testing.assert_allclose(line, [0.25, 0.5])
    batch, _ = fit_batch_size(PROFILE_BATCH_SIZES, linear_memory(0.25, 0.5), budget_gib=20.0)
    assert batch == 78


def test_fit_tolerates_noise_and_rounds_down():
    rng = np.random.default_rng(0)
    noisy = [m + rng.normal(0, 0.01) for m in linear_memory(0.3, 1.0)]
    batch, line = fit_batch_size(PROFILE_BATCH_SIZES, noisy, budget_gib=12.0)
    assert abs(batch - (12.0 - 1.0) / 0.3) <= 1.5
    assert np.polyval(line, batch) <= 12.0


def test_fit_never_reaches_a_size_that_ran_out_of_memory():
    memory = linear_memory(0.1, 0.5)[:3] + [None, None]  # 8 and 16 failed
    batch, _ = fit_batch_size(PROFILE_BATCH_SIZES, memory, budget_gib=100.0)
    assert batch == 4


def test_fit_falls_back_to_default_when_unusable():
    assert fit_batch_size(PROFILE_BATCH_SIZES, [1.0] + [None] * 4, budget_gib=10.0, default=7) == (7, None)
    assert fit_batch_size(PROFILE_BATCH_SIZES, [2.0] * 5, budget_gib=10.0, default=7) == (7, None)
    assert fit_batch_size(PROFILE_BATCH_SIZES, linear_memory(0.001, 0.1), budget_gib=80.0, default=7) == (7, None)
    assert fit_batch_size(PROFILE_BATCH_SIZES, linear_memory(1.0, 5.0), budget_gib=2.0, default=7) == (7, None)


def test_cpu_model_gets_default_with_message(log_lines):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert check_train_batch_size(model, imgsz=64, default=12) == 12
    assert any("CUDA" in m and "12" in m for m in log_lines)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="AutoBatch profiling needs CUDA")
def test_cuda_profiling_picks_a_batch_in_range():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.SiLU(), nn.Conv2d(16, 8, 1)).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = check_train_batch_size(model, imgsz=128, amp=True, fraction=0.01, default=3)
    assert 1 <= batch <= 1024
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # profiled a copy
