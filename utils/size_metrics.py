"""AP and AR by object size: COCO bands (small / medium / large) and AI-TOD bands (very tiny ... medium).

Computed with val.py's matching rule (:func:`utils.metrics.match_predictions`) and pycocotools'
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
from utils.metrics import IOU_THRESHOLDS, RECALL_POINTS, box_iou, compute_ap

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


def match_bands(detections, labels, bands=SIZE_BANDS, iou_thresholds=IOU_THRESHOLDS):
    """COCO area-range matching of one image for several bands at once.

    ``detections`` (N, 6) [x1, y1, x2, y2, conf, cls] and ``labels`` (M, 5) [cls, x1, y1, x2, y2]
    tensors in original-image pixels. val.py's rule (:func:`utils.metrics.match_predictions`: in
    descending confidence, the highest-IoU unmatched label of the class with IoU >= threshold),
    except that in-band labels are tried first. Returns numpy ``(correct (B, N, T), ignored (B, N, T),
    in_band (B, M))``.
    """
    n, m, t = len(detections), len(labels), len(iou_thresholds)
    label_area, det_area = box_areas(labels[:, 1:5]), box_areas(detections[:, :4])
    lo, hi = np.array([b.lo for b in bands])[:, None], np.array([b.hi for b in bands])[:, None]
    in_band = (label_area[None] >= lo) & (label_area[None] <= hi)  # (B, M)
    correct, ignored = np.zeros((len(bands), n, t), bool), np.zeros((len(bands), n, t), bool)
    if n and m:
        iou = box_iou(labels[:, 1:5].float(), detections[:, :4].float()).T.cpu().numpy()  # (N, M)
        iou = np.where(detections[:, 5:6].cpu().numpy() == labels[:, 0].cpu().numpy()[None], iou, 0.0)
        order = np.argsort(-detections[:, 4].cpu().numpy(), kind="mergesort")
        order = order[iou[order].max(1) >= iou_thresholds.min() - 1e-9]
        taken = np.zeros((len(bands), t, m), bool)
        above = iou[:, None, :] >= iou_thresholds[None, :, None] - 1e-9  # (N, T, M)
        rows, cols = np.arange(len(bands))[:, None], np.arange(t)[None]
        for d in order:
            free = above[d][None] & ~taken  # (B, T, M)
            for result, allowed in ((correct, in_band), (ignored, ~in_band)):
                candidate = np.where(free & allowed[:, None], iou[d][None, None], -1.0)
                best = candidate.argmax(2)
                hit = np.take_along_axis(candidate, best[..., None], 2)[..., 0] >= 0  # (B, T)
                hit &= ~correct[:, d]  # out-of-band labels only for detections without an in-band match
                taken[rows, cols, best] |= hit
                result[:, d] = hit
    det_outside = (det_area[None] < lo) | (det_area[None] > hi)  # (B, N)
    ignored |= ~correct & det_outside[..., None]
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
            ap[ci, t], _, recall_max[ci, t] = _class_ap(correct[:, t], ignored[:, t], of_class, n_labels)
    return float(ap[:, 0].mean()), float(ap.mean()), float(recall_max.mean())


def _class_ap(correct, ignored, of_class, n_labels: int):
    """(AP, precision at the 101 recall points (101,), final recall) of one class at one IoU threshold.

    ``correct``/``ignored`` (n,) bool of every detection; ``of_class`` the class's detection indices in
    descending confidence; ``n_labels`` its in-band labels.
    """
    kept = of_class[~ignored[of_class]]
    if not len(kept):
        return 0.0, np.zeros(len(RECALL_POINTS)), 0.0
    tp = correct[kept]
    tpc, fpc = np.cumsum(tp), np.cumsum(~tp)
    recall = tpc / n_labels
    ap, sampled = compute_ap(recall, tpc / (tpc + fpc))
    return ap, sampled, float(recall[-1])


def band_pr_curve(correct, ignored, conf, pred_cls, target_cls):
    """Precision (101,) at the recall points ``RECALL_POINTS`` at IoU 0.5, the mean over the band's classes
    (its mean is the band's mAP50); None when the band has no labels. Arguments as :func:`band_ap`."""
    classes, counts = np.unique(target_cls, return_counts=True)
    if not len(classes):
        return None
    order = np.argsort(-conf, kind="mergesort")
    curves = [_class_ap(correct[:, 0], ignored[:, 0], order[pred_cls[order] == c], n)[1]
              for c, n in zip(classes, counts)]
    return np.mean(curves, 0)


class SizeBandStats:
    """Collects per-image band matches during validation; :meth:`compute` gives the band metrics."""

    def __init__(self, bands=SIZE_BANDS, iou_thresholds=IOU_THRESHOLDS):
        self.bands, self.iou_thresholds = tuple(bands), iou_thresholds
        self.parts = {b.key: [] for b in self.bands}

    def add(self, detections, labels):
        """One image: ``detections`` (N, 6) xyxy/conf/cls and ``labels`` (M, 5) cls/xyxy, original pixels."""
        detections, labels = detections.detach().float().cpu(), labels.detach().float().cpu()
        conf, pred_cls = detections[:, 4].numpy(), detections[:, 5].numpy()
        correct, ignored, in_band = match_bands(detections, labels, self.bands, self.iou_thresholds)
        for i, band in enumerate(self.bands):
            self.parts[band.key].append((correct[i], ignored[i], conf, pred_cls, labels[:, 0].numpy()[in_band[i]]))

    def _arrays(self, band):
        """(correct, ignored, conf, pred_cls, target_cls) of one band over all images added."""
        parts, n_iou = self.parts[band.key], len(self.iou_thresholds)
        if not parts:
            return np.zeros((0, n_iou), bool), np.zeros((0, n_iou), bool), np.zeros(0), np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(x, 0) for x in zip(*parts))

    def compute(self):
        """{band key: {"instances", "map50", "map", "ar"}}; the metrics are NaN for a band without labels."""
        results = {}
        for band in self.bands:
            arrays = self._arrays(band)
            map50, map_, ar = band_ap(*arrays)
            results[band.key] = {"instances": int(len(arrays[4])), "map50": map50, "map": map_, "ar": ar}
        return results

    def pr_curves(self):
        """{band key: precision (101,) over ``RECALL_POINTS`` at IoU 0.5, or None for a band without labels}."""
        return {band.key: band_pr_curve(*self._arrays(band)) for band in self.bands}


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
