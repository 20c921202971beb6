"""Augmentation maths: letterbox, perspective, the one-pass mosaic, HSV, candidates, mixup."""

import math
import random

import cv2
import numpy as np
import pytest

from utils.augmentations import (
    PAD_COLOUR,
    _tile_placement,
    apply_hsv,
    box_candidates,
    hsv_lut,
    letterbox,
    mixup,
    mosaic,
    random_perspective,
)

CLASS_COLOURS = {0: (0, 0, 255), 1: (0, 255, 0), 2: (255, 0, 0)}  # BGR, one per class


def scene(seed, h=96, w=128, n=4):
    """Grey image with n solid class-coloured squares -> (image, (n, 5) [cls, x1, y1, x2, y2] pixels)."""
    rng = np.random.default_rng(seed)
    im = np.full((h, w, 3), 60, np.uint8)
    labels = []
    for i in range(n):
        side = int(rng.integers(14, 24))
        x1, y1 = int(rng.integers(0, w - side)), int(rng.integers(0, h - side))
        if any(x1 < b[3] + 2 and b[1] < x1 + side + 2 and y1 < b[4] + 2 and b[2] < y1 + side + 2 for b in labels):
            continue
        cls = i % 3
        im[y1:y1 + side, x1:x1 + side] = CLASS_COLOURS[cls]
        labels.append([cls, x1, y1, x1 + side, y1 + side])
    return im, np.array(labels, dtype=np.float64)


# ---------------------------------------------------------------- letterbox

@pytest.mark.parametrize("shape", [(60, 100), (100, 60), (128, 128), (30, 40)])
def test_letterbox_round_trip_restores_boxes_and_pixels(shape):
    im = np.random.default_rng(0).integers(0, 256, (*shape, 3), dtype=np.uint8)
    out, (rw, rh), (padw, padh) = letterbox(im, 128, auto=False)
    assert out.shape == (128, 128, 3)
    box = np.array([0.2 * shape[1], 0.3 * shape[0], 0.7 * shape[1], 0.9 * shape[0]])
    moved = box * [rw, rh, rw, rh] + [padw, padh, padw, padh]
    assert (moved >= 0).all() and (moved <= 128).all()
    back = (moved - [padw, padh, padw, padh]) / [rw, rh, rw, rh]
    np.testing.assert_allclose(back, box, atol=1e-9)
    top, left = int(round(padh - 0.1)), int(round(padw - 0.1))
    inner = out[top:128 - int(round(padh + 0.1)), left:128 - int(round(padw + 0.1))]
    expected_inner = cv2.resize(im, (inner.shape[1], inner.shape[0]), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(inner, expected_inner)
    if padh >= 1:
        assert (out[0] == PAD_COLOUR[0]).all()


def test_letterbox_auto_scaleup_and_scalefill():
    im = np.zeros((50, 100, 3), np.uint8)
    auto, _, (pw, ph) = letterbox(im, 128, auto=True, stride=32)
    assert auto.shape == (64, 128, 3) and ph == 0
    small, ratio, _ = letterbox(im, 256, auto=False, scaleup=False)
    assert ratio == (1.0, 1.0) and small.shape == (256, 256, 3)
    stretched, ratio, pad = letterbox(im, (64, 64), auto=False, scaleFill=True)
    assert stretched.shape == (64, 64, 3) and pad == (0.0, 0.0) and ratio == (0.64, 1.28)


# ---------------------------------------------------------------- perspective and candidates

@pytest.mark.parametrize("seed", range(6))
def test_random_perspective_keeps_boxes_inside_and_classes_on_their_pixels(seed):
    im, labels = scene(seed)
    rng = np.random.default_rng(seed)
    out, new = random_perspective(im, labels.copy(), rng, degrees=15, translate=0.1, scale=0.3, shear=5,
                                  perspective=0.0005)
    h, w = out.shape[:2]
    assert out.shape == im.shape and len(new) <= len(labels)
    assert (new[:, [1, 3]] >= 0).all() and (new[:, [1, 3]] <= w).all()
    assert (new[:, [2, 4]] >= 0).all() and (new[:, [2, 4]] <= h).all()
    assert set(new[:, 0]) <= set(labels[:, 0])
    for cls, x1, y1, x2, y2 in new:
        cx, cy = int((x1 + x2) / 2), int((y1 + y2) / 2)
        if 0 <= cx < w and 0 <= cy < h and (x2 - x1) > 8 and (y2 - y1) > 8:
            assert np.abs(out[cy, cx].astype(int) - CLASS_COLOURS[int(cls)]).max() < 60


def test_random_perspective_identity_returns_input_unchanged():
    im, labels = scene(1)
    out, new = random_perspective(im, labels.copy(), np.random.default_rng(0), degrees=0, translate=0, scale=0,
                                  shear=0, perspective=0)
    assert out is im
    np.testing.assert_allclose(new, labels)


def test_box_candidates_rule():
    before = np.array([[0, 0, 20, 20], [0, 0, 20, 20], [0, 0, 20, 20], [0, 0, 20, 20], [0, 0, 200, 2.5]], float).T
    after = np.array([[0, 0, 18, 18],  # kept
                      [0, 0, 1.5, 18],  # thinner than 2 px
                      [0, 0, 5, 5],  # keeps 6 % of its area
                      [0, 0, 20, 20],  # unchanged
                      [0, 0, 300, 2.9]], float).T  # aspect ratio above 100
    assert box_candidates(before, after).tolist() == [True, False, False, True, False]


# ---------------------------------------------------------------- mosaic

def canvas_reference(images, sizes, labels, s, rng, **kw):
    """YOLOv5's two-step mosaic: resize, paste on a 2s canvas, then random_perspective (for comparison)."""
    canvas = np.full((2 * s, 2 * s, 3), PAD_COLOUR[0], np.uint8)
    yc, xc = (int(v) for v in rng.uniform(s // 2, 2 * s - s // 2, size=2))
    moved = []
    for i, (im, size, lb) in enumerate(zip(images, sizes, labels)):
        resized = cv2.resize(im, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
        (x1a, y1a, x2a, y2a), (x1b, y1b) = _tile_placement(i, xc, yc, size[1], size[0], 2 * s)
        canvas[y1a:y2a, x1a:x2a] = resized[y1b:y1b + y2a - y1a, x1b:x1b + x2a - x1a]
        shifted = lb.copy()
        shifted[:, [1, 3]] += x1a - x1b
        shifted[:, [2, 4]] += y1a - y1b
        moved.append(shifted)
    targets = np.concatenate(moved)
    targets[:, 1:] = targets[:, 1:].clip(0, 2 * s)
    return random_perspective(canvas, targets, rng, border=(-s // 2, -s // 2), **kw)


def mosaic_inputs(seeds, s):
    """Four scenes of different sizes, their resized (h, w) and labels in resized pixels."""
    images, sizes, labels = [], [], []
    for seed, (h, w) in zip(seeds, [(96, 128), (128, 80), (64, 64), (100, 120)]):
        im, lb = scene(seed, h, w)
        r = s / max(h, w)
        size = (math.ceil(h * r), math.ceil(w * r))
        lb[:, [1, 3]] *= size[1] / w
        lb[:, [2, 4]] *= size[0] / h
        images.append(im)
        sizes.append(size)
        labels.append(lb)
    return images, sizes, labels


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kw", [dict(degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0),
                                dict(degrees=20.0, translate=0.1, scale=0.5, shear=5.0, perspective=0.0005)],
                         ids=["axis-aligned", "rotated"])
def test_mosaic_matches_the_two_step_canvas_mosaic(seed, kw):
    s = 128
    images, sizes, labels = mosaic_inputs([seed, seed + 10, seed + 20, seed + 30], s)
    ref, ref_labels = canvas_reference(images, sizes, labels, s, np.random.default_rng(seed), **kw)
    out, out_labels = mosaic(images, sizes, labels, s, np.random.default_rng(seed), **kw)
    assert out.shape == (s, s, 3) and out.dtype == np.uint8
    np.testing.assert_allclose(out_labels, ref_labels)
    diff = np.abs(out.astype(int) - ref.astype(int)).max(2)
    assert (diff > 40).mean() < 0.02  # only seams and edges resample differently
    assert np.median(diff) <= 1


@pytest.mark.parametrize("seed", range(8))
def test_mosaic_keeps_boxes_inside_and_classes_unchanged(seed):
    s = 128
    images, sizes, labels = mosaic_inputs([seed, seed + 1, seed + 2, seed + 3], s)
    out, new = mosaic(images, sizes, labels, s, np.random.default_rng(seed), scale=0.5, translate=0.1)
    assert len(new) and (new[:, 1:] >= 0).all() and (new[:, 1:] <= s).all()
    assert set(new[:, 0]) <= {0.0, 1.0, 2.0}
    assert ((new[:, 3] - new[:, 1]) > 2).all() and ((new[:, 4] - new[:, 2]) > 2).all()
    for cls, x1, y1, x2, y2 in new:  # the box still frames its own class's colour
        if (x2 - x1) > 6 and (y2 - y1) > 6:
            patch = out[int(y1) + 2:int(y2) - 2, int(x1) + 2:int(x2) - 2].reshape(-1, 3).astype(int)
            assert (np.abs(patch - CLASS_COLOURS[int(cls)]).max(1) < 60).mean() > 0.5


# ---------------------------------------------------------------- colour, mixup, randomness hygiene

def test_hsv_lut_is_seeded_and_zero_gains_draw_nothing():
    im = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    rng = np.random.default_rng(0)
    assert hsv_lut(rng, 0, 0, 0) is None and rng.random() == np.random.default_rng(0).random()
    a = apply_hsv(im, hsv_lut(np.random.default_rng(5), 0.015, 0.7, 0.4))
    b = im.copy()
    apply_hsv(b, hsv_lut(np.random.default_rng(5), 0.015, 0.7, 0.4), dst=b)
    assert np.array_equal(a, b) and not np.array_equal(a, im)
    darker = hsv_lut(np.random.default_rng(0), 0, 0, 0.4)
    grey = apply_hsv(np.full((2, 2, 3), 114, np.uint8), darker)
    assert (grey == grey[0, 0, 0]).all()  # grey stays grey


def test_mixup_blends_images_and_stacks_labels():
    a, b = np.zeros((16, 16, 3), np.uint8), np.full((16, 16, 3), 200, np.uint8)
    la, lb = np.array([[0, 1, 1, 5, 5]], float), np.array([[2, 3, 3, 9, 9], [1, 0, 0, 4, 4]], float)
    im, labels = mixup(a, la, b, lb, np.random.default_rng(0))
    assert 60 < im.mean() < 140 and labels.shape == (3, 5) and labels[:, 0].tolist() == [0, 2, 1]


def test_augmentations_leave_global_random_state_alone():
    np_state, py_state = np.random.get_state(), random.getstate()
    images, sizes, labels = mosaic_inputs([0, 1, 2, 3], 64)
    rng = np.random.default_rng(0)
    out, _ = mosaic(images, sizes, labels, 64, rng, degrees=10, shear=2)
    random_perspective(out, np.zeros((0, 5)), rng, degrees=10)
    apply_hsv(out, hsv_lut(rng), dst=out)
    assert np.array_equal(np_state[1], np.random.get_state()[1]) and py_state == random.getstate()
