"""Box maths and non-maximum suppression.

Box formats: ``xyxy`` = (x1, y1, x2, y2) corners, ``xywh`` = (x_centre, y_centre, width, height);
a trailing ``n`` means normalised to the image size (0..1). All converters accept a torch tensor
or a numpy array of shape ``(..., 4)`` and return a new object of the same kind.
"""

import math
import time

import numpy as np
import torch
import torchvision

from utils.errors import UserError
from utils.logging import LOGGER

MAX_WH = 7680  # class offset for batched NMS; larger than any image side we process


def make_divisible(x, divisor) -> int:
    """Smallest multiple of ``divisor`` that is >= ``x`` (``divisor`` may be a stride tensor: its max)."""
    if isinstance(divisor, torch.Tensor):
        divisor = int(divisor.max())
    return int(math.ceil(x / divisor) * divisor)


def check_img_size(imgsz, stride=32, floor=0):
    """Round an image size (int or list of ints) up to a multiple of ``stride``, at least ``floor``.

    Warns when the size had to change, because the user asked for something else.
    """
    if isinstance(imgsz, (int, np.integer)):
        new_size = max(make_divisible(int(imgsz), stride), floor)
    elif isinstance(imgsz, (list, tuple)):
        new_size = [max(make_divisible(int(x), stride), floor) for x in imgsz]
    else:
        raise UserError(f"--imgsz {imgsz!r}: expected an integer or a list of integers")
    if new_size != imgsz and list(np.atleast_1d(new_size)) != list(np.atleast_1d(imgsz)):
        LOGGER.warning(f"--imgsz {imgsz} must be a multiple of max stride {int(stride)}, "
                       f"updating to {new_size}")
    return new_size


def _empty_like(x):
    return x.clone() if isinstance(x, torch.Tensor) else np.copy(x)


def xywh2xyxy(x):
    """(..., 4) centre/size boxes -> corner boxes."""
    y = _empty_like(x)
    y[..., 0] = x[..., 0] - x[..., 2] / 2
    y[..., 1] = x[..., 1] - x[..., 3] / 2
    y[..., 2] = x[..., 0] + x[..., 2] / 2
    y[..., 3] = x[..., 1] + x[..., 3] / 2
    return y


def xyxy2xywh(x):
    """(..., 4) corner boxes -> centre/size boxes."""
    y = _empty_like(x)
    y[..., 0] = (x[..., 0] + x[..., 2]) / 2
    y[..., 1] = (x[..., 1] + x[..., 3]) / 2
    y[..., 2] = x[..., 2] - x[..., 0]
    y[..., 3] = x[..., 3] - x[..., 1]
    return y


def xywhn2xyxy(x, w=640, h=640, padw=0, padh=0):
    """(..., 4) normalised centre/size boxes -> pixel corners in a ``w`` x ``h`` image shifted by the padding."""
    y = _empty_like(x)
    y[..., 0] = w * (x[..., 0] - x[..., 2] / 2) + padw
    y[..., 1] = h * (x[..., 1] - x[..., 3] / 2) + padh
    y[..., 2] = w * (x[..., 0] + x[..., 2] / 2) + padw
    y[..., 3] = h * (x[..., 1] + x[..., 3] / 2) + padh
    return y


def xyxy2xywhn(x, w=640, h=640, clip=False, eps=0.0):
    """(..., 4) pixel corners -> normalised centre/size boxes; ``clip`` first limits them to the image."""
    if clip:
        x = clip_boxes(_empty_like(x), (h - eps, w - eps))
    y = _empty_like(x)
    y[..., 0] = ((x[..., 0] + x[..., 2]) / 2) / w
    y[..., 1] = ((x[..., 1] + x[..., 3]) / 2) / h
    y[..., 2] = (x[..., 2] - x[..., 0]) / w
    y[..., 3] = (x[..., 3] - x[..., 1]) / h
    return y


def clip_boxes(boxes, shape):
    """Clip (..., 4) xyxy ``boxes`` in place to an image of ``shape`` (h, w); returns them."""
    h, w = shape[0], shape[1]
    if isinstance(boxes, torch.Tensor):
        boxes[..., 0].clamp_(0, w)
        boxes[..., 1].clamp_(0, h)
        boxes[..., 2].clamp_(0, w)
        boxes[..., 3].clamp_(0, h)
    else:
        boxes[..., [0, 2]] = boxes[..., [0, 2]].clip(0, w)
        boxes[..., [1, 3]] = boxes[..., [1, 3]].clip(0, h)
    return boxes


def scale_boxes(img1_shape, boxes, img0_shape, ratio_pad=None):
    """Map (n, 4) xyxy ``boxes`` from a letterboxed ``img1_shape`` (h, w) back to the original ``img0_shape``.

    ``ratio_pad`` = ((gain_h, gain_w), (padw, padh)) from the loader; computed from the shapes when None.
    Modifies and returns ``boxes``, clipped to the original image.
    """
    if ratio_pad is None:
        gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
        padw = (img1_shape[1] - img0_shape[1] * gain) / 2
        padh = (img1_shape[0] - img0_shape[0] * gain) / 2
    else:
        gain = ratio_pad[0][0]
        padw, padh = ratio_pad[1]
    boxes[..., [0, 2]] -= padw
    boxes[..., [1, 3]] -= padh
    boxes[..., :4] /= gain
    return clip_boxes(boxes, img0_shape)


def _check_thresholds(conf_thres, iou_thres, max_det):
    if not 0 <= conf_thres <= 1:
        raise UserError(f"--conf-thres {conf_thres}: must be between 0.0 and 1.0")
    if not 0 <= iou_thres <= 1:
        raise UserError(f"--iou-thres {iou_thres}: must be between 0.0 and 1.0")
    if max_det < 1:
        raise UserError(f"--max-det {max_det}: must be a positive integer")


def _candidates(x, labels, nc, conf_thres, multi_label):
    """One image's (N, 5 + nc) predictions -> (n, 6) candidates [x1, y1, x2, y2, conf, cls] above ``conf_thres``."""
    if labels is not None and len(labels):
        # save-hybrid: ground-truth boxes join the candidates with full confidence
        lb = labels.to(x)
        forced = torch.zeros((len(lb), 5 + nc), device=x.device, dtype=x.dtype)
        forced[:, :4] = lb[:, 1:5]
        forced[:, 4] = 1.0
        forced[torch.arange(len(lb)), lb[:, 0].long() + 5] = 1.0
        x = torch.cat((x, forced), 0)
    x = x[x[:, 4] > conf_thres]
    scores = x[:, 5:] * x[:, 4:5]  # conf = objectness * class probability
    box = xywh2xyxy(x[:, :4])
    if multi_label:
        i, j = (scores > conf_thres).nonzero(as_tuple=False).T
        return torch.cat((box[i], scores[i, j, None], j[:, None].float()), 1)
    conf, j = scores.max(1, keepdim=True)
    return torch.cat((box, conf, j.float()), 1)[conf.view(-1) > conf_thres]


def non_max_suppression(prediction, conf_thres=0.25, iou_thres=0.45, classes=None, agnostic=False,
                        multi_label=False, labels=(), max_det=300, max_nms=30000, time_limit=None):
    """Per-image NMS on ``torchvision.ops.batched_nms``.

    ``prediction``: (bs, N, 5 + nc) [x, y, w, h, obj, cls scores...] in pixels, or the
    eval-mode tuple ``(pred, raw)``. ``labels``: optional per-image (n, 5) [cls, x, y, w, h]
    pixel tensors merged in as certain detections (``--save-hybrid``).
    Returns a list of ``bs`` tensors (n, 6) [x1, y1, x2, y2, conf, cls], at most ``max_det`` each.
    Warns and returns early (remaining images empty) when the batch takes longer than
    ``time_limit`` seconds (default 0.5 + 0.05 per image).
    """
    _check_thresholds(conf_thres, iou_thres, max_det)
    if isinstance(prediction, (list, tuple)):
        prediction = prediction[0]
    bs, nc = prediction.shape[0], prediction.shape[2] - 5
    multi_label &= nc > 1
    time_limit = 0.5 + 0.05 * bs if time_limit is None else time_limit
    device = prediction.device
    if device.type == "mps":  # torchvision NMS is not fully supported on MPS
        prediction = prediction.cpu()

    start = time.time()
    output = [torch.zeros((0, 6), device=prediction.device)] * bs
    for xi, x in enumerate(prediction):
        lb = labels[xi] if labels is not None and len(labels) else None
        det = _candidates(x, lb, nc, conf_thres, multi_label)
        if classes is not None:
            det = det[(det[:, 5:6] == torch.tensor(classes, device=det.device)).any(1)]
        if not len(det):
            continue
        det = det[det[:, 4].argsort(descending=True)[:max_nms]]
        offsets = torch.zeros_like(det[:, 5]) if agnostic else det[:, 5]
        keep = torchvision.ops.batched_nms(det[:, :4], det[:, 4], offsets.long(), iou_thres)
        output[xi] = det[keep[:max_det]]
        if time.time() - start > time_limit:
            LOGGER.warning(f"NMS time limit {time_limit:.3f}s exceeded after {xi + 1}/{bs} images; "
                           "raise --conf-thres or lower --max-det to speed it up")
            break
    return [o.to(device) for o in output]
