"""AP and AR by object size: COCO bands (small / medium / large) and AI-TOD bands (very tiny ... medium).

Computed from val.py's own matching (:func:`utils.metrics.match_predictions`) with pycocotools'
area-range rules, so the figures agree with ``COCOeval`` whose ``areaRng`` is set to the same bands:

- sizes are box areas in pixels of the original image; a band ``(lo, hi)`` holds areas with
  ``lo <= area <= hi`` (both ends included, as in pycocotools);
- per IoU threshold, a detection first takes an in-band label; only when none is left does it take
  an out-of-band one, and then it is ignored (neither true nor false positive);
- an unmatched detection whose own area lies outside the band is ignored;
- a class without labels in a band does not count in that band's mean.

Bands are given by box side ``sqrt(area)``: COCO small < 32, medium 32-96, large > 96; AI-TOD very
tiny < 8, tiny 8-16, small 16-32, medium >= 32 px.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from utils.logging import LOGGER
from utils.metrics import IOU_THRESHOLDS, compute_ap, match_predictions

_MAX_AREA = 1e5 ** 2  # pycocotools' upper bound for the open-ended bands


@dataclass(frozen=True)
class SizeBand:
    """One size band: ``key`` for results.csv, ``family`` and ``label`` for the printed table, area bounds."""
    key: str
    family: str
    label: str
    lo: float
    hi: float


COCO_BANDS = (
    SizeBand("small", "COCO", "small <32", 0.0, 32.0 ** 2),
    SizeBand("medium", "COCO", "medium 32-96", 32.0 ** 2, 96.0 ** 2),
    SizeBand("large", "COCO", "large >96", 96.0 ** 2, _MAX_AREA),
)
AITOD_BANDS = (
    SizeBand("very_tiny", "AI-TOD", "very tiny <8", 0.0, 8.0 ** 2),
    SizeBand("tiny", "AI-TOD", "tiny 8-16", 8.0 ** 2, 16.0 ** 2),
    SizeBand("aitod_small", "AI-TOD", "small 16-32", 16.0 ** 2, 32.0 ** 2),
    SizeBand("aitod_medium", "AI-TOD", "medium >=32", 32.0 ** 2, _MAX_AREA),
)
SIZE_BANDS = COCO_BANDS + AITOD_BANDS
RESULT_COLUMNS = tuple(f"metrics/mAP50-95_{b.key}" for b in SIZE_BANDS)  # results.csv, after YOLOv5's columns
TABLE_HEADER = ("%22s" + "%11s" * 4) % ("Size band (px)", "Instances", "mAP50", "mAP50-95", "AR")


def box_areas(boxes):
    """Areas (n,) numpy of xyxy ``boxes`` (n, 4) (tensor or array)."""
    b = boxes.detach().cpu().double().numpy() if isinstance(boxes, torch.Tensor) else np.asarray(boxes, float)
    b = b.reshape(-1, 4)
    return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])


def match_in_band(detections, labels, band, iou_thresholds=IOU_THRESHOLDS):
    """COCO area-range matching of one image for one band.

    ``detections`` (N, 6) [x1, y1, x2, y2, conf, cls] and ``labels`` (M, 5) [cls, x1, y1, x2, y2]
    tensors in original-image pixels. Returns numpy ``(correct (N, T), ignored (N, T), in_band (M,))``.
    """
    label_area, det_area = box_areas(labels[:, 1:5]), box_areas(detections[:, :4])
    in_band = (label_area >= band.lo) & (label_area <= band.hi)
    correct = match_predictions(detections, labels[torch.from_numpy(in_band)], iou_thresholds)
    ignored = np.zeros_like(correct)
    outside = labels[torch.from_numpy(~in_band)]
    if len(outside) and len(detections):
        for t in range(len(iou_thresholds)):
            free = np.flatnonzero(~correct[:, t])
            if len(free):
                ignored[free, t] = match_predictions(detections[torch.from_numpy(free)], outside,
                                                     iou_thresholds[t:t + 1])[:, 0]
    det_outside = (det_area < band.lo) | (det_area > band.hi)
    ignored |= ~correct & det_outside[:, None]
    return correct, ignored, in_band


def band_ap(correct, ignored, conf, pred_cls, target_cls):
    """(mAP50, mAP50-95, AR) of one band over all images; NaN each when the band has no labels.

    ``correct``/``ignored`` (n, T) bool, ``conf``/``pred_cls`` (n,), ``target_cls`` (m,) in-band labels.
    AR is the recall reached with every detection, averaged over IoU thresholds and classes.
    """
    classes, counts = np.unique(target_cls, return_counts=True)
    if not len(classes):
        return math.nan, math.nan, math.nan
    order = np.argsort(-conf, kind="mergesort")
    n_iou = correct.shape[1]
    ap, recall_max = np.zeros((len(classes), n_iou)), np.zeros((len(classes), n_iou))
    for ci, (c, n_labels) in enumerate(zip(classes, counts)):
        of_class = order[pred_cls[order] == c]
        for t in range(n_iou):
            kept = of_class[~ignored[of_class, t]]
            if not len(kept):
                continue
            tp = correct[kept, t]
            tpc, fpc = np.cumsum(tp), np.cumsum(~tp)
            recall = tpc / n_labels
            ap[ci, t] = compute_ap(recall, tpc / (tpc + fpc))[0]
            recall_max[ci, t] = recall[-1]
    return float(ap[:, 0].mean()), float(ap.mean()), float(recall_max.mean())


class SizeBandStats:
    """Collects per-image band matches during validation; :meth:`compute` gives the band metrics."""

    def __init__(self, bands=SIZE_BANDS, iou_thresholds=IOU_THRESHOLDS):
        self.bands, self.iou_thresholds = tuple(bands), iou_thresholds
        self.parts = {b.key: [] for b in self.bands}

    def add(self, detections, labels):
        """One image: ``detections`` (N, 6) xyxy/conf/cls and ``labels`` (M, 5) cls/xyxy, original pixels."""
        detections, labels = detections.detach().float().cpu(), labels.detach().float().cpu()
        conf, pred_cls = detections[:, 4].numpy(), detections[:, 5].numpy()
        for band in self.bands:
            correct, ignored, in_band = match_in_band(detections, labels, band, self.iou_thresholds)
            self.parts[band.key].append((correct, ignored, conf, pred_cls, labels[:, 0].numpy()[in_band]))

    def compute(self):
        """{band key: {"instances", "map50", "map", "ar"}}; the metrics are NaN for a band without labels."""
        n_iou = len(self.iou_thresholds)
        results = {}
        for band in self.bands:
            parts = self.parts[band.key]
            correct, ignored, conf, pred_cls, target_cls = (
                (np.concatenate(x, 0) for x in zip(*parts)) if parts else
                (np.zeros((0, n_iou), bool), np.zeros((0, n_iou), bool), np.zeros(0), np.zeros(0), np.zeros(0)))
            map50, map_, ar = band_ap(correct, ignored, conf, pred_cls, target_cls)
            results[band.key] = {"instances": int(len(target_cls)), "map50": map50, "map": map_, "ar": ar}
        return results


def format_band_table(results, bands=SIZE_BANDS):
    """Lines of the printed band tables (one per family); an empty band shows ``-``, never 0."""
    lines = []
    for family in dict.fromkeys(b.family for b in bands):
        lines.append(f"{family} size bands (box side = sqrt(area), original-image pixels)")
        lines.append(TABLE_HEADER)
        for band in (b for b in bands if b.family == family):
            r = results[band.key]
            if r["instances"] == 0:
                lines.append(("%22s" + "%11s" * 4) % (band.label, "-", "-", "-", "-"))
            else:
                lines.append(("%22s%11i" + "%11.3g" * 3) % (band.label, r["instances"], r["map50"], r["map"],
                                                          r["ar"]))
    return lines


def log_band_table(results):
    """Print the band tables under val.py's usual table."""
    for line in format_band_table(results):
        LOGGER.info(line)


def band_row(results):
    """results.csv values in RESULT_COLUMNS order (NaN for an empty band or when there are no results)."""
    return [math.nan if results is None else results[b.key]["map"] for b in SIZE_BANDS]
