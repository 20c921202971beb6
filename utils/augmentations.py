"""Image and box augmentation with YOLOv5's hyperparameter names and semantics.

Every random decision comes from the ``rng`` argument (a ``numpy.random.Generator``), never from the
global ``random``/``numpy``/``cv2`` state, so a sample's augmentation depends only on the generator
the data set seeds for it. Images are HWC BGR uint8; boxes are pixel ``xyxy`` unless a name says
otherwise.
"""

import math

import cv2
import numpy as np
import torch
import torch.nn.functional as F

PAD_COLOUR = (114, 114, 114)  # YOLOv5's letterbox / mosaic fill grey
PASTE_SMALL_PX = 32  # copy_paste_small copies objects with sqrt(w * h) below this (COCO's "small")
PASTE_FEATHER_PX = 2  # width of a pasted patch's alpha ramp outside its box
PASTE_TRIES = 20  # random spots tried per copied object


def letterbox(im, new_shape=(640, 640), color=PAD_COLOUR, auto=True, scaleFill=False, scaleup=True, stride=32):
    """Resize ``im`` (h, w, 3) keeping its aspect ratio and pad it to ``new_shape`` (h, w) or an int.

    ``auto`` pads only up to the next multiple of ``stride`` (minimum rectangle); ``scaleFill``
    stretches without padding; ``scaleup=False`` never enlarges (better mAP for validation).
    Returns ``(image, (ratio_w, ratio_h), (pad_w, pad_h))`` with the padding per side, in pixels.
    """
    shape = im.shape[:2]
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    if not scaleup:
        r = min(r, 1.0)
    ratio = r, r
    new_unpad = max(int(round(shape[1] * r)), 1), max(int(round(shape[0] * r)), 1)  # a thin strip keeps 1 px
    dw, dh = new_shape[1] - new_unpad[0], new_shape[0] - new_unpad[1]
    if auto:
        dw, dh = np.mod(dw, stride), np.mod(dh, stride)
    elif scaleFill:
        dw, dh = 0.0, 0.0
        new_unpad = (new_shape[1], new_shape[0])
        ratio = new_shape[1] / shape[1], new_shape[0] / shape[0]
    dw, dh = dw / 2, dh / 2  # split the padding between both sides
    if shape[::-1] != new_unpad:
        im = cv2.resize(im, new_unpad, interpolation=cv2.INTER_LINEAR)
    # +-0.1 puts the odd pixel of padding on the bottom/right, as YOLOv5 does
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    if top or bottom or left or right:
        im = cv2.copyMakeBorder(im, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return im, ratio, (dw, dh)


def hsv_lut(rng, hgain=0.5, sgain=0.5, vgain=0.5):
    """Draw YOLOv5's HSV gains (each uniform in ``1 +- gain``) as a (256, 1, 3) uint8 lookup table.

    Returns None when all gains are zero (nothing to do, nothing drawn).
    """
    if not (hgain or sgain or vgain):
        return None
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((256, 1, 3), dtype=np.uint8)
    lut[:, 0, 0] = ((x * r[0]) % 180).astype(np.uint8)  # OpenCV's 8-bit hue wraps at 180
    lut[:, 0, 1] = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut[:, 0, 2] = np.clip(x * r[2], 0, 255).astype(np.uint8)
    return lut


def apply_hsv(im, lut, dst=None):
    """BGR uint8 (h, w, 3) -> HSV -> ``lut`` from :func:`hsv_lut` -> BGR (into ``dst`` when given)."""
    hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
    return cv2.cvtColor(cv2.LUT(hsv, lut), cv2.COLOR_HSV2BGR, dst=dst)


def box_candidates(box1, box2, wh_thr=2, ar_thr=100, area_thr=0.1, eps=1e-16):
    """Which boxes survive augmentation: (n,) bool for ``box1`` before and ``box2`` after, both (4, n) xyxy.

    A box is kept when it is wider and taller than ``wh_thr`` pixels (the ``min_box_px`` hyp), keeps
    more than ``area_thr`` of its (scaled) area and has an aspect ratio below ``ar_thr``. Callers pass
    ``box1`` already multiplied by the warp's scale gain, so shrinking alone never trips the area rule
    (a box halved by ``scale`` keeps ratio 1, not 0.25); only clipping and rotation hulls move it.
    """
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def _perspective_matrix(rng, width, height, in_shape, degrees, translate, scale, shear, perspective):
    """3x3 matrix mapping an ``in_shape`` (h, w) image onto a ``width`` x ``height`` output.

    Composed as YOLOv5 does: centre, perspective, rotation+scale, shear, translation.
    Returns ``(M, s)`` with ``s`` the scale gain (the candidate rule compares areas scaled by it).
    """
    centre = np.eye(3)
    centre[0, 2] = -in_shape[1] / 2
    centre[1, 2] = -in_shape[0] / 2
    persp = np.eye(3)
    persp[2, 0] = rng.uniform(-perspective, perspective)
    persp[2, 1] = rng.uniform(-perspective, perspective)
    rot = np.eye(3)
    angle = rng.uniform(-degrees, degrees)
    s = rng.uniform(1 - scale, 1 + scale)
    rot[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s)
    shr = np.eye(3)
    shr[0, 1] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    shr[1, 0] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    trans = np.eye(3)
    trans[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * width
    trans[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * height
    return trans @ shr @ rot @ persp @ centre, s


def _transform_boxes(boxes, M, width, height, perspective):
    """Map (n, 4) xyxy ``boxes`` through ``M`` (3, 3): the axis-aligned hull of the moved corners, clipped."""
    n = len(boxes)
    xy = np.ones((n * 4, 3))
    xy[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)  # x1y1, x2y2, x1y2, x2y1
    xy = xy @ M.T
    xy = (xy[:, :2] / xy[:, 2:3] if perspective else xy[:, :2]).reshape(n, 8)
    x, y = xy[:, [0, 2, 4, 6]], xy[:, [1, 3, 5, 7]]
    new = np.stack((x.min(1), y.min(1), x.max(1), y.max(1)), axis=1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, width)
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, height)
    return new


def _warp_targets(targets, M, s, width, height, perspective, min_box_px=2.0):
    """Move (n, 5) ``[cls, x1, y1, x2, y2]`` through ``M`` and keep the box candidates (sides > ``min_box_px``)."""
    if not len(targets):
        return targets
    new = _transform_boxes(targets[:, 1:5], M, width, height, perspective)
    keep = box_candidates(box1=targets[:, 1:5].T * s, box2=new.T, wh_thr=min_box_px, area_thr=0.10)
    targets = targets[keep]
    targets[:, 1:5] = new[keep]
    return targets


def random_perspective(im, targets, rng, degrees=10, translate=0.1, scale=0.1, shear=10, perspective=0.0,
                       border=(0, 0), min_box_px=2.0):
    """Random rotation, scale, shear, translation and perspective of ``im`` and its ``targets``.

    ``targets`` is (n, 5) ``[cls, x1, y1, x2, y2]`` in pixels of ``im``. A negative ``border``
    crops the output to the input size plus twice the border. Returns ``(image, targets)``; boxes
    are clipped to the output and YOLOv5's candidate rule drops those that became too small, too
    thin or lost most of their area (:func:`box_candidates`, sides > ``min_box_px``). Classes are unchanged.
    """
    height = im.shape[0] + border[0] * 2
    width = im.shape[1] + border[1] * 2
    M, s = _perspective_matrix(rng, width, height, im.shape, degrees, translate, scale, shear, perspective)
    if border[0] or border[1] or (M != np.eye(3)).any():
        if perspective:
            im = cv2.warpPerspective(im, M, dsize=(width, height), borderValue=PAD_COLOUR)
        else:
            im = cv2.warpAffine(im, M[:2], dsize=(width, height), borderValue=PAD_COLOUR)
    return im, _warp_targets(targets, M, s, width, height, perspective, min_box_px)


def _tile_placement(i, xc, yc, w, h, canvas):
    """Where tile ``i`` (0 top-left .. 3 bottom-right) of size w x h lands around the centre (xc, yc).

    Returns ``(x1a, y1a, x2a, y2a)`` on the canvas and ``(x1b, y1b)``, the first used pixel of the tile;
    tiles touch the centre with one corner and are cut only by the canvas edge.
    """
    if i == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        return (x1a, y1a, x2a, y2a), (w - (x2a - x1a), h - (y2a - y1a))
    if i == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, canvas), yc
        return (x1a, y1a, x2a, y2a), (0, h - (y2a - y1a))
    if i == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(canvas, yc + h)
        return (x1a, y1a, x2a, y2a), (w - (x2a - x1a), 0)
    return (xc, yc, min(xc + w, canvas), min(canvas, yc + h)), (0, 0)


def _source_crop(im, size, first, count):
    """Original pixels behind a tile's used part: resized pixels ``first .. first + count - 1`` per axis.

    ``first``/``count`` are (x, y) pairs. Returns ``(crop, (u0, v0))`` with the crop's origin in ``im``.
    """
    bounds = []
    for axis, (f, c) in enumerate(zip(first, count)):
        n0, n = im.shape[1 - axis], size[1 - axis]
        r = n / n0
        lo = math.floor((f + 0.5) / r - 0.5)
        hi = math.ceil((f + c - 1 + 0.5) / r - 0.5) + 1
        bounds.append((min(max(lo, 0), n0 - 1), min(max(hi, 1), n0)))
    (u0, u1), (v0, v1) = bounds
    return im[v0:v1, u0:u1], (u0, v0)


def _warp_tile(out, im, size, rect, first, M, perspective):
    """Draw ``im`` resized to ``size`` (h, w) and placed at canvas ``rect`` straight into ``out`` through ``M``.

    ``first`` (x, y) is the tile's first used resized pixel (tiles are cut at the canvas edge). One
    interpolation from the original pixels; only the output rectangle the tile covers is visited.
    A one-pixel replicated border keeps tile seams free of gaps.
    """
    x1a, y1a, x2a, y2a = rect
    if x2a <= x1a or y2a <= y1a:
        return
    corners = np.array([[x1a, y1a, 1], [x2a, y1a, 1], [x1a, y2a, 1], [x2a, y2a, 1]], dtype=np.float64)
    corners[:, :2] -= 0.5  # pixel edges in OpenCV's pixel-centre coordinates
    mapped = corners @ M.T
    mapped = mapped[:, :2] / mapped[:, 2:3]
    oh, ow = out.shape[:2]
    x0, y0 = (min(max(math.ceil(v), 0), lim) for v, lim in zip(mapped.min(0).tolist(), (ow, oh)))
    x1, y1 = (min(max(math.ceil(v), 0), lim) for v, lim in zip(mapped.max(0).tolist(), (ow, oh)))
    if x1 <= x0 or y1 <= y0:
        return
    crop, (u0, v0) = _source_crop(im, size, first, (x2a - x1a, y2a - y1a))
    src = cv2.copyMakeBorder(crop, 1, 1, 1, 1, cv2.BORDER_REPLICATE)
    rx, ry = size[1] / im.shape[1], size[0] / im.shape[0]
    # padded crop pixel -> original pixel -> resized tile pixel (cv2.resize's centre alignment) -> canvas
    to_canvas = np.array([[rx, 0, (u0 - 0.5) * rx - 0.5 + x1a - first[0]],
                          [0, ry, (v0 - 0.5) * ry - 0.5 + y1a - first[1]],
                          [0, 0, 1]])
    to_roi = np.array([[1, 0, -x0], [0, 1, -y0], [0, 0, 1]], dtype=np.float64)
    A = to_roi @ M @ to_canvas
    roi = out[y0:y1, x0:x1]
    if perspective:
        cv2.warpPerspective(src, A, (x1 - x0, y1 - y0), dst=roi, borderMode=cv2.BORDER_TRANSPARENT)
    elif M[0, 1] or M[1, 0]:  # rotated or sheared: the ROI also holds pixels of other tiles
        cv2.warpAffine(src, A[:2], (x1 - x0, y1 - y0), dst=roi, borderMode=cv2.BORDER_TRANSPARENT)
    else:  # axis-aligned: the tile fills its ROI exactly, so the (much faster) replicate border is safe
        cv2.warpAffine(src, A[:2], (x1 - x0, y1 - y0), dst=roi, borderMode=cv2.BORDER_REPLICATE)


def mosaic(images, sizes, labels, img_size, rng, degrees=0.0, translate=0.1, scale=0.5, shear=0.0,
           perspective=0.0, fill=PAD_COLOUR[0], min_box_px=2.0):
    """YOLOv5's 4-image mosaic followed by :func:`random_perspective`, rendered in one pass.

    The four images, resized to ``sizes`` (h, w) (long side ``img_size``), are tiled around a random
    centre on a virtual (2 * img_size)^2 canvas that is warped to img_size^2 with a mosaic border of
    ``-img_size // 2``. Instead of building the canvas, each original image is warped once, straight
    into its part of the output: same geometry, one interpolation, a fraction of the pixel work.
    ``images``: four HWC uint8 originals; ``labels``: four (n_i, 5) ``[cls, x1, y1, x2, y2]`` in
    pixels of the resized images; ``fill`` is the grey level outside the canvas; boxes must stay wider and
    taller than ``min_box_px`` to be kept.
    Returns ``(image (s, s, c) uint8, labels (n, 5) xyxy pixels)``.
    """
    s = img_size
    canvas = 2 * s
    yc, xc = (int(v) for v in rng.uniform(s // 2, canvas - s // 2, size=2))
    placements = [_tile_placement(i, xc, yc, size[1], size[0], canvas) for i, size in enumerate(sizes)]
    M, gain = _perspective_matrix(rng, s, s, (canvas, canvas), degrees, translate, scale, shear, perspective)
    out = np.full((s, s, images[0].shape[2]), fill, dtype=np.uint8)
    canvas_labels = []
    for im, size, lb, (rect, (x1b, y1b)) in zip(images, sizes, labels, placements):
        _warp_tile(out, im, size, rect, (x1b, y1b), M, perspective)
        shifted = lb.astype(np.float64, copy=True)
        shifted[:, [1, 3]] += rect[0] - x1b
        shifted[:, [2, 4]] += rect[1] - y1b
        canvas_labels.append(shifted)
    targets = np.concatenate(canvas_labels, 0)
    targets[:, 1:] = targets[:, 1:].clip(0, canvas)
    return out, _warp_targets(targets, M, gain, s, s, perspective, min_box_px)


def mixup(im, labels, im2, labels2, rng):
    """Blend two same-sized images with a Beta(32, 32) ratio and keep both label sets (YOLOv5's MixUp).

    Returns ``(image, labels)``; labels are stacked (n1 + n2, k).
    """
    r = rng.beta(32.0, 32.0)
    blended = cv2.addWeighted(im, r, im2, 1.0 - r, 0.0)
    return blended, np.concatenate((labels, labels2), 0)


def paste_small_objects(im, labels, rng, p, tries=PASTE_TRIES):
    """Box-level copy-paste: with probability ``p``, one copy of each small object pasted onto a free spot.

    ``im`` (h, w, c) uint8 is written in place; ``labels`` (n, 5) ``[cls, x1, y1, x2, y2]`` pixels.
    Small means ``sqrt(w * h) <`` :data:`PASTE_SMALL_PX` (COCO's small). A copy is the box's pixels
    plus a :data:`PASTE_FEATHER_PX` margin whose alpha falls from 1 at the box edge to 0, moved by
    whole pixels (so its label is exact) to the first of ``tries`` random spots where the whole patch
    stays inside the image and off every box, earlier copies included; an object with no free spot
    is not copied. Copies read the image as it was before any paste. Every draw comes from ``rng``.
    Returns ``(im, labels (n + pasted, 5))``.
    """
    if not len(labels) or rng.random() >= p:
        return im, labels
    boxes = labels[:, 1:5]
    sizes = np.sqrt(np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None))
    small = np.flatnonzero((sizes > 0) & (sizes < PASTE_SMALL_PX))
    source, occupied, pasted = im.copy(), [boxes], []
    for j in rng.permutation(small).tolist():
        patch, alpha, origin = _feathered_patch(source, boxes[j])
        spot = _free_spot(rng, patch.shape[:2], im.shape[:2], np.concatenate(occupied), tries)
        if spot is None:
            continue
        (tx, ty), (ph, pw) = spot, patch.shape[:2]
        background = im[ty:ty + ph, tx:tx + pw].astype(np.float32)
        blended = alpha * patch.astype(np.float32) + (1 - alpha) * background
        im[ty:ty + ph, tx:tx + pw] = np.round(blended).astype(np.uint8)
        new = labels[j].copy()
        new[[1, 3]] += tx - origin[0]
        new[[2, 4]] += ty - origin[1]
        pasted.append(new)
        occupied.append(new[None, 1:5])
    return im, np.concatenate((labels, np.array(pasted).reshape(-1, labels.shape[1])), 0)


def _feathered_patch(im, box):
    """Pixels of ``box`` (4,) xyxy plus the feather margin, clipped to ``im`` -> (patch, alpha (ph, pw, 1), (x0, y0)).

    Alpha is 1 for pixel centres inside the box and falls linearly to 0 at the feather distance outside it.
    """
    h, w = im.shape[:2]
    x0, y0 = max(math.floor(box[0]) - PASTE_FEATHER_PX, 0), max(math.floor(box[1]) - PASTE_FEATHER_PX, 0)
    x1, y1 = min(math.ceil(box[2]) + PASTE_FEATHER_PX, w), min(math.ceil(box[3]) + PASTE_FEATHER_PX, h)
    cx, cy = np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5
    dx = np.maximum(np.maximum(box[0] - cx, cx - box[2]), 0)
    dy = np.maximum(np.maximum(box[1] - cy, cy - box[3]), 0)
    ax, ay = (np.clip(1 - d / PASTE_FEATHER_PX, 0, 1).astype(np.float32) for d in (dx, dy))
    alpha = (ay[:, None] * ax[None, :])[..., None]
    return im[y0:y1, x0:x1], alpha, (x0, y0)


def _free_spot(rng, patch_hw, image_hw, occupied, tries):
    """Top-left (x, y) of the first of ``tries`` random placements of a ``patch_hw`` patch inside ``image_hw``
    that overlaps none of the ``occupied`` (k, 4) xyxy boxes; None when every try overlaps or it cannot fit."""
    (ph, pw), (h, w) = patch_hw, image_hw
    if ph > h or pw > w:
        return None
    xs, ys = rng.integers(0, w - pw + 1, size=tries), rng.integers(0, h - ph + 1, size=tries)
    overlap = ((xs[:, None] < occupied[None, :, 2]) & (occupied[None, :, 0] < xs[:, None] + pw) &
               (ys[:, None] < occupied[None, :, 3]) & (occupied[None, :, 1] < ys[:, None] + ph)).any(1)
    free = np.flatnonzero(~overlap)
    return (int(xs[free[0]]), int(ys[free[0]])) if len(free) else None


def random_rescale(imgs: torch.Tensor, imgsz: int, grid_size: int, seed: int, epoch: int, i: int) -> torch.Tensor:
    """Multi-scale: resize the batch to a size in [0.5, 1.5]·imgsz drawn from (seed, epoch, batch)."""
    rng = np.random.default_rng([seed, epoch, i, 1])
    size = int(rng.integers(int(imgsz * 0.5), int(imgsz * 1.5) + grid_size)) // grid_size * grid_size
    factor = size / max(imgs.shape[2:])
    if factor == 1:
        return imgs
    new_shape = [math.ceil(x * factor / grid_size) * grid_size for x in imgs.shape[2:]]
    return F.interpolate(imgs, size=new_shape, mode="bilinear", align_corners=False)
