"""YOLOv5's training loss: CIoU box loss, IoU-targeted objectness BCE and class BCE.

Targets go to the anchors whose width/height ratio to the box is below ``anchor_t`` in every
level, and to the box centre's grid cell plus the two neighbouring cells nearest the centre
(which triples the positives and lets the (-0.5, 1.5) xy offset reach them).

Two options for tiny objects (hyps, off by default, see docs/small-objects.md):
``nwd`` blends NWD into the box loss, ``(1 - nwd) * (1 - CIoU) + nwd * (1 - NWD)``; ``nwd_assign``
gives each tiny target (``sqrt(w * h) <`` :data:`NWD_TINY_PX` input pixels) the anchors whose shape is
NWD-close to it (NWD >= :data:`NWD_ASSIGN_THR`) plus its NWD-closest anchor over all levels,
instead of the ratio rule, which leaves a 3-px box without any anchor of 10 px or more. NWD's constant
C is ``nwd_c`` (pixels); per level it is C / stride, the boxes there being in grid cells.
"""

import torch
from torch import nn

from utils.errors import UserError
from utils.extra_hyps import nwd_in_use, with_extra_hyp
from utils.metrics import bbox_iou, bbox_nwd

REQUIRED_HYP = ("box", "obj", "cls", "cls_pw", "obj_pw", "anchor_t", "fl_gamma")
LEVEL_BALANCE = {3: [4.0, 1.0, 0.4]}  # YOLOv5's objectness weight by level position, small strides first
DEFAULT_BALANCE = [4.0, 1.0, 0.25, 0.06, 0.02]
STRIDE_32_BALANCE = 0.4  # YOLOv5's tuned weight for its stride-32 level (the 4x rule would give 0.25)
NEIGHBOUR_OFFSETS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32) * 0.5
NWD_TINY_PX = 8.0  # nwd_assign's "tiny": sqrt(w * h) below this in input pixels (AI-TOD's very tiny band)
NWD_ASSIGN_THR = 0.5  # nwd_assign: a tiny target takes every anchor shape with NWD at least this


def objectness_balance(strides, by_stride: bool = True) -> list[float]:
    """Objectness loss weight per detection level.

    The objectness loss is a mean over every (anchor, cell) slot of a level, so one positive's pull
    shrinks with the level's slot count, 4x per halving of the stride. YOLOv5's weights 4.0 / 1.0 /
    0.4 for strides 8 / 16 / 32 undo most of that, but YOLOv5 picks them by level position, so a
    stride-4 level gets stride 8's 4.0 and each of its positives pulls 4x less than in yolov5n
    (docs/research/). ``by_stride`` (hyp ``obj_balance_by_stride: 1``) gives every level
    ``4.0 * (8 / s) ** 2`` (0.4 at stride 32): 16.0 at stride 4, YOLOv5's values at strides 8-32.
    ``by_stride=False`` is YOLOv5's (and the FFCA-YOLO authors') list by position.
    """
    if not by_stride:
        return list(LEVEL_BALANCE.get(len(strides), DEFAULT_BALANCE))[:len(strides)]
    return [STRIDE_32_BALANCE if s == 32 else 4.0 * (8.0 / s) ** 2 for s in strides]


def smooth_BCE(eps=0.1):  # noqa: N802 (YOLOv5's name)
    """Positive and negative BCE targets with label smoothing ``eps``: (1 - eps / 2, eps / 2)."""
    return 1.0 - 0.5 * eps, 0.5 * eps


class FocalLoss(nn.Module):
    """Focal loss around a ``BCEWithLogitsLoss``: down-weights easy examples by (1 - p_t) ** gamma."""

    def __init__(self, loss_fcn, gamma=1.5, alpha=0.25):
        super().__init__()
        self.loss_fcn = loss_fcn
        self.gamma = gamma
        self.alpha = alpha
        self.reduction = loss_fcn.reduction
        self.loss_fcn.reduction = "none"  # the focal factor applies per element

    def forward(self, pred, true):
        loss = self.loss_fcn(pred, true)
        prob = torch.sigmoid(pred)
        p_t = true * prob + (1 - true) * (1 - prob)
        alpha_factor = true * self.alpha + (1 - true) * (1 - self.alpha)
        loss = loss * alpha_factor * (1.0 - p_t) ** self.gamma
        if self.reduction == "mean":
            return loss.mean()
        return loss.sum() if self.reduction == "sum" else loss


def scale_loss_gains(hyp: dict, nl: int, nc: int, imgsz: int) -> dict:
    """YOLOv5's loss-gain scaling by number of detection layers, classes and image size."""
    hyp = dict(hyp)
    hyp["box"] *= 3 / nl
    hyp["cls"] *= nc / 80 * 3 / nl
    hyp["obj"] *= (imgsz / 640) ** 2 * 3 / nl
    return hyp


def _detect_head(model):
    core = model.module if hasattr(model, "module") else model  # DDP wraps the model
    return core, core.model[-1]


class ComputeLoss:
    """``loss(preds, targets) -> (total * batch_size (1,), (box, obj, cls) detached (3,))``.

    ``preds``: training-mode output, ``nl`` tensors (bs, na, ny, nx, 5 + nc) of logits.
    ``targets``: (n, 6) [image_index, cls, x, y, w, h], xywh normalised to the input image.
    ``hyp``: the hyperparameters (gains as given: the caller scales them for level count, classes and size).
    """

    def __init__(self, model, hyp: dict, autobalance=False):
        core, detect = _detect_head(model)
        if not isinstance(hyp, dict):
            raise UserError("ComputeLoss: no hyperparameters given; pass those of a hyperparameter YAML such as "
                            "data/hyps/hyp.scratch-low.yaml")
        missing = [k for k in REQUIRED_HYP if k not in hyp]
        if missing:
            raise UserError(f"hyperparameters are missing {missing}; add them to the --hyp YAML "
                            "(see data/hyps/hyp.scratch-low.yaml)")
        device = next(core.parameters()).device
        self.hyp = hyp
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([float(hyp["cls_pw"])], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([float(hyp["obj_pw"])], device=device))
        if hyp["fl_gamma"] > 0:
            self.bce_cls = FocalLoss(self.bce_cls, hyp["fl_gamma"])
            self.bce_obj = FocalLoss(self.bce_obj, hyp["fl_gamma"])
        self.cp, self.cn = smooth_BCE(hyp.get("label_smoothing", 0.0))
        extra = with_extra_hyp(hyp, "ComputeLoss hyperparameters")
        self.balance = objectness_balance(detect.stride.tolist(), bool(extra["obj_balance_by_stride"]))
        self.ssi = detect.stride.tolist().index(16) if autobalance and 16 in detect.stride.tolist() else 0
        self.autobalance = autobalance
        self.gr = 1.0  # objectness target = IoU ** gr mix; 1.0 means the IoU itself
        self.na, self.nc, self.nl = detect.na, detect.nc, detect.nl
        self.anchors = detect.anchors  # (nl, na, 2) in stride units = grid cells
        self.device = device
        self._init_nwd(extra, detect.stride.tolist())

    def _init_nwd(self, hyp: dict, strides: list) -> None:
        """NWD settings from the (completed) hyp: blend weight, assignment switch, C in pixels."""
        if nwd_in_use(hyp) and not hyp["nwd_c"] > 0:
            raise UserError(f"nwd={hyp['nwd']}, nwd_assign={hyp['nwd_assign']} need the constant nwd_c > 0 "
                            "(train.py sets it from the training set); set nwd_c in the hyperparameters")
        self.nwd, self.nwd_assign, self.nwd_c = float(hyp["nwd"]), bool(hyp["nwd_assign"]), float(hyp["nwd_c"])
        self.strides = [float(s) for s in strides]

    def __call__(self, preds, targets):
        targets = targets.to(self.device)
        tcls, tbox, indices, anchors = self.build_targets(preds, targets)
        lbox = torch.zeros(1, device=self.device)
        lobj = torch.zeros(1, device=self.device)
        lcls = torch.zeros(1, device=self.device)
        for i, pi in enumerate(preds):
            b, a, gj, gi = indices[i]
            tobj = torch.zeros(pi.shape[:4], dtype=pi.dtype, device=self.device)
            if len(b):
                pxy, pwh, _, pcls = pi[b, a, gj, gi].split((2, 2, 1, self.nc), 1)
                pbox = torch.cat((pxy.sigmoid() * 2 - 0.5, (pwh.sigmoid() * 2) ** 2 * anchors[i]), 1)
                iou = bbox_iou(pbox, tbox[i], CIoU=True).squeeze(1)
                lbox += self._box_loss(pbox, tbox[i], iou, i)
                target_iou = iou.detach().clamp(0).to(tobj.dtype)
                if self.gr < 1:
                    target_iou = (1.0 - self.gr) + self.gr * target_iou
                _scatter_max(tobj, (b, a, gj, gi), target_iou)
                if self.nc > 1:
                    t = torch.full_like(pcls, self.cn)
                    t[torch.arange(len(b), device=self.device), tcls[i]] = self.cp
                    lcls += self.bce_cls(pcls, t)
            level_obj = self.bce_obj(pi[..., 4], tobj)
            lobj += level_obj * self.balance[i]
            if self.autobalance:
                self.balance[i] = self.balance[i] * 0.9999 + 0.0001 / level_obj.detach().item()
        if self.autobalance:
            self.balance = [x / self.balance[self.ssi] for x in self.balance]
        lbox *= self.hyp["box"]
        lobj *= self.hyp["obj"]
        lcls *= self.hyp["cls"]
        bs = preds[0].shape[0]
        return (lbox + lobj + lcls) * bs, torch.cat((lbox, lobj, lcls)).detach()

    def _box_loss(self, pbox, tbox, iou, level: int):
        """Mean box loss of one level: 1 - CIoU, blended with 1 - NWD when ``nwd`` > 0 (boxes (m, 4) in cells)."""
        if self.nwd == 0:
            return (1.0 - iou).mean()
        nwd = bbox_nwd(pbox, tbox, self.nwd_c / self.strides[level])
        return ((1.0 - self.nwd) * (1.0 - iou) + self.nwd * (1.0 - nwd)).mean()

    def _tiny_target_anchors(self, preds, targets):
        """nwd_assign: which targets are tiny (nt,) and which anchors they take, (nl, na, nt) bool.

        Shapes are compared in input pixels with both boxes centred alike, as the ratio rule compares
        them; every tiny target keeps its NWD-closest anchor of all levels, so none is left without one.
        """
        strides = torch.tensor(self.strides, device=self.device, dtype=targets.dtype)
        ny, nx = preds[0].shape[2:4]
        gt_wh = targets[:, 4:6] * torch.stack((nx * strides[0], ny * strides[0]))  # (nt, 2) pixels
        tiny = gt_wh.prod(1).sqrt() < NWD_TINY_PX
        anchor_wh = self.anchors.to(targets.dtype) * strides[:, None, None]  # (nl, na, 2) pixels
        gt_box = torch.cat((torch.zeros_like(gt_wh), gt_wh), 1)
        anchor_box = torch.cat((torch.zeros_like(anchor_wh), anchor_wh), 2)
        nwd = bbox_nwd(anchor_box[:, :, None], gt_box[None, None], self.nwd_c)  # (nl, na, nt)
        closest = nwd == nwd.flatten(0, 1).amax(0)  # ties (anchors of equal shape) all count as closest
        return tiny, (nwd >= NWD_ASSIGN_THR) | closest

    def build_targets(self, preds, targets):
        """Assign targets to (image, anchor, cell) slots in every level, all targets at once.

        Returns per level: classes (m,), boxes (m, 4) [dx, dy, w, h] in grid units relative to the
        cell corner, indices (image, anchor, gy, gx) each (m,), and matched anchors (m, 2).
        """
        nt = targets.shape[0]
        anchor_idx = torch.arange(self.na, device=self.device).float().view(self.na, 1).repeat(1, nt)
        # (na, nt, 7) = [image, cls, x, y, w, h, anchor]: every target paired with every anchor
        paired = torch.cat((targets.repeat(self.na, 1, 1), anchor_idx[..., None]), 2)
        offsets_table = NEIGHBOUR_OFFSETS.to(self.device)
        tiny, tiny_keep = self._tiny_target_anchors(preds, targets) if self.nwd_assign and nt else (None, None)
        tcls, tbox, indices, anch = [], [], [], []
        for i in range(self.nl):
            ny, nx = preds[i].shape[2:4]
            scale = torch.tensor([1, 1, nx, ny, nx, ny, 1], device=self.device, dtype=paired.dtype)
            t = paired * scale  # xywh in grid cells
            anchors = self.anchors[i]
            if nt:
                match = _anchor_ratio_match(t, anchors, self.hyp["anchor_t"])
                if tiny is not None:
                    match = torch.where(tiny, tiny_keep[i], match)
                t, offsets = _select_cells(t[match], (nx, ny), offsets_table)
            else:
                t, offsets = paired[0], torch.zeros((0, 2), device=self.device)
            image_cls, gxy, gwh, a = t.split((2, 2, 2, 1), 1)
            a, (b, c) = a.long().view(-1), image_cls.long().T
            gij = (gxy - offsets).long()
            gi = gij[:, 0].clamp_(0, nx - 1)
            gj = gij[:, 1].clamp_(0, ny - 1)
            indices.append((b, a, gj, gi))
            tbox.append(torch.cat((gxy - torch.stack((gi, gj), 1), gwh), 1))
            anch.append(anchors[a])
            tcls.append(c)
        return tcls, tbox, indices, anch


def _anchor_ratio_match(t, anchors, anchor_t):
    """(target, anchor) pairs with max(w/a, a/w, h/a, a/h) < ``anchor_t``: ``t`` (na, nt, 7) -> (na, nt) bool."""
    ratio = t[..., 4:6] / anchors[:, None]
    return torch.max(ratio, 1 / ratio).max(2)[0] < anchor_t


def _select_cells(t, grid_size, offsets_table):
    """Each kept pair in its centre cell plus the two neighbour cells nearest the centre.

    ``t`` (m, 7) in grid units -> ((k, 7), offsets (k, 2))."""
    gxy = t[:, 2:4]
    gxy_inverse = torch.tensor(grid_size, device=t.device, dtype=t.dtype) - gxy
    left, top = ((gxy % 1 < 0.5) & (gxy > 1)).T
    right, bottom = ((gxy_inverse % 1 < 0.5) & (gxy_inverse > 1)).T
    chosen = torch.stack((torch.ones_like(left), left, top, right, bottom))  # (5, m)
    t = t.repeat((5, 1, 1))[chosen]
    offsets = (torch.zeros_like(gxy)[None] + offsets_table[:, None])[chosen]
    return t, offsets


def _scatter_max(tobj, index, values):
    """``tobj[index] = values`` keeping the largest value where a slot is assigned more than once.

    Plain index assignment with repeated slots keeps an unspecified one (it differs between
    runs on GPU); taking the maximum makes the objectness target reproducible.
    """
    flat = tobj.view(-1)
    b, a, gj, gi = index
    _, na, ny, nx = tobj.shape
    slot = ((b * na + a) * ny + gj) * nx + gi
    flat.scatter_reduce_(0, slot, values, reduce="amax", include_self=True)
