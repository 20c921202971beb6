"""Detection metrics: IoU variants, COCO-style AP, matching, confusion matrix, fitness.

AP follows the COCO evaluator (pycocotools): detections are matched greedily in order of
confidence to the best still-unmatched ground truth of the same class with IoU >= threshold,
and AP is the mean of the precision envelope sampled at the 101 recall points 0, 0.01, ..., 1,
for each IoU threshold 0.50, 0.55, ..., 0.95.

Pure computation: curves come back as data (:class:`APCurves`); drawing them is utils/plots.py's job.
"""

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0, 1, 101)


class ValMetrics(NamedTuple):
    """The 7 figures of one validation that results.csv, fitness and evolve read; all 0 when not validated."""

    precision: float = 0.0  # mean over classes
    recall: float = 0.0
    map50: float = 0.0
    map50_95: float = 0.0
    box_loss: float = 0.0  # validation losses, mean per batch
    obj_loss: float = 0.0
    cls_loss: float = 0.0


def fitness(x):
    """Model fitness (n,) = 0.1 * mAP50 + 0.9 * mAP50-95 from rows (n, >=4) [P, R, mAP50, mAP50-95, ...]."""
    weights = np.array([0.0, 0.0, 0.1, 0.9])
    return (np.asarray(x)[:, :4] * weights).sum(1)


def box_iou(box1, box2, eps=1e-7):
    """Pairwise IoU (N, M) of xyxy tensors ``box1`` (N, 4) and ``box2`` (M, 4)."""
    (a1, a2), (b1, b2) = box1.unsqueeze(1).chunk(2, 2), box2.unsqueeze(0).chunk(2, 2)
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(0).prod(2)
    return inter / ((a2 - a1).prod(2) + (b2 - b1).prod(2) - inter + eps)


def bbox_iou(box1, box2, xywh=True, GIoU=False, DIoU=False, CIoU=False, eps=1e-7):
    """Element-wise IoU (n, 1) of boxes (n, 4) or (1, 4) against (n, 4), optionally G/D/C-IoU.

    ``xywh`` says whether the boxes are centre/size (True) or corners (False).
    """
    if xywh:
        (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.chunk(4, -1), box2.chunk(4, -1)
        b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1 / 2, x1 + w1 / 2, y1 - h1 / 2, y1 + h1 / 2
        b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2 / 2, x2 + w2 / 2, y2 - h2 / 2, y2 + h2 / 2
    else:
        b1_x1, b1_y1, b1_x2, b1_y2 = box1.chunk(4, -1)
        b2_x1, b2_y1, b2_x2, b2_y2 = box2.chunk(4, -1)
        w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(eps)
        w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(eps)

    inter = (b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0) * \
            (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if not (GIoU or DIoU or CIoU):
        return iou

    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)  # width of the smallest enclosing box
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    if GIoU:
        c_area = cw * ch + eps
        return iou - (c_area - union) / c_area
    c2 = cw ** 2 + ch ** 2 + eps  # squared diagonal of the enclosing box
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    if DIoU:
        return iou - rho2 / c2
    v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def bbox_nwd(box1, box2, constant, eps=1e-12):
    """Normalized Wasserstein distance (Wang et al., arXiv 2110.13389) of xywh boxes (..., 4), broadcast -> (...).

    Each box is the Gaussian N((x, y), diag(w^2 / 4, h^2 / 4)); the squared 2-Wasserstein distance of two
    is (x1 - x2)^2 + (y1 - y2)^2 + ((w1 - w2)^2 + (h1 - h2)^2) / 4, and NWD = exp(-sqrt(W2^2) / constant)
    with ``constant`` in the boxes' units. Unlike IoU it stays informative for tiny boxes that do not
    overlap. Computed in float32 (or the inputs' wider float) so autocast cannot underflow ``eps``,
    which keeps the gradient finite for identical boxes.
    """
    dtype = torch.promote_types(torch.promote_types(box1.dtype, box2.dtype), torch.float32)
    x1, y1, w1, h1 = box1.to(dtype).unbind(-1)
    x2, y2, w2, h2 = box2.to(dtype).unbind(-1)
    wasserstein_sq = (x1 - x2) ** 2 + (y1 - y2) ** 2 + ((w1 - w2) ** 2 + (h1 - h2) ** 2) / 4
    return torch.exp(-torch.sqrt(wasserstein_sq + eps) / constant)


def match_predictions(detections, labels, iou_thresholds=IOU_THRESHOLDS):
    """Mark each detection correct or not at each IoU threshold, COCO's way.

    ``detections`` (N, 6) [x1, y1, x2, y2, conf, cls], ``labels`` (M, 5) [cls, x1, y1, x2, y2]
    (tensors, same pixel space). Returns a bool numpy array (N, T) in the detections' order.
    Per threshold, detections in descending confidence take the highest-IoU unmatched label
    of their class whose IoU is >= the threshold.
    """
    n, t = len(detections), len(iou_thresholds)
    correct = np.zeros((n, t), dtype=bool)
    if n == 0 or len(labels) == 0:
        return correct
    iou = box_iou(labels[:, 1:].float(), detections[:, :4].float()).T.cpu().numpy()  # (N, M)
    same_class = (detections[:, 5:6].cpu().numpy() == labels[:, 0].cpu().numpy()[None])
    iou = np.where(same_class, iou, 0.0)
    order = np.argsort(-detections[:, 4].cpu().numpy(), kind="mergesort")
    # only detections overlapping some label enough can be correct; the rest stay False
    order = order[iou[order].max(1) >= iou_thresholds.min() - 1e-9]
    taken = np.zeros((t, len(labels)), dtype=bool)
    thresholds = iou_thresholds[:, None] - 1e-9  # tolerate float rounding at exactly the threshold
    for d in order:
        candidate_iou = np.where((iou[d][None] >= thresholds) & ~taken, iou[d][None], -1.0)  # (T, M)
        best = candidate_iou.argmax(1)
        hit = candidate_iou[np.arange(t), best] >= 0
        taken[np.arange(t)[hit], best[hit]] = True
        correct[d] = hit
    return correct


def smooth(y, fraction=0.05):
    """Box-filter ``y`` (n,) over ``fraction`` of its length (odd window), edges padded."""
    nf = round(len(y) * fraction * 2) // 2 + 1
    padded = np.concatenate((np.full(nf // 2, y[0]), y, np.full(nf // 2, y[-1])))
    return np.convolve(padded, np.ones(nf) / nf, mode="valid")


def compute_ap(recall, precision):
    """COCO AP from cumulative ``recall`` and ``precision`` (n,) of one class at one IoU threshold.

    Returns (ap, precision sampled at the 101 recall points (101,)).
    """
    envelope = np.flip(np.maximum.accumulate(np.flip(precision)))
    idx = np.searchsorted(recall, RECALL_POINTS, side="left")
    sampled = np.where(idx < len(recall), envelope[np.minimum(idx, len(recall) - 1)], 0.0)
    return float(sampled.mean()), sampled


@dataclass
class APCurves:
    """The per-class curves behind :func:`ap_per_class`, for plotting.

    ``confidence`` (1000,) is the x axis of ``precision``, ``recall`` and ``f1`` (nc, 1000);
    ``recall_points`` (101,) the x axis of ``pr`` (nc, 101) at IoU 0.5; ``ap`` (nc, T); ``names``
    one label per class with labels.
    """

    confidence: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    recall_points: np.ndarray = field(default_factory=lambda: RECALL_POINTS)
    pr: list = field(default_factory=list)
    ap: np.ndarray = field(default_factory=lambda: np.zeros((0, len(IOU_THRESHOLDS))))
    names: list = field(default_factory=list)


def ap_per_class(tp, conf, pred_cls, target_cls, names=(), eps=1e-16):
    """Per-class AP over all images.

    ``tp`` (n, T) bool from :func:`match_predictions`, ``conf`` (n,), ``pred_cls`` (n,) for every
    detection; ``target_cls`` (m,) for every label. Returns ``tp, fp, p, r, f1`` (nc,) at the
    confidence of maximum mean F1, ``ap`` (nc, T), the class ids (nc,) that have labels, and the
    :class:`APCurves` (``names`` labels them) for ``utils.plots.plot_ap_curves``.
    """
    tp, conf, pred_cls, target_cls = (np.asarray(a) for a in (tp, conf, pred_cls, target_cls))
    order = np.argsort(-conf, kind="mergesort")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, label_counts = np.unique(target_cls, return_counts=True)
    nc, n_iou = len(classes), tp.shape[1]

    px = np.linspace(0, 1, 1000)  # confidence axis for the P, R, F1 curves
    ap, p, r = np.zeros((nc, n_iou)), np.zeros((nc, 1000)), np.zeros((nc, 1000))
    pr_curves = []
    for ci, c in enumerate(classes):
        i = pred_cls == c
        if not i.any():
            pr_curves.append(np.zeros_like(RECALL_POINTS))
            continue
        tpc = tp[i].cumsum(0)
        fpc = (1 - tp[i]).cumsum(0)
        recall = tpc / (label_counts[ci] + eps)
        precision = tpc / (tpc + fpc)
        r[ci] = np.interp(-px, -conf[i], recall[:, 0], left=0)  # conf decreases, so negate to interpolate
        p[ci] = np.interp(-px, -conf[i], precision[:, 0], left=1)
        for j in range(n_iou):
            ap[ci, j], sampled = compute_ap(recall[:, j], precision[:, j])
            if j == 0:
                pr_curves.append(sampled)

    f1 = 2 * p * r / (p + r + eps)
    curves = APCurves(px, p, r, f1, RECALL_POINTS, pr_curves, ap, _names_for(classes, names))
    best = smooth(f1.mean(0), 0.1).argmax() if nc else 0
    p, r, f1 = p[:, best], r[:, best], f1[:, best]
    tp_at_best = (r * label_counts).round()
    fp_at_best = (tp_at_best / (p + eps) - tp_at_best).round()
    return tp_at_best, fp_at_best, p, r, f1, ap, classes.astype(int), curves


def _names_for(classes, names):
    """Class names for the ids in ``classes``; ``names`` is a list or {id: name} dict."""
    lookup = dict(enumerate(names)) if isinstance(names, (list, tuple)) else dict(names)
    return [lookup.get(int(c), str(int(c))) for c in classes]


class ConfusionMatrix:
    """(nc + 1, nc + 1) counts; rows = predicted class, columns = true class, last = background."""

    def __init__(self, nc, conf=0.25, iou_thres=0.45):
        self.matrix = np.zeros((nc + 1, nc + 1))
        self.nc = nc
        self.conf = conf
        self.iou_thres = iou_thres

    def process_batch(self, detections, labels):
        """Add one image: ``detections`` (N, 6) [x1, y1, x2, y2, conf, cls] or None, ``labels`` (M, 5) [cls, xyxy]."""
        true_cls = labels[:, 0].long().cpu().numpy()
        if detections is None or not len(detections):
            np.add.at(self.matrix, (self.nc, true_cls), 1)
            return
        detections = detections[detections[:, 4] > self.conf]
        pred_cls = detections[:, 5].long().cpu().numpy()
        if not len(labels):
            np.add.at(self.matrix, (pred_cls, self.nc), 1)
            return
        label_idx, det_idx = _one_to_one_matches(box_iou(labels[:, 1:], detections[:, :4]), self.iou_thres)
        np.add.at(self.matrix, (pred_cls[det_idx], true_cls[label_idx]), 1)
        missed = np.setdiff1d(np.arange(len(labels)), label_idx)
        spurious = np.setdiff1d(np.arange(len(detections)), det_idx)
        np.add.at(self.matrix, (self.nc, true_cls[missed]), 1)
        np.add.at(self.matrix, (pred_cls[spurious], self.nc), 1)

    def tp_fp(self):
        """True and false positives per class (nc,), background excluded."""
        tp = self.matrix.diagonal()
        fp = self.matrix.sum(1) - tp
        return tp[:-1], fp[:-1]


def _one_to_one_matches(iou, threshold):
    """Pairs (label_idx, det_idx) from an IoU matrix (M, N), highest IoU first, each index used once."""
    rows, cols = torch.where(iou > threshold)
    if not len(rows):
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    values = iou[rows, cols].cpu().numpy()
    rows, cols = rows.cpu().numpy(), cols.cpu().numpy()
    order = np.argsort(-values, kind="mergesort")
    rows, cols = rows[order], cols[order]
    _, first_det = np.unique(cols, return_index=True)
    keep = np.sort(first_det)
    rows, cols = rows[keep], cols[keep]
    _, first_label = np.unique(rows, return_index=True)
    keep = np.sort(first_label)
    return rows[keep], cols[keep]
