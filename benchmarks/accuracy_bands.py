"""AP by object-size band (sqrt of box area in pixels), COCO's area-range rule on YOLOv5's matching.

For a band ``[lo, hi)`` only labels inside it count; a detection that matches no in-band label
is ignored when it overlaps an out-of-band label of its class (IoU >= 0.5) or is itself outside
the band, and counts as a false positive otherwise.
"""

from __future__ import annotations

import numpy as np
import torch

from utils.metrics import IOU_THRESHOLDS, ap_per_class, box_iou, match_predictions

SIZE_BANDS = {"very tiny <8": (0.0, 8.0), "tiny 8-16": (8.0, 16.0), "small 16-32": (16.0, 32.0)}


def box_side(boxes: torch.Tensor) -> torch.Tensor:
    """``(n, 4)`` xyxy pixel boxes -> ``(n,)`` sqrt(area)."""
    return ((boxes[:, 2] - boxes[:, 0]).clamp(0) * (boxes[:, 3] - boxes[:, 1]).clamp(0)).sqrt()


def band_image_stats(pred: torch.Tensor, labels: torch.Tensor, band: tuple[float, float]):
    """One image's ``(correct (k, T), conf (k,), pred_cls (k,), target_cls (m,))`` for one band.

    ``pred`` ``(n, 6)`` [x1, y1, x2, y2, conf, cls] and ``labels`` ``(m, 5)`` [cls, x1, y1, x2, y2]
    in the same pixel space.
    """
    lo, hi = band
    label_side = box_side(labels[:, 1:5])
    inside = (label_side >= lo) & (label_side < hi)
    in_band, out_band = labels[inside], labels[~inside]
    correct = match_predictions(pred, in_band, IOU_THRESHOLDS)
    keep = np.ones(len(pred), dtype=bool)
    if len(pred):
        side = box_side(pred[:, :4]).cpu().numpy()
        own_outside = (side < lo) | (side >= hi)
        near_outside = np.zeros(len(pred), dtype=bool)
        if len(out_band):
            iou = box_iou(pred[:, :4].float(), out_band[:, 1:5].float()).cpu().numpy()
            same = pred[:, 5:6].cpu().numpy() == out_band[:, 0].cpu().numpy()[None]
            near_outside = (np.where(same, iou, 0.0) >= 0.5).any(1)
        keep = correct[:, 0] | ~(own_outside | near_outside)
    return (correct[keep], pred[keep, 4].cpu().numpy(), pred[keep, 5].cpu().numpy(),
            in_band[:, 0].cpu().numpy())


def band_ap(stats: list) -> tuple[float, float, int]:
    """``(AP50, AP50-95, number of labels)`` from a list of :func:`band_image_stats` results."""
    correct, conf, pred_cls, target_cls = (np.concatenate(x, 0) for x in zip(*stats))
    if not len(target_cls):
        return float("nan"), float("nan"), 0
    if not len(conf):
        return 0.0, 0.0, len(target_cls)
    *_, ap, _ = ap_per_class(correct, conf, pred_cls, target_cls)
    return float(ap[:, 0].mean()), float(ap.mean()), len(target_cls)
