"""A non-finite step is never kept or saved: the guarded optimizer step, the checkpoint writer's refusal, and
the stop line's facts (where the value arose, what is on disk, the command that resumes)."""

import math

import pytest
import torch
import torch.nn as nn

from utils.ddp import DistInfo
from utils.torch_utils import ModelEMA, smart_optimizer
from utils.training.hooks import ProgressHook
from utils.training.nonfinite import GuardedStep, all_finite, describe_origins, loss_report, nonfinite_message
from utils.training.run_state import CheckpointSaver

ONE_PROCESS = DistInfo()


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))


def backward_once(model: nn.Module, scale: float = 1.0) -> None:
    torch.manual_seed(1)
    (model(torch.randn(2, 3, 8, 8)).square().mean() * scale).backward()


def snapshot(model: nn.Module, optimizer) -> tuple:
    weights = {k: v.detach().clone() for k, v in model.named_parameters()}  # BatchNorm's buffers: the loop's job
    state = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for p, s in optimizer.state.items()}
    return weights, state


def assert_unchanged(model: nn.Module, optimizer, before: tuple) -> None:
    weights, state = snapshot(model, optimizer)
    assert all(torch.equal(weights[k], before[0][k]) for k in weights), "the weights moved"
    assert state.keys() == before[1].keys(), "optimizer state was created or lost"
    for key, entries in state.items():
        assert all(torch.equal(v, before[1][key][k]) if torch.is_tensor(v) else v == before[1][key][k]
                   for k, v in entries.items()), "optimizer state moved"


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
@pytest.mark.parametrize("first_step", [True, False])
def test_a_non_finite_gradient_is_not_stepped(name, first_step):
    model = tiny_model()
    optimizer = smart_optimizer(model, name, lr=0.01, momentum=0.9, decay=5e-4)
    ema, scaler, step = ModelEMA(model), torch.amp.GradScaler("cuda", enabled=False), GuardedStep(optimizer)
    if not first_step:
        backward_once(model)
        assert step(model, scaler, ema, ONE_PROCESS) is None
    before, ema_before = snapshot(model, optimizer), {k: v.clone() for k, v in ema.ema.state_dict().items()}
    backward_once(model)
    model[0].weight.grad[0, 0, 0, 0] = math.inf
    problem = step(model, scaler, ema, ONE_PROCESS)
    assert problem.startswith("non-finite gradient (global norm inf")
    assert_unchanged(model, optimizer, before)
    assert all(torch.equal(v, ema_before[k]) for k, v in ema.ema.state_dict().items()), "the EMA moved"
    assert all(p.grad is None or not p.grad.any() for p in model.parameters()), "the bad gradient was kept"


def test_weights_that_overflow_after_a_finite_gradient_are_put_back():
    model = tiny_model()
    optimizer = smart_optimizer(model, "SGD", lr=1e38, momentum=0.9, decay=0.0)
    scaler, step = torch.amp.GradScaler("cuda", enabled=False), GuardedStep(optimizer)
    before = snapshot(model, optimizer)
    backward_once(model, scale=1e6)
    assert all_finite([p.grad for p in model.parameters()])
    assert step(model, scaler, None, ONE_PROCESS) == "non-finite weights after the optimizer step"
    assert_unchanged(model, optimizer, before)
    optimizer.param_groups[0]["lr"] = optimizer.param_groups[1]["lr"] = optimizer.param_groups[2]["lr"] = 0.01
    backward_once(model)
    assert step(model, scaler, None, ONE_PROCESS) is None and all_finite(list(model.parameters()))
    assert all("momentum_buffer" in optimizer.state[p] for p in model.parameters()), "a kept step keeps its state"


def test_a_non_finite_batch_norm_statistic_after_a_step_is_caught_too():
    model = tiny_model()
    optimizer, bn = smart_optimizer(model, "SGD", lr=0.01, momentum=0.9, decay=0.0), model[1]
    step = GuardedStep(optimizer, [bn.running_mean, bn.running_var, bn.num_batches_tracked])
    before = snapshot(model, optimizer)
    backward_once(model)
    bn.running_var[1] = math.inf  # the checkpoint saves it with the weights
    assert step(model, torch.amp.GradScaler("cuda", enabled=False), None, ONE_PROCESS) == \
        "non-finite weights after the optimizer step"
    assert_unchanged(model, optimizer, before)


def test_the_finite_check_finds_one_nan_among_huge_finite_values():
    huge = [torch.full((1000,), 3e38), torch.ones(3)]
    assert all_finite(huge), "a 2-norm would overflow to inf here"
    huge[1][2] = math.nan
    assert not all_finite(huge)


def test_the_checkpoint_writer_never_replaces_last_pt_with_non_finite_weights(tmp_path, log_lines):
    saver = CheckpointSaver(tmp_path / "last.pt", tmp_path / "best.pt", tmp_path)
    good = {"model_cfg": {}, "model": {"w": torch.ones(4)}, "ema": {"w": torch.ones(4)}, "next_position": [1, 0]}
    saver.save_epoch(good, 0, improved=True)
    written = (tmp_path / "last.pt").read_bytes(), (tmp_path / "best.pt").read_bytes()
    poisoned = {**good, "ema": {"w": torch.tensor([1.0, math.nan, 1.0, 1.0])}, "next_position": [1, 3]}
    assert not saver.save_last(poisoned, required=False)
    saver.save_epoch({**poisoned, "next_position": [2, 0]}, 1, improved=True)
    assert ((tmp_path / "last.pt").read_bytes(), (tmp_path / "best.pt").read_bytes()) == written
    assert saver.describe().endswith("last.pt after epoch 0 (resumable); best.pt from epoch 0 (stale: the best "
                                     "epoch 1 could not be saved).")
    assert any("its weights hold NaN or inf, so it was not written" in line for line in log_lines)


def test_a_non_finite_first_save_says_what_to_fix_not_to_free_space(tmp_path):
    saver = CheckpointSaver(tmp_path / "last.pt", tmp_path / "best.pt", tmp_path)
    poisoned = {"model_cfg": {}, "model": {"w": torch.full((2,), math.inf)}, "next_position": [1, 0]}
    with pytest.raises(Exception, match="nothing is saved; lower lr0 or fix the labels, then start again"):
        saver.save_last(poisoned)
    assert not (tmp_path / "last.pt").exists()


# ------------------------------------------------------------------------------------------- the stop line


def test_the_line_names_the_first_rank_and_micro_batch_and_their_own_terms():
    origins = [loss_report(1, torch.tensor([math.nan, 0.5, 0.25]), micro=3), loss_report(2, [1.0, math.inf, 0.0])]
    where = describe_origins(origins, world_size=4)
    assert where == " on rank 1 in micro-batch 3 (box nan, obj 0.5, cls 0.25), also on 1 other rank(s)"
    message = nonfinite_message("non-finite loss", where, 2, 5, amp=False, skipping=True)
    assert message.startswith("non-finite loss at epoch 2 batch 5 on rank 1 in micro-batch 3 (box nan")
    assert "skipped (--nan-policy skip)" in message and "fp16" not in message
    assert describe_origins([loss_report(0, [math.nan] * 3)], world_size=1) == " (box nan, obj nan, cls nan)"


def saver_holding(tmp_path, position) -> CheckpointSaver:
    (tmp_path / "last.pt").write_bytes(b"held")
    return CheckpointSaver(tmp_path / "last.pt", tmp_path / "best.pt", tmp_path, last_position=position)


@pytest.mark.parametrize("world_size, any_world_size, position, advice", [
    (1, False, (1, 3), "python train.py --resume {last}"),
    (2, False, (1, 3), "torchrun --nproc_per_node 2 train.py --resume {last}: 2 processes in all"),
    (2, True, (1, 3), "python train.py --resume {last}, or torchrun with any process count that --micro-batch"),
    (4, False, (2, 0), "python train.py --resume {last}, or torchrun with any process count that divides"),
])
def test_the_advised_resume_is_the_one_the_checkpoint_accepts(tmp_path, world_size, any_world_size, position,
                                                               advice):
    saver = saver_holding(tmp_path, position)
    assert saver.resume_advice(world_size, any_world_size).startswith(advice.format(last=tmp_path / "last.pt"))


def test_no_resume_is_advised_without_a_resumable_last_pt(tmp_path):
    assert CheckpointSaver(tmp_path / "last.pt", tmp_path / "best.pt", tmp_path).resume_advice(2) is None


def test_the_instances_column_says_whose_images_it_counts():
    assert ProgressHook(1).header[5] == "Instances"
    assert ProgressHook(1, world_size=2).header[5] == "Inst/rank0"
