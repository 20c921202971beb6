"""Box maths and non-maximum suppression.

Box formats: ``xyxy`` = (x1, y1, x2, y2) corners, ``xywh`` = (x_centre, y_centre, width, height);
a trailing ``n`` means normalised to the image size (0..1). All converters accept a torch tensor
or a numpy array of shape ``(..., 4)`` and return a new object of the same kind.
"""

import math

import numpy as np
import torch

from utils.errors import UserError
from utils.logging import LOGGER
from utils.torchvision_ops import batched_nms

MAX_WH = 7680  # class offset for batched NMS; larger than any image side we process


def make_divisible(x, divisor) -> int:
    """Smallest multiple of ``divisor`` that is >= ``x`` (``divisor`` may be a stride tensor: its max)."""
    if isinstance(divisor, torch.Tensor):
        divisor = int(divisor.max())
    return int(math.ceil(x / divisor) * divisor)


def is_index(value) -> bool:
    """An int, numpy's included; not a bool, float or string (values from Python code, not parsed flags)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_positive_int(value) -> bool:
    return is_index(value) and value > 0


def size_list(imgsz) -> list:
    """A Python API's image size (an int, or a list or tuple of them) as a list, for check_img_size to judge:
    ``list("64")`` would split a string into digits."""
    return list(imgsz) if isinstance(imgsz, (list, tuple)) else [imgsz]


def check_img_size(imgsz, stride=32, floor=0):
    """Round an image size (int or list of ints) up to a multiple of ``stride``, at least ``floor``.

    Warns when the size had to change, because the user asked for something else.
    """
    if is_positive_int(imgsz):
        new_size = max(make_divisible(int(imgsz), stride), floor)
    elif isinstance(imgsz, (list, tuple)) and imgsz and all(map(is_positive_int, imgsz)):
        new_size = [max(make_divisible(int(x), stride), floor) for x in imgsz]
    else:  # from Python code: "640" or 0 would otherwise become a size silently (["6", "4", "0"] -> [32, 32, 0])
        raise UserError(f"--imgsz {imgsz!r}: expected a positive integer or a list of them")
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


CLI_NMS_LABELS = {"conf": "--conf-thres", "iou": "--iou-thres", "max_det": "--max-det", "classes": "--classes"}


def _named(label: str, value) -> str:
    """How the user wrote a value: ``--conf-thres 2`` for a flag, ``Detector: conf=2`` for a keyword."""
    if label.startswith("--"):
        return f"{label} {(' '.join(map(str, value)) or '(none)') if isinstance(value, (list, tuple)) else repr(value)}"
    return f"{label}={value!r}"


def check_thresholds(conf_thres, iou_thres, max_det, labels: dict = CLI_NMS_LABELS):
    """The same limits whether the values come from a command line (already numbers) or from Python code
    (the Detector's ``conf="0.5"`` would otherwise end in a TypeError deep inside NMS). ``labels`` names each
    value as the user wrote it (see :func:`_named`)."""
    for key, value in (("conf", conf_thres), ("iou", iou_thres)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 <= value <= 1:
            raise UserError(f"{_named(labels[key], value)}: must be a number between 0.0 and 1.0")
    if not is_positive_int(max_det):
        raise UserError(f"{_named(labels['max_det'], max_det)}: must be a positive integer")


def check_class_filter(classes, nc: int, labels: dict = CLI_NMS_LABELS):
    """``--classes`` (or the Detector's ``classes``) must name the model's classes, by index: a filter on a class
    the model does not have would silently keep nothing."""
    wanted = [classes] if isinstance(classes, (int, np.integer)) else list(classes)
    bad = [c for c in wanted if not (is_index(c) and 0 <= c < nc)]
    if bad or not wanted:
        leave_out = labels["classes"] if labels["classes"].startswith("--") else "classes"
        raise UserError(f"{_named(labels['classes'], classes)}: the model has {nc} classes; "
                        f"give class indices from 0 to {nc - 1}, or leave {leave_out} out to keep all")


def _forced_rows(labels, bs, nc, like):
    """Per-image ``labels`` (n, 5) [cls, x, y, w, h] -> (rows (m, 5 + nc), image index (m,)) of certain predictions."""
    rows, images = [], []
    for xi in range(min(bs, len(labels))):
        lb = labels[xi].to(like)
        if not len(lb):
            continue
        forced = torch.zeros((len(lb), 5 + nc), device=like.device, dtype=like.dtype)
        forced[:, :4] = lb[:, 1:5]
        forced[:, 4] = 1.0
        forced[torch.arange(len(lb), device=like.device), lb[:, 0].long() + 5] = 1.0
        rows.append(forced)
        images.append(torch.full((len(lb),), xi, device=like.device, dtype=torch.long))
    if not rows:
        return None, None
    return torch.cat(rows), torch.cat(images)


def _candidates(prediction, labels, nc, conf_thres, multi_label):
    """All images' (bs, N, 5 + nc) predictions -> (det (m, 6) [x1, y1, x2, y2, conf, cls], image index (m,)).

    Rows stay grouped by image, in prediction order, with any save-hybrid label rows after
    their image's predictions. Scores are objectness * class probability, kept above ``conf_thres``.
    """
    image, anchor = (prediction[..., 4] > conf_thres).nonzero(as_tuple=True)
    x = prediction[image, anchor]
    if labels is not None and len(labels):
        forced, forced_image = _forced_rows(labels, prediction.shape[0], nc, prediction)
        if forced is not None:
            keep = forced[:, 4] > conf_thres
            x, image = torch.cat((x, forced[keep])), torch.cat((image, forced_image[keep]))
            order = image.argsort(stable=True)
            x, image = x[order], image[order]
    scores = x[:, 5:] * x[:, 4:5]
    box = xywh2xyxy(x[:, :4])
    if multi_label:
        i, j = (scores > conf_thres).nonzero(as_tuple=True)
        return torch.cat((box[i], scores[i, j, None], j[:, None].float()), 1), image[i]
    conf, j = scores.max(1, keepdim=True)
    keep = conf.view(-1) > conf_thres
    return torch.cat((box, conf, j.float()), 1)[keep], image[keep]


def _sorted_by_image_and_conf(det, image):
    """Reorder candidates: images ascending, confidence descending within each image."""
    order = det[:, 4].argsort(descending=True, stable=True)
    order = order[image[order].argsort(stable=True)]
    return det[order], image[order]


def _nms_top(det, iou_thres, agnostic, max_det):
    """The first ``max_det`` detections that per-class NMS keeps from confidence-sorted ``det`` (n, 6).

    Greedy NMS decides each box from higher-scored boxes only, so NMS on a confidence-ordered
    prefix keeps exactly the full run's detections within that prefix: once a prefix yields
    ``max_det`` of them, the rest of the candidates cannot change the answer. The prefix grows
    fourfold until that holds or it covers everything (cost O(prefix * kept), not O(n * kept)).
    """
    size = min(len(det), max(4 * max_det, 1024))
    while True:
        part = det[:size]
        groups = torch.zeros_like(part[:, 5]) if agnostic else part[:, 5]
        keep = batched_nms(part[:, :4], part[:, 4], groups.long(), iou_thres)
        if len(keep) >= max_det or size == len(det):
            return part[keep[:max_det]]
        size = min(len(det), 4 * size)


def non_max_suppression(prediction, conf_thres=0.25, iou_thres=0.45, classes=None, agnostic=False,
                        multi_label=False, labels=(), max_det=300, max_nms=30000):
    """Per-class NMS of a batch on torchvision's ``batched_nms`` (utils/torchvision_ops.py).

    ``prediction``: (bs, N, 5 + nc) [x, y, w, h, obj, cls scores...] in pixels, or the
    eval-mode tuple ``(pred, raw)``. ``labels``: optional per-image (n, 5) [cls, x, y, w, h]
    pixel tensors merged in as certain detections (``--save-hybrid``).
    Returns a list of ``bs`` tensors (n, 6) [x1, y1, x2, y2, conf, cls], at most ``max_det`` each,
    confidence descending. Candidate filtering, scoring and sorting run on the whole batch at once;
    only the NMS call itself runs per image, because joining images into one call would need
    coordinate offsets large enough to round float32 boxes. There is deliberately no wall-clock
    limit (YOLOv5 has one): the detections, and every metric built on them, must not depend on
    how busy the machine is. ``max_nms`` and ``max_det`` bound the work instead.
    """
    check_thresholds(conf_thres, iou_thres, max_det)
    if isinstance(prediction, (list, tuple)):
        prediction = prediction[0]
    bs, nc = prediction.shape[0], prediction.shape[2] - 5
    if classes is not None:
        check_class_filter(classes, nc)
    multi_label &= nc > 1
    device = prediction.device
    if device.type == "mps":  # torchvision NMS is not fully supported on MPS
        prediction = prediction.cpu()

    output = [torch.zeros((0, 6), device=prediction.device)] * bs
    det, image = _candidates(prediction, labels, nc, conf_thres, multi_label)
    if classes is not None:
        wanted = (det[:, 5:6] == torch.tensor(classes, device=det.device)).any(1)
        det, image = det[wanted], image[wanted]
    det, image = _sorted_by_image_and_conf(det, image)
    counts = torch.bincount(image, minlength=bs).tolist()
    first = 0
    for xi, count in enumerate(counts):
        if count:
            output[xi] = _nms_top(det[first:first + min(count, max_nms)], iou_thres, agnostic, max_det)
        first += count
    return [o.to(device) for o in output]


def yolo_label_lines(det, shape, save_conf: bool) -> list[str]:
    """YOLO-format label lines ``"cls x y w h [conf]\n"`` for ``(n, 6)`` xyxy/conf/cls detections in the
    pixels of an image of ``shape`` ``(h, w, ...)``, normalised to it (val's and detect's ``--save-txt``)."""
    h, w = shape[:2]
    lines = []
    for *xyxy, conf, cls in det.tolist():
        xywh = xyxy2xywhn(torch.tensor([xyxy]), w=w, h=h)[0].tolist()
        values = (int(cls), *xywh, conf) if save_conf else (int(cls), *xywh)
        lines.append(("%g " * len(values)).rstrip() % values + "\n")
    return lines
