"""Sliced (tiled) inference for small objects in large images.

An image is cut into overlapping ``size`` x ``size`` tiles; the last tile of a row or column is
shifted back inside the image instead of being padded. Tiles run through the model in batches at
their own resolution, their boxes are mapped back to the image, one optional full-image pass at
``--imgsz`` adds the large objects, and everything is merged per class with torchvision's NMS
(IoU) or greedy non-maximum merging (NMM: intersection over the smaller box, merged boxes become
their union, SAHI's rule).

A box cut by an inner tile edge is dropped when the overlap guarantees that the neighbouring tile
sees the same object whole (it lies within the shared band), so a cut object is not counted twice.
Everything is ordered explicitly: the same image and model give the same detections.
"""

import argparse

import cv2
import numpy as np
import torch

from utils.augmentations import letterbox
from utils.batch_invariance import aligned_batch_size, batch_invariant, eval_micro_batch
from utils.errors import UserError
from utils.logging import LOGGER
from utils.ops import clip_boxes, non_max_suppression
from utils.torchvision_ops import batched_nms

MERGE_MODES = ("nms", "nmm")
NMM_THRESHOLD = 0.5  # intersection over the smaller box at which NMM merges two boxes
NMM_CONF_FLOOR = 0.1  # --conf-thres below this: NMM would chain many weak boxes into a few giant ones; NMS runs
EDGE_TOLERANCE = 2.0  # pixels: a box this close to an inner tile edge counts as cut by it


def add_slice_arguments(parser: argparse.ArgumentParser, batch_default=16) -> None:
    """The sliced-inference flags shared by detect.py and val.py."""
    parser.add_argument("--slice", dest="slice_size", type=int, default=0, metavar="SIZE",
                        help="sliced inference: tile size in pixels (0 = off)")
    parser.add_argument("--slice-overlap", type=float, default=0.2, help="overlap of neighbouring tiles (0-0.9)")
    parser.add_argument("--no-full-pass", action="store_true", help="sliced inference without the full-image pass")
    parser.add_argument("--slice-merge", default="nms", choices=MERGE_MODES,
                        help="merge tile boxes by class-aware NMS (IoU) or NMM (intersection over smaller box); "
                             f"NMM needs --conf-thres {NMM_CONF_FLOOR} or more, below it NMS runs with a warning")
    parser.add_argument("--slice-batch", type=int, default=batch_default,
                        help="tiles per batch, rounded up to whole forward passes (2 tiles on CPU, 8 on CUDA)")


def check_slice_options(slice_size, overlap, batch, stride):
    """Validate the slicing flags; returns the tile size rounded up to a multiple of ``stride``."""
    if slice_size < 0:
        raise UserError(f"--slice {slice_size}: give a tile size in pixels, or 0 for no slicing")
    if not 0 <= overlap <= 0.9:
        raise UserError(f"--slice-overlap {overlap}: must be between 0.0 and 0.9")
    if batch < 1:
        raise UserError(f"--slice-batch {batch}: must be a positive integer")
    rounded = -(-slice_size // stride) * stride
    if rounded != slice_size:
        LOGGER.warning(f"--slice {slice_size} must be a multiple of max stride {stride}, updating to {rounded}")
    return rounded


def tile_starts(length, tile, step):
    """Start offsets along one axis: every ``step``, the last one shifted so the tile ends at ``length``."""
    if length <= tile:
        return [0]
    return sorted(set(range(0, length - tile, step)) | {length - tile})


def tile_grid(height, width, size, overlap):
    """Tiles (k, 4) int64 xyxy covering a ``height`` x ``width`` image, row-major.

    Tiles are ``size`` square (or the whole side when the image is smaller); neighbours overlap by
    at least ``overlap`` * ``size`` pixels.
    """
    th, tw = min(size, height), min(size, width)
    step = max(1, int(round(size * (1 - overlap))))
    ys, xs = tile_starts(height, th, step), tile_starts(width, tw, step)
    return np.array([(x, y, x + tw, y + th) for y in ys for x in xs], dtype=np.int64).reshape(-1, 4)


def shared_band_filter(boxes, tile, tiles, tol=EDGE_TOLERANCE):
    """Keep-mask (n,) for ``boxes`` (n, 4) xyxy in image pixels found in ``tile`` (x1, y1, x2, y2).

    A box touching an inner edge of the tile is dropped when it lies inside the band that the
    neighbouring tile shares: that neighbour sees the object whole. The rule is asymmetric by
    ``tol`` so that at most one of two neighbours drops a given box.
    """
    x1, y1, x2, y2 = (int(v) for v in tile)
    keep = torch.ones(len(boxes), dtype=torch.bool)
    for axis, lo, hi in ((0, x1, x2), (1, y1, y2)):
        same_line = tiles[:, 1 - axis] == (y1 if axis == 0 else x1)
        starts, ends = tiles[same_line, axis], tiles[same_line, axis + 2]
        b_lo, b_hi = boxes[:, axis], boxes[:, axis + 2]
        before, after = ends[starts < lo], starts[starts > lo]
        if len(before):  # a neighbour on the low side shares [lo, its end]
            keep &= ~((b_lo <= lo + tol) & (b_hi <= float(before.max()) - tol))
        if len(after):  # a neighbour on the high side shares [its start, hi]
            keep &= ~((b_hi >= hi - tol) & (b_lo >= float(after.min()) + tol))
    return keep


def box_ios(a, b):
    """Intersection over the smaller box (N, M) for xyxy ``a`` (N, 4) and ``b`` (M, 4)."""
    lt, rb = torch.max(a[:, None, :2], b[None, :, :2]), torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(0).prod(2)
    area_a, area_b = (a[:, 2:] - a[:, :2]).prod(1), (b[:, 2:] - b[:, :2]).prod(1)
    return inter / torch.min(area_a[:, None], area_b[None]).clamp(min=1e-9)


def greedy_nmm(det, threshold=NMM_THRESHOLD, agnostic=False):
    """Greedy non-maximum merging of (n, 6) [x1, y1, x2, y2, conf, cls] detections.

    In descending confidence, each remaining box absorbs every remaining box of its class whose
    intersection over the smaller box exceeds ``threshold``: the kept box becomes their union and
    keeps its confidence. Returns (k, 6), highest confidence first.
    """
    if not len(det):
        return det
    det = det[torch.sort(det[:, 4], descending=True, stable=True).indices]
    ios = box_ios(det[:, :4], det[:, :4])
    same = torch.ones_like(ios, dtype=torch.bool) if agnostic else det[:, 5:6] == det[:, 5:6].T
    candidates = ((ios > threshold) & same).cpu().numpy()
    free = np.ones(len(det), dtype=bool)
    merged = []
    for i in range(len(det)):
        if not free[i]:
            continue
        group = np.flatnonzero(candidates[i] & free)  # includes i itself
        free[group] = False
        box = det[i].clone()
        members = det[torch.from_numpy(group).to(det.device)]
        box[:2], box[2:4] = members[:, :2].min(0).values, members[:, 2:4].max(0).values
        merged.append(box)
    return torch.stack(merged)


def merge_detections(det, mode, iou_thres, agnostic=False):
    """Merge (n, 6) detections from tiles and the full pass; returns (k, 6), highest confidence first."""
    if mode == "nmm":
        return greedy_nmm(det, agnostic=agnostic)
    det = det[torch.sort(det[:, 4], descending=True, stable=True).indices]
    groups = torch.zeros_like(det[:, 5]) if agnostic else det[:, 5]
    return det[batched_nms(det[:, :4].float(), det[:, 4].float(), groups.long(), iou_thres)]


def from_letterbox(det, gain, pad, offset=(0, 0)):
    """(n, 6) detections in a letterboxed crop -> float32 CPU copy in image pixels (not clipped).

    ``gain`` and ``pad`` (w, h) come from letterbox; ``offset`` (x, y) is the crop's top-left corner.
    """
    det = det.detach().float().cpu().clone()
    det[:, [0, 2]] = (det[:, [0, 2]] - pad[0]) / gain + offset[0]
    det[:, [1, 3]] = (det[:, [1, 3]] - pad[1]) / gain + offset[1]
    return det


def to_letterbox(boxes, ratio_pad):
    """Map (n, 4) xyxy boxes from the original image into a letterboxed one (inverse of scale_boxes)."""
    gain, (padw, padh) = ratio_pad[0][0], ratio_pad[1]
    boxes = boxes.clone()
    boxes[:, :4] *= gain
    boxes[:, [0, 2]] += padw
    boxes[:, [1, 3]] += padh
    return boxes


class SlicedPredictor:
    """Sliced inference on BGR images with any detector function.

    ``detect_fn(x)`` takes a float batch (b, 3, h, w) RGB in [0, 1] and returns b tensors (n, 6)
    [x1, y1, x2, y2, conf, cls] in that batch's pixels (model + NMS). Calling the predictor on a
    (H, W, 3) uint8 BGR image returns its merged (k, 6) detections in image pixels.
    """

    def __init__(self, detect_fn, slice_size, overlap=0.2, full_pass_size=640, merge="nms", iou_thres=0.45,
                 max_det=1000, batch_size=16, stride=32, device="cpu", half=False, agnostic=False):
        self.detect_fn, self.size, self.overlap = detect_fn, int(slice_size), float(overlap)
        self.full_pass_size, self.merge, self.iou_thres = full_pass_size, merge, iou_thres
        self.max_det, self.batch_size, self.stride = max_det, batch_size, stride
        self.device, self.half, self.agnostic = torch.device(device), half, agnostic
        self.tiles_seen = 0

    def _to_tensor(self, images):
        """List of (h, w, 3) BGR uint8 -> (b, 3, h, w) RGB float on the device, scaled to [0, 1]."""
        x = torch.from_numpy(np.ascontiguousarray(np.stack(images)[..., ::-1].transpose(0, 3, 1, 2)))
        x = x.to(self.device)
        return (x.half() if self.half else x.float()) / 255

    def _tile_detections(self, im0, tiles):
        """Detections (n, 6) of every tile, in image pixels, cut-object duplicates dropped."""
        out = []
        for first in range(0, len(tiles), self.batch_size):
            chunk = tiles[first:first + self.batch_size]
            boxed = [letterbox(im0[y1:y2, x1:x2], self.size, auto=False, scaleup=False) for x1, y1, x2, y2 in chunk]
            preds = self.detect_fn(self._to_tensor([b[0] for b in boxed]))
            for (x1, y1, x2, y2), (_, ratio, pad), det in zip(chunk, boxed, preds):
                det = from_letterbox(det, ratio[0], pad, (x1, y1))
                out.append(det[shared_band_filter(det[:, :4], (x1, y1, x2, y2), tiles)])
        self.tiles_seen += len(tiles)
        return out

    def _full_pass(self, im0):
        """Detections (n, 6) of one letterboxed pass over the whole image, in image pixels."""
        im, ratio, pad = letterbox(im0, self.full_pass_size, stride=self.stride, auto=True)
        return from_letterbox(self.detect_fn(self._to_tensor([im]))[0], ratio[0], pad)

    def __call__(self, im0):
        """Merged detections (k, 6) [x1, y1, x2, y2, conf, cls] for BGR ``im0`` (H, W, 3), image pixels."""
        tiles = tile_grid(im0.shape[0], im0.shape[1], self.size, self.overlap)
        parts = self._tile_detections(im0, tiles)
        if self.full_pass_size:
            parts.append(self._full_pass(im0))
        det = merge_detections(torch.cat(parts, 0), self.merge, self.iou_thres, self.agnostic)[:self.max_det]
        clip_boxes(det[:, :4], im0.shape[:2])  # only now: clipping to a tile would distort overlaps at its edges
        return det

    def predict_file(self, path):
        """Detections for the image file ``path`` (read as BGR, as the data loader does)."""
        im0 = cv2.imread(str(path))
        if im0 is None:
            raise UserError(f"{path}: cannot read this image for sliced inference")
        return self(im0)


def nms_detect_fn(forward, conf_thres, iou_thres, max_det, classes=None, agnostic=False, multi_label=False):
    """A ``detect_fn`` for :class:`SlicedPredictor`: ``forward(x)`` (the model) followed by YOLOv5's NMS."""
    def detect(x):
        return non_max_suppression(forward(x), conf_thres, iou_thres, classes, agnostic, multi_label=multi_label,
                                   max_det=max_det)
    return detect


def sliced_predictor(forward, slice_size, slice_overlap=0.2, no_full_pass=False, slice_merge="nms", slice_batch=16,
                     conf_thres=0.25, iou_thres=0.45, max_det=1000, imgsz=640, stride=32, device="cpu", half=False,
                     classes=None, agnostic=False, multi_label=False):
    """A SlicedPredictor built from the command-line values (flags of :func:`add_slice_arguments`), or
    None when ``slice_size`` is 0. ``forward(x)`` runs the model, at a fixed number of tiles per pass whatever
    ``slice_batch`` is (utils/batch_invariance.py), so a tile's detections do not depend on its batch;
    ``slice_batch`` is rounded up to whole passes, so each pass holds the same tiles at any ``slice_batch``.
    ``imgsz`` is the full-pass size.

    ``slice_merge='nmm'`` with ``conf_thres`` below :data:`NMM_CONF_FLOOR` (val.py's default 0.001)
    merges by NMS instead, with one warning: greedy merging of thousands of weak boxes makes a few
    giant boxes (mAP near 0) and is slow.
    """
    size = check_slice_options(slice_size, slice_overlap, slice_batch, stride)
    if not size:
        return None
    if slice_merge not in MERGE_MODES:  # argparse's choices, for val.run and detect.run
        raise UserError(f"--slice-merge {slice_merge!r}: choose from {', '.join(MERGE_MODES)}")
    if slice_merge == "nmm" and conf_thres < NMM_CONF_FLOOR:
        LOGGER.warning(f"--slice-merge nmm with --conf-thres {conf_thres} (below {NMM_CONF_FLOOR}) would merge "
                       f"weak boxes into giant ones; merging by NMS instead (use --conf-thres {NMM_CONF_FLOOR} "
                       "or more for NMM)")
        slice_merge = "nms"
    detect_fn = nms_detect_fn(batch_invariant(forward, device), conf_thres, iou_thres, max_det, classes, agnostic,
                              multi_label)
    full_pass = 0 if no_full_pass else int(max(np.atleast_1d(imgsz)))
    return SlicedPredictor(detect_fn, size, slice_overlap, full_pass, slice_merge, iou_thres, max_det,
                           aligned_batch_size(slice_batch, eval_micro_batch(device)), stride, device, half, agnostic)
