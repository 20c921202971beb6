"""Augmentation for tiny objects: the min_box_px survival threshold and copy_paste_small (box-level copy-paste)."""

import numpy as np
import pytest
import torch
import yaml

from tests.conftest import ROOT
from utils.augmentations import (PASTE_FEATHER_PX, PASTE_SMALL_PX, _warp_targets, box_candidates, mosaic,
                                 paste_small_objects, random_perspective)
from utils.dataloaders import LoadImagesAndLabels
from utils.dataset.synthetic.shapes import make_shapes
from utils.errors import UserError

SCRATCH_LOW = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())


# ---------------------------------------------------------------- min_box_px

def test_box_candidates_threshold_is_the_min_box_px():
    before = np.array([[0, 0, 4, 4]] * 3, float).T
    after = np.array([[0, 0, 1.5, 3], [0, 0, 2, 2], [0, 0, 1, 3]], float).T
    assert box_candidates(before, after).tolist() == [False, False, False], "YOLOv5's 2 px"
    assert box_candidates(before, after, wh_thr=1).tolist() == [True, True, False], "sides must exceed 1 px"


def test_shrinking_by_scale_alone_never_trips_the_area_rule():
    # a pure 0.5x scale: 4-px boxes become 2 px; the rule compares with the box scaled by the same gain,
    # so the area ratio is 1 (not 0.25) and only the side threshold decides
    M = np.diag([0.5, 0.5, 1.0])
    targets = np.array([[0, 10, 10, 14, 14], [1, 40, 40, 46, 46]], float)
    kept_1 = _warp_targets(targets.copy(), M, 0.5, 64, 64, 0.0, min_box_px=1.0)
    kept_2 = _warp_targets(targets.copy(), M, 0.5, 64, 64, 0.0, min_box_px=2.0)
    np.testing.assert_allclose(kept_1, [[0, 5, 5, 7, 7], [1, 20, 20, 23, 23]])
    assert kept_2[:, 0].tolist() == [1], "the 2-px result is dropped by YOLOv5's rule"
    # had the rule compared with the unscaled box, the ratio would be 0.25, still above area_thr=0.1
    assert box_candidates(targets[:, 1:5].T, kept_1[:, 1:5].T, wh_thr=1).all()


def test_area_rule_still_drops_a_tiny_box_clipped_at_the_border():
    # a 4 x 4 box shifted so that only 0.25 px x 4 px stay inside: ratio 0.0625 < 0.1, dropped at any min_box_px
    M = np.array([[1.0, 0, -9.75], [0, 1, 0], [0, 0, 1]])
    targets = np.array([[0, 6, 10, 10, 14]], float)
    assert len(_warp_targets(targets, M, 1.0, 64, 64, 0.0, min_box_px=0.0)) == 0


@pytest.mark.parametrize("seed", range(4))
def test_lower_min_box_px_keeps_a_superset_through_perspective_and_mosaic(seed):
    rng = np.random.default_rng(seed)
    im = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    xy = rng.uniform(0, 60, (30, 2))
    wh = rng.uniform(1, 5, (30, 2))
    targets = np.concatenate((np.arange(30)[:, None] % 3, xy, xy + wh), 1)
    kw = dict(degrees=0.0, translate=0.1, scale=0.5, shear=0.0)
    a = random_perspective(im, targets.copy(), np.random.default_rng(seed), **kw, min_box_px=1.0)
    b = random_perspective(im, targets.copy(), np.random.default_rng(seed), **kw, min_box_px=2.0)
    np.testing.assert_array_equal(a[0], b[0])
    assert len(b[1]) < len(a[1]), "1-5 px boxes scaled by 0.5-1.5: some end between 1 and 2 px"
    assert {tuple(r) for r in b[1]} <= {tuple(r) for r in a[1]}
    images, sizes, labels = [im] * 4, [(64, 64)] * 4, [targets] * 4
    ma = mosaic(images, sizes, labels, 64, np.random.default_rng(seed), min_box_px=1.0)[1]
    mb = mosaic(images, sizes, labels, 64, np.random.default_rng(seed), min_box_px=2.0)[1]
    assert {tuple(r) for r in mb} <= {tuple(r) for r in ma}
    assert ((ma[:, 3] - ma[:, 1]) > 1).all() and ((ma[:, 4] - ma[:, 2]) > 1).all()


# ---------------------------------------------------------------- paste_small_objects

def _scene(seed, n=6, size=96):
    """Noise background with n solid-coloured squares of 3-10 px, none touching: (image, labels xyxy)."""
    rng = np.random.default_rng(seed)
    im = rng.integers(0, 120, (size, size, 3), dtype=np.uint8)
    labels = []
    for k in range(n):
        side = int(rng.integers(3, 11))
        x, y = 4 + (k % 3) * 30 + int(rng.integers(0, 8)), 4 + (k // 3) * 40 + int(rng.integers(0, 8))
        im[y:y + side, x:x + side] = (200 + 10 * k, 255 - 20 * k, 150)
        labels.append([k % 3, x, y, x + side, y + side])
    return im, np.array(labels, float)


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("seed", range(5))
def test_pasted_objects_are_inside_free_exact_and_change_the_pixels(seed):
    im, labels = _scene(seed)
    before = im.copy()
    out, new = paste_small_objects(im.copy(), labels.copy(), np.random.default_rng(seed), 1.0)
    np.testing.assert_array_equal(new[:len(labels)], labels)
    pasted = new[len(labels):]
    assert len(pasted) > 0
    h, w = im.shape[:2]
    assert (pasted[:, [1, 2]] >= 0).all() and (pasted[:, 3] <= w).all() and (pasted[:, 4] <= h).all()
    for k, box in enumerate(pasted):
        for other in np.concatenate((labels, pasted[:k])):
            assert not _overlap(box[1:], other[1:]), "a paste lands on an existing box"
        x1, y1, x2, y2 = box[1:].astype(int)
        region = out[y1:y2, x1:x2]
        assert (region != before[y1:y2, x1:x2]).all(2).all(), "every pixel at the pasted label changed"
        sources = [lb for lb in labels.astype(int)
                   if lb[0] == box[0] and np.array_equal(before[lb[2]:lb[4], lb[1]:lb[3]], region)]
        assert len(sources) == 1, "inside the box the object is copied exactly, with its class"


def test_paste_is_deterministic_per_seed_and_feathered_at_the_edge():
    im, labels = _scene(3)
    a = paste_small_objects(im.copy(), labels.copy(), np.random.default_rng(7), 1.0)
    b = paste_small_objects(im.copy(), labels.copy(), np.random.default_rng(7), 1.0)
    c = paste_small_objects(im.copy(), labels.copy(), np.random.default_rng(8), 1.0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])
    # the pixel just outside a pasted box is a mix of the copied margin and the background there
    box = a[1][len(labels)].astype(int)
    x, y = box[3], (box[2] + box[4]) // 2  # first column right of the box
    changed = (a[0] != im).any(2)
    assert changed[y, x], "the margin blends the copy into its new background"
    assert not changed[y, x + PASTE_FEATHER_PX], "the ramp reaches alpha 0 at the feather width"


def test_paste_probability_zero_and_large_objects_paste_nothing():
    im, labels = _scene(1)
    rng = np.random.default_rng(0)
    out, new = paste_small_objects(im.copy(), labels.copy(), rng, 0.0)
    np.testing.assert_array_equal(out, im)
    np.testing.assert_array_equal(new, labels)
    big = np.array([[0, 0, 0, PASTE_SMALL_PX + 1, PASTE_SMALL_PX + 1]], float)
    out, new = paste_small_objects(im.copy(), big, np.random.default_rng(0), 1.0)
    np.testing.assert_array_equal(out, im)
    assert len(new) == 1


def test_paste_gives_up_when_no_spot_is_free():
    im, _ = _scene(0, size=32)
    labels = np.array([[0, 0, 0, 32, 16], [1, 0, 16, 4, 20], [1, 4, 16, 32, 32], [0, 0, 20, 4, 32]], float)
    out, new = paste_small_objects(im.copy(), labels.copy(), np.random.default_rng(0), 1.0)
    np.testing.assert_array_equal(new, labels)
    np.testing.assert_array_equal(out, im)


# ---------------------------------------------------------------- through the data set

@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    """Six 128-px images with 20-30 objects of 2-8 px each."""
    root = tmp_path_factory.mktemp("tiny") / "set"
    make_shapes(root, n_train=6, n_val=1, seed=3, size=128, sides=(2, 8), objects=(20, 30))
    return str(root / "images" / "train")


def _dataset(path, img_size, **hyp):
    return LoadImagesAndLabels(path, img_size=img_size, batch_size=2, augment=True, hyp={**SCRATCH_LOW, **hyp},
                               seed=5)


def test_dataset_min_box_px_keeps_more_tiny_labels_with_the_same_images(tiny_set):
    keep_1, keep_2 = _dataset(tiny_set, 64, min_box_px=1.0), _dataset(tiny_set, 64, min_box_px=2.0)
    more = 0
    for key in [(i, e, 0) for i in range(6) for e in range(3)]:
        im_1, lb_1, _, _ = keep_1[key]
        im_2, lb_2, _, _ = keep_2[key]
        assert np.array_equal(im_1.numpy(), im_2.numpy()), "the threshold changes labels, not draws"
        assert {tuple(r) for r in lb_2[:, 1:].tolist()} <= {tuple(r) for r in lb_1[:, 1:].tolist()}
        more += len(lb_1) - len(lb_2)
    assert more > 0, "objects shrunk to 1-2 px at 64 px survive only with min_box_px=1"


def test_old_hyp_without_the_new_keys_keeps_yolov5s_behaviour(tiny_set):
    old = {k: v for k, v in SCRATCH_LOW.items() if k not in ("min_box_px", "nwd", "nwd_assign", "nwd_c",
                                                                "copy_paste_small")}
    legacy = LoadImagesAndLabels(tiny_set, img_size=64, augment=True, hyp=old, seed=5)
    assert legacy.hyp["min_box_px"] == 2.0 and legacy.hyp["copy_paste_small"] == 0.0
    explicit = _dataset(tiny_set, 64, min_box_px=2.0)
    for key in [(0, 0, 0), (3, 1, 0)]:
        assert np.array_equal(legacy[key][1].numpy(), explicit[key][1].numpy())


def test_bad_new_hyp_value_is_a_user_error(tiny_set):
    with pytest.raises(UserError, match="copy_paste_small"):
        _dataset(tiny_set, 64, copy_paste_small=1.5)


def test_dataset_copy_paste_is_seeded_per_sample_and_leaves_other_draws_alone(tiny_set):
    on_a, on_b = _dataset(tiny_set, 128, copy_paste_small=1.0), _dataset(tiny_set, 128, copy_paste_small=1.0)
    off = _dataset(tiny_set, 128)
    pasted_any = False
    for key in [(i, e, 0) for i in range(6) for e in range(2)]:
        im_a, lb_a, _, _ = on_a[key]
        im_b, lb_b, _, _ = on_b[key]
        im_off, lb_off, _, _ = off[key]
        assert np.array_equal(im_a.numpy(), im_b.numpy()) and np.array_equal(lb_a.numpy(), lb_b.numpy())
        n = len(lb_off)
        # pastes are appended; flips moved them with the rest, so the first n rows are the unpasted labels
        np.testing.assert_array_equal(lb_a[:n].numpy(), lb_off.numpy())
        pasted_any |= len(lb_a) > n
        changed = (im_a.numpy() != im_off.numpy()).any(0)
        assert changed.any() == (len(lb_a) > n), "pixels change exactly when something was pasted"
    assert pasted_any


@pytest.mark.slow
def test_copy_paste_batches_are_identical_for_workers_0_and_2(tiny_set):
    from utils.dataloaders import create_dataloader

    kwargs = dict(hyp={**SCRATCH_LOW, "copy_paste_small": 1.0}, augment=True, shuffle=True, seed=3)
    l0, _ = create_dataloader(tiny_set, 128, 3, 32, workers=0, **kwargs)
    l2, _ = create_dataloader(tiny_set, 128, 3, 32, workers=2, **kwargs)
    off, _ = create_dataloader(tiny_set, 128, 3, 32, workers=0, **{**kwargs, "hyp": SCRATCH_LOW})
    for loader in (l0, l2, off):
        loader.set_epoch(1)
    a, b, plain = list(l0), list(l2), list(off)
    assert len(a) == len(b) == 2
    for (ia, ta, pa, _), (ib, tb, pb, _) in zip(a, b):
        assert pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
    assert sum(len(t) for _, t, _, _ in a) > sum(len(t) for _, t, _, _ in plain), "objects were pasted"
