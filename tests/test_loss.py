"""YOLOv5 loss (utils/loss.py) on a tiny two-level model at 64 px."""

import copy

import pytest
import torch

from models.yolo import Model
from tests.support.loss_inputs import HYP, TINY_CFG, sample_images, sample_targets
from utils.errors import UserError
from utils.loss import ComputeLoss, FocalLoss, objectness_balance, smooth_BCE


@pytest.fixture
def model(base_model):
    m = copy.deepcopy(base_model)
    m.train()
    return m


def test_loss_is_finite_with_documented_parts(model):
    loss, items = ComputeLoss(model, HYP)(model(sample_images()), sample_targets())
    assert loss.shape == (1,) and torch.isfinite(loss).all()
    assert items.shape == (3,) and not items.requires_grad
    assert (items > 0).all(), "box, obj and cls parts must all contribute"
    assert torch.allclose(loss, items.sum() * 2, rtol=1e-5), "total = (box + obj + cls) * batch size"
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_no_targets_gives_objectness_only(model):
    loss, items = ComputeLoss(model, HYP)(model(sample_images()), torch.zeros((0, 6)))
    assert items[0] == 0 and items[2] == 0 and items[1] > 0


def test_gains_scale_each_part(model):
    preds = model(sample_images())
    base = ComputeLoss(model, HYP)(preds, sample_targets())[1]
    scaled = ComputeLoss(model, dict(HYP, box=0.1, cls=1.5))(preds, sample_targets())[1]
    assert torch.allclose(scaled, base * torch.tensor([2.0, 1.0, 3.0]), rtol=1e-5)


def test_focal_loss_and_label_smoothing_change_parts(model):
    preds = model(sample_images())
    plain = ComputeLoss(model, HYP)(preds, sample_targets())[1]
    focal = ComputeLoss(model, dict(HYP, fl_gamma=1.5))(preds, sample_targets())[1]
    assert focal[0] == pytest.approx(plain[0].item(), rel=1e-5)
    assert focal[1] < plain[1] and focal[2] < plain[2]
    smoothed = ComputeLoss(model, dict(HYP, label_smoothing=0.2))(preds, sample_targets())[1]
    assert smoothed[2] != plain[2] and smoothed[1] == plain[1]
    assert smooth_BCE(0.2) == (0.9, 0.1)
    assert isinstance(FocalLoss(torch.nn.BCEWithLogitsLoss()).loss_fcn, torch.nn.BCEWithLogitsLoss)


def test_build_targets_centre_cell_neighbours_and_anchor_ratio(model):
    compute = ComputeLoss(model, HYP)
    preds = model(sample_images())
    # x = y = 0.3 of 64 px -> (2.4, 2.4) cells at stride 8: lower fractions pick the left and top neighbours
    target = torch.tensor([[0, 1, 0.3, 0.3, 10 / 64, 13 / 64]])  # exactly level 0's first anchor
    tcls, tbox, indices, anchors = compute.build_targets(preds, target)
    b, a, gj, gi = indices[0]
    cells = sorted(zip(a.tolist(), gj.tolist(), gi.tolist()))
    # anchors (10,13) ratio 1 and (16,30) ratio 2.3 match (< 4); (33,23) ratio 3.3 also matches
    assert cells == sorted((k, y, x) for k in (0, 1, 2) for (y, x) in ((2, 2), (2, 1), (1, 2)))
    assert tcls[0].tolist() == [1] * 9
    offsets = tbox[0][:, :2]
    assert offsets.min() >= -0.5 and offsets.max() <= 1.5
    assert torch.allclose(tbox[0][:, 2:], torch.tensor([10 / 8, 13 / 8]).expand(9, 2))
    # anchor_t=2 drops the two other level-0 anchors; every level-1 anchor is > 2x the box at stride 16
    strict = ComputeLoss(model, dict(HYP, anchor_t=2.0)).build_targets(preds, target)[2]
    assert sorted(set(strict[0][1].tolist())) == [0], "anchor_t=2 keeps only the matching anchor"
    assert len(strict[1][0]) == 0


def test_objectness_target_independent_of_target_order(model):
    preds = model(sample_images())
    # two boxes sharing cells and anchors: a repeated slot keeps the larger IoU either way round
    targets = torch.tensor([[0, 0, 0.30, 0.30, 0.20, 0.25], [0, 1, 0.31, 0.29, 0.18, 0.3]])
    compute = ComputeLoss(model, HYP)
    forward = compute(preds, targets)[1]
    backward = compute(preds, targets.flip(0))[1]
    assert torch.allclose(forward, backward, rtol=1e-6, atol=1e-8)


def test_loss_falls_when_overfitting_one_batch(model):
    torch.manual_seed(0)
    compute = ComputeLoss(model, HYP)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    images, targets = sample_images(), sample_targets()
    losses = []
    for _ in range(15):
        loss, _ = compute(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall enough: {losses[0]:.3f} -> {losses[-1]:.3f}"


def test_missing_hyperparameters_are_a_user_error(model):
    with pytest.raises(UserError, match="anchor_t"):
        ComputeLoss(model, {k: v for k, v in HYP.items() if k != "anchor_t"})
    with pytest.raises(UserError, match="hyperparameters"):
        ComputeLoss(model, None)


def test_loss_reads_its_hyperparameters_from_the_argument_not_the_model(model):
    preds = model(sample_images())
    expected = ComputeLoss(model, HYP)(preds, sample_targets())[1]
    model.hyp = dict(HYP, box=100.0)  # an attribute that older code set on the model is ignored
    assert torch.equal(ComputeLoss(model, HYP)(preds, sample_targets())[1], expected)


def test_objectness_balance_keeps_yolov5_weights_at_strides_8_16_32():
    assert objectness_balance([8, 16, 32]) == objectness_balance([8, 16, 32], by_stride=False) == [4.0, 1.0, 0.4]
    assert objectness_balance([4, 8, 16], by_stride=False) == [4.0, 1.0, 0.4]


def test_objectness_balance_gives_a_positive_the_same_pull_at_strides_4_8_16():
    # objectness is a mean over na * (imgsz / s) ** 2 slots per level: weight / slots must not depend on s
    imgsz, na = 256, 3
    pulls = [w / (na * (imgsz / s) ** 2) for w, s in zip(objectness_balance([4, 8, 16]), [4, 8, 16])]
    assert pulls == pytest.approx([pulls[0]] * 3)
    assert objectness_balance([4])[0] == 4 * objectness_balance([8])[0]


def test_loss_weights_a_stride_4_level_by_its_stride_not_its_position():
    cfg = copy.deepcopy(TINY_CFG)
    cfg["head"] = [[[2, 4], 1, "Detect", ["nc", "anchors"]]]
    model = Model(cfg)
    assert model.stride.tolist() == [4.0, 8.0]
    assert ComputeLoss(model, HYP).balance == [4.0, 1.0]  # a hyp without the key keeps YOLOv5's list
    assert ComputeLoss(model, dict(HYP, obj_balance_by_stride=1)).balance == [16.0, 4.0]
