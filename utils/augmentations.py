"""Image and box augmentation with YOLOv5's hyperparameter names and semantics.

Every random decision comes from the ``rng`` argument (a ``numpy.random.Generator``), never from the
global ``random``/``numpy``/``cv2`` state, so a sample's augmentation depends only on the generator
the data set seeds for it. Images are HWC BGR uint8; boxes are pixel ``xyxy`` unless a name says
otherwise.
"""

import math

import cv2
import numpy as np

PAD_COLOUR = (114, 114, 114)  # YOLOv5's letterbox / mosaic fill grey


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
    new_unpad = int(round(shape[1] * r)), int(round(shape[0] * r))
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


def augment_hsv(im, rng, hgain=0.5, sgain=0.5, vgain=0.5):
    """Scale hue, saturation and value of ``im`` (h, w, 3) BGR uint8 by random gains, in place.

    Each gain is drawn uniformly from ``1 +- gain``; one 3-channel lookup table does all channels.
    """
    if not (hgain or sgain or vgain):
        return
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((256, 1, 3), dtype=np.uint8)
    lut[:, 0, 0] = ((x * r[0]) % 180).astype(np.uint8)  # OpenCV's 8-bit hue wraps at 180
    lut[:, 0, 1] = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut[:, 0, 2] = np.clip(x * r[2], 0, 255).astype(np.uint8)
    hsv = cv2.cvtColor(im, cv2.COLOR_BGR2HSV)
    cv2.cvtColor(cv2.LUT(hsv, lut), cv2.COLOR_HSV2BGR, dst=im)


def box_candidates(box1, box2, wh_thr=2, ar_thr=100, area_thr=0.1, eps=1e-16):
    """Which boxes survive augmentation: (n,) bool for ``box1`` before and ``box2`` after, both (4, n) xyxy.

    A box is kept when it is wider and taller than ``wh_thr`` pixels, keeps more than ``area_thr``
    of its (scaled) area and has an aspect ratio below ``ar_thr``.
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


def random_perspective(im, targets, rng, degrees=10, translate=0.1, scale=0.1, shear=10, perspective=0.0,
                       border=(0, 0)):
    """Random rotation, scale, shear, translation and perspective of ``im`` and its ``targets``.

    ``targets`` is (n, 5) ``[cls, x1, y1, x2, y2]`` in pixels of ``im``. A negative ``border``
    (mosaic: ``-img_size // 2``) crops the output to the input size plus twice the border.
    Returns ``(image, targets)``; boxes are clipped to the output and YOLOv5's candidate rule
    drops those that became too small, too thin or lost most of their area. Classes are unchanged.
    """
    height = im.shape[0] + border[0] * 2
    width = im.shape[1] + border[1] * 2
    M, s = _perspective_matrix(rng, width, height, im.shape, degrees, translate, scale, shear, perspective)
    if border[0] or border[1] or (M != np.eye(3)).any():
        if perspective:
            im = cv2.warpPerspective(im, M, dsize=(width, height), borderValue=PAD_COLOUR)
        else:
            im = cv2.warpAffine(im, M[:2], dsize=(width, height), borderValue=PAD_COLOUR)
    if len(targets):
        new = _transform_boxes(targets[:, 1:5], M, width, height, perspective)
        keep = box_candidates(box1=targets[:, 1:5].T * s, box2=new.T, area_thr=0.10)
        targets = targets[keep]
        targets[:, 1:5] = new[keep]
    return im, targets


def mosaic(images, labels, img_size, rng, fill=PAD_COLOUR):
    """Tile four images around a random centre on a (2 * img_size)^2 canvas, YOLOv5's 4-image mosaic.

    ``images``: four HWC uint8 images already resized so their long side is ``img_size``;
    ``labels``: four (n_i, 5) ``[cls, x1, y1, x2, y2]`` arrays in each image's pixels.
    Returns ``(canvas (2s, 2s, 3), labels (n, 5))`` with boxes in canvas pixels, clipped to it.
    Follow with :func:`random_perspective` using ``border=(-s // 2, -s // 2)`` to get s x s.
    """
    s = img_size
    yc, xc = (int(v) for v in rng.uniform(s // 2, 2 * s - s // 2, size=2))
    canvas = np.full((s * 2, s * 2, images[0].shape[2]), fill[0], dtype=np.uint8)
    out_labels = []
    for i, (im, lb) in enumerate(zip(images, labels)):
        h, w = im.shape[:2]
        if i == 0:  # top left: the image's bottom-right corner touches the centre
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, s * 2), yc
            x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(s * 2, yc + h)
            x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, s * 2), min(s * 2, yc + h)
            x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
        canvas[y1a:y2a, x1a:x2a] = im[y1b:y2b, x1b:x2b]
        shifted = lb.astype(np.float64, copy=True)
        shifted[:, [1, 3]] += x1a - x1b
        shifted[:, [2, 4]] += y1a - y1b
        out_labels.append(shifted)
    out = np.concatenate(out_labels, 0) if out_labels else np.zeros((0, 5))
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, 2 * s)
    out[:, [2, 4]] = out[:, [2, 4]].clip(0, 2 * s)
    return canvas, out


def mixup(im, labels, im2, labels2, rng):
    """Blend two same-sized images with a Beta(32, 32) ratio and keep both label sets (YOLOv5's MixUp).

    Returns ``(image, labels)``; labels are stacked (n1 + n2, k).
    """
    r = rng.beta(32.0, 32.0)
    blended = cv2.addWeighted(im, r, im2, 1.0 - r, 0.0)
    return blended, np.concatenate((labels, labels2), 0)
