"""NWD (utils.metrics.bbox_nwd) and its two uses in utils/loss.py: the blended box loss and tiny-target assignment."""

import copy
import math

import pytest
import torch

from tests.support.loss_inputs import HYP, sample_images, sample_targets
from utils.errors import UserError
from utils.loss import NWD_ASSIGN_THR, ComputeLoss
from utils.metrics import bbox_iou, bbox_nwd


# ---------------------------------------------------------------- bbox_nwd on hand-computed values

def test_identical_boxes_give_one():
    boxes = torch.tensor([[5.0, 5.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0], [100.0, 50.0, 20.0, 10.0]])
    assert torch.allclose(bbox_nwd(boxes, boxes, 2.0), torch.ones(3), atol=1e-5)


@pytest.mark.parametrize("shift, c", [((3.0, 4.0), 10.0), ((1.0, 0.0), 12.8), ((0.0, 2.0), 1.0)])
def test_shifted_box_gives_exp_of_minus_distance_over_c(shift, c):
    a = torch.tensor([[10.0, 10.0, 4.0, 4.0]])
    b = a + torch.tensor([[shift[0], shift[1], 0.0, 0.0]])
    expected = math.exp(-math.hypot(*shift) / c)
    assert bbox_nwd(a, b, c).item() == pytest.approx(expected, rel=1e-6)


def test_size_difference_counts_half():
    # same centre, w 2 -> 8 and h 2 -> 4: W2^2 = (36 + 4) / 4 = 10
    a, b = torch.tensor([0.0, 0.0, 2.0, 2.0]), torch.tensor([0.0, 0.0, 8.0, 4.0])
    assert bbox_nwd(a, b, 5.0).item() == pytest.approx(math.exp(-math.sqrt(10.0) / 5.0), rel=1e-6)


def test_nwd_is_symmetric_broadcasts_and_stays_informative_without_overlap():
    g = torch.Generator().manual_seed(0)
    a = torch.rand((6, 1, 4), generator=g) * 10 + 1
    b = torch.rand((1, 5, 4), generator=g) * 10 + 1
    ab, ba = bbox_nwd(a, b, 3.0), bbox_nwd(b, a, 3.0)
    assert ab.shape == (6, 5) and torch.equal(ab, ba.expand(6, 5))
    # two 2-px boxes 3 and 6 px apart: IoU is 0 for both, NWD still ranks the nearer one higher
    near, far = torch.tensor([[3.0, 0, 2, 2]]), torch.tensor([[6.0, 0, 2, 2]])
    origin = torch.tensor([[0.0, 0, 2, 2]])
    assert bbox_iou(origin, near).item() == 0 and bbox_iou(origin, far).item() == 0
    assert bbox_nwd(origin, near, 4.0).item() > bbox_nwd(origin, far, 4.0).item() > 0


def test_gradient_is_finite_even_for_identical_boxes_and_half_precision():
    pred = torch.tensor([[2.0, 2.0, 1.0, 1.0], [2.0, 2.0, 1.0, 1.5]], requires_grad=True)
    target = torch.tensor([[2.0, 2.0, 1.0, 1.0], [2.5, 2.0, 1.0, 1.0]])
    (1 - bbox_nwd(pred, target, 1.0)).sum().backward()
    assert torch.isfinite(pred.grad).all()
    assert pred.grad[1].abs().sum() > 0, "a differing box must get a gradient"
    half = pred.detach().half().requires_grad_()
    out = bbox_nwd(half, target.half(), 1.0)
    assert out.dtype == torch.float32, "computed in float32 so eps cannot underflow"
    out.sum().backward()
    assert torch.isfinite(half.grad).all()


# ---------------------------------------------------------------- the blended box loss

def _compute(base_model, **hyp):
    model = copy.deepcopy(base_model)
    model.train()
    return model, ComputeLoss(model, {**HYP, **hyp})


def _reference_box_losses(compute, preds, targets):
    """Per level, mean(1 - CIoU) and mean(1 - NWD) over the assigned predictions, written out from the formulas."""
    _, tbox, indices, anchors = compute.build_targets(preds, targets)
    ciou_terms, nwd_terms = [], []
    for i, pi in enumerate(preds):
        b, a, gj, gi = indices[i]
        p = pi[b, a, gj, gi]
        pbox = torch.cat((p[:, :2].sigmoid() * 2 - 0.5, (p[:, 2:4].sigmoid() * 2) ** 2 * anchors[i]), 1)
        ciou_terms.append((1.0 - bbox_iou(pbox, tbox[i], CIoU=True).squeeze(1)).mean())
        stride = compute.strides[i]
        w2 = ((pbox[:, :2] - tbox[i][:, :2]) ** 2).sum(1) + ((pbox[:, 2:] - tbox[i][:, 2:]) ** 2).sum(1) / 4
        nwd_terms.append((1.0 - torch.exp(-torch.sqrt(w2) * stride / compute.nwd_c)).mean())
    return ciou_terms, nwd_terms


def test_nwd_zero_is_bit_identical_to_the_ciou_loss(base_model):
    model, plain = _compute(base_model)  # an old hyp without the key
    _, zero = _compute(base_model, nwd=0.0, nwd_c=7.0)
    preds, targets = model(sample_images()), sample_targets()
    loss_plain, items_plain = plain(preds, targets)
    loss_zero, items_zero = zero(preds, targets)
    assert torch.equal(loss_plain, loss_zero) and torch.equal(items_plain, items_zero)
    ciou_terms, _ = _reference_box_losses(plain, preds, targets)
    expected = torch.zeros(1)
    for term in ciou_terms:
        expected += term
    assert torch.equal(items_plain[0:1], expected * HYP["box"]), "the box part is YOLOv5's mean(1 - CIoU) per level"


@pytest.mark.parametrize("weight", [0.5, 1.0])
def test_nwd_blends_into_the_box_loss_only(base_model, weight):
    model, compute = _compute(base_model, nwd=weight, nwd_c=6.0)
    _, plain = _compute(base_model)
    preds, targets = model(sample_images()), sample_targets()
    items = compute(preds, targets)[1]
    ciou_terms, nwd_terms = _reference_box_losses(compute, preds, targets)
    expected = sum((1 - weight) * c + weight * n for c, n in zip(ciou_terms, nwd_terms)) * HYP["box"]
    assert items[0].item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.equal(items[1:], plain(preds, targets)[1][1:]), "objectness and class parts do not change"
    assert items[0] != plain(preds, targets)[1][0]


def test_nwd_loss_has_finite_gradients(base_model):
    model, compute = _compute(base_model, nwd=1.0, nwd_c=4.0)
    loss, _ = compute(model(sample_images()), sample_targets())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("hyp", [dict(nwd=0.5), dict(nwd_assign=1), dict(nwd=0.5, nwd_c=0.0)])
def test_nwd_without_its_constant_is_a_user_error(base_model, hyp):
    with pytest.raises(UserError, match="nwd_c"):
        _compute(base_model, **hyp)


@pytest.mark.parametrize("hyp, key", [(dict(nwd=1.5, nwd_c=4.0), "nwd"), (dict(nwd_assign=2, nwd_c=4.0), "nwd_assign")])
def test_out_of_range_nwd_settings_are_a_user_error(base_model, hyp, key):
    with pytest.raises(UserError, match=key):
        _compute(base_model, **hyp)


# ---------------------------------------------------------------- NWD assignment of tiny targets

def _positives(compute, preds, target):
    """Sorted (level, anchor) pairs a single target is assigned to (any cell)."""
    _, _, indices, _ = compute.build_targets(preds, target)
    return sorted({(level, a) for level, (_, anchor, _, _) in enumerate(indices) for a in anchor.tolist()})


def _shape_nwd(w, h, aw, ah, c):
    return math.exp(-math.sqrt(((w - aw) ** 2 + (h - ah) ** 2) / 4) / c)


def test_tiny_target_without_any_ratio_match_gets_nwd_anchors(base_model):
    model, ratio_rule = _compute(base_model)
    c = 6.0
    _, by_nwd = _compute(base_model, nwd_assign=1, nwd_c=c)
    preds = model(sample_images())
    target = torch.tensor([[0, 1, 0.5, 0.5, 3 / 64, 3 / 64]])  # a 3 x 3 px box in the 64-px input
    assert _positives(ratio_rule, preds, target) == [], "every anchor is more than 4x the box: YOLOv5 drops it"
    # expected by hand: anchors in pixels (level anchors x stride), NWD of the shapes, >= threshold or the best
    anchors_px = {(lvl, k): (aw * s, ah * s) for lvl, s in enumerate(ratio_rule.strides)
                  for k, (aw, ah) in enumerate(ratio_rule.anchors[lvl].tolist())}
    nwd = {key: _shape_nwd(3, 3, aw, ah, c) for key, (aw, ah) in anchors_px.items()}
    expected = sorted({key for key, v in nwd.items() if v >= NWD_ASSIGN_THR} | {max(nwd, key=nwd.get)})
    assert _positives(by_nwd, preds, target) == expected
    assert len(expected) >= 1


def test_nwd_assignment_leaves_targets_that_are_not_tiny_alone(base_model):
    model, ratio_rule = _compute(base_model)
    _, by_nwd = _compute(base_model, nwd_assign=1, nwd_c=2.0)
    preds = model(sample_images())
    target = torch.tensor([[0, 1, 0.3, 0.3, 10 / 64, 13 / 64]])  # sqrt(130) = 11.4 px >= 8: not tiny
    plain, nwd = ratio_rule.build_targets(preds, target), by_nwd.build_targets(preds, target)
    for level in range(len(preds)):
        assert all(torch.equal(x, y) for x, y in zip(plain[2][level], nwd[2][level]))
        assert torch.equal(plain[1][level], nwd[1][level])


def test_nwd_assignment_is_independent_of_target_order(base_model):
    model, by_nwd = _compute(base_model, nwd_assign=1, nwd=0.5, nwd_c=5.0)
    preds = model(sample_images())
    targets = torch.tensor([[0, 0, 0.30, 0.30, 4 / 64, 5 / 64], [0, 1, 0.70, 0.60, 2 / 64, 3 / 64],
                            [1, 1, 0.50, 0.50, 20 / 64, 12 / 64]])
    forward = by_nwd(preds, targets)[1]
    backward = by_nwd(preds, targets.flip(0))[1]
    assert torch.allclose(forward, backward, rtol=1e-6, atol=1e-8)
