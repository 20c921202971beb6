"""Loading trained weights for inference: single models, ensembles, test-time augmentation."""

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from models.yolo import Model, unregistered_blocks
from utils.training.checkpoints import inference_weights, load_checkpoint
from utils.errors import UserError
from utils.logging import LOGGER
from utils.user_modules import changed_files, missing_blocks_message, recorded_files

TTA_SCALES = (1.0, 0.83, 0.67)
TTA_FLIPS = (None, 3, None)  # 3 = flip left-right (the width axis of NCHW)


class Ensemble(nn.ModuleList):
    """Several models whose eval-mode predictions are concatenated before NMS."""

    def forward(self, x, augment=False):
        """``x`` (bs, 3, h, w) float -> ``(pred (bs, N1 + N2 + ..., no), None)``."""
        preds = [tta_forward(m, x)[0] if augment else m(x)[0] for m in self]
        return torch.cat(preds, 1), None


def check_fit(model, state, path):
    """One-line UserError (naming ``path``) when ``state`` does not fit ``model``'s parameters and buffers."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
                  if k in state and state[k].shape != v.shape]
    if missing or unexpected or mismatched:
        parts = [f"{label} {items[:3]}{' ...' if len(items) > 3 else ''}"
                 for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched))
                 if items]
        raise UserError(f"{path}: weights do not fit the stored model architecture ({'; '.join(parts)}); "
                        "the checkpoint is damaged or was edited")


def check_blocks_registered(ckpt: dict, cfg: dict, source) -> None:
    """One-line UserError naming the ``--modules`` file(s) to pass when ``cfg`` (the checkpoint ``ckpt``'s
    model YAML) uses blocks that are not registered in this process; a warning for a file that changed."""
    missing = unregistered_blocks(cfg) if isinstance(cfg, dict) else []
    if missing:
        raise UserError(missing_blocks_message(str(source), missing, recorded_files(ckpt)))
    for line in changed_files(ckpt):
        LOGGER.warning(f"{source}: {line}")


def stored_model(ckpt: dict, state: dict, path):
    """The model described by checkpoint ``ckpt``'s ``model_cfg`` with ``state`` loaded (fp32 as stored);
    a YAML that cannot be built, or weights that do not fit it, is a one-line UserError naming ``path``."""
    cfg = ckpt["model_cfg"]
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: checkpoint key 'model_cfg' should be the model YAML dict, got {type(cfg).__name__}")
    check_blocks_registered(ckpt, cfg, path)
    try:
        model = Model(cfg, nc=ckpt.get("nc"))
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise UserError(f"{path}: cannot build the model stored in the checkpoint ({type(e).__name__}: {e})") from None
    check_fit(model, state, path)
    model.load_state_dict(state)
    return model


def load_one(path, fuse=True):
    """Rebuild the model stored in checkpoint ``path`` (EMA weights when present) as an fp32 eval model."""
    ckpt = load_checkpoint(path, map_location="cpu")
    model = stored_model(ckpt, inference_weights(ckpt, path), path)
    names = ckpt.get("names") or [f"class{i}" for i in range(model.model[-1].nc)]
    model.names = list(names.values()) if isinstance(names, dict) else list(names)
    model.float().eval()
    if fuse:
        _fuse(model)
    return model


def _fuse(model):
    """Fold BatchNorm into convolutions, through the model's own ``fuse`` when it has one."""
    if callable(getattr(model, "fuse", None)):
        model.fuse()
        return
    for module in model.modules():
        if module is not model and callable(getattr(module, "fuse", None)):
            module.fuse()


def weight_paths(weights) -> list:
    """``--weights`` as a list of paths: one path, or a non-empty list or tuple of them (an ensemble); anything
    else (None, a number) is one UserError line rather than a TypeError deep inside loading."""
    paths = [weights] if isinstance(weights, (str, Path)) else weights
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, Path)) for p in paths):
        raise UserError(f"--weights {weights!r}: no weights file given; pass a checkpoint such as "
                        "runs/train/exp/weights/best.pt")
    return list(paths)


def attempt_load(weights, device=None, fuse=True):
    """Load one checkpoint path, or a list of paths as an :class:`Ensemble`, onto ``device`` in eval mode.

    Missing files, files that are not checkpoints and weights that do not fit the stored
    architecture each raise a one-line UserError.
    """
    paths = weight_paths(weights)
    models = [load_one(p, fuse).to(device or "cpu") for p in paths]
    if len(models) == 1:
        return models[0]
    ensemble = Ensemble(models)
    counts = {m.model[-1].nc for m in models}
    if len(counts) > 1:
        raise UserError(f"--weights {[str(p) for p in paths]}: ensemble members have different class counts "
                        f"{sorted(counts)}; ensemble only models trained on the same classes")
    ensemble.names = models[0].names
    ensemble.nc = models[0].model[-1].nc
    ensemble.stride = max((m.stride for m in models), key=lambda s: float(s.max()))
    return ensemble


def scaled_size(h, w, ratio):
    """(h, w) of an image resized by ``ratio`` (whole pixels, as :func:`scale_img` makes it)."""
    return int(h * ratio), int(w * ratio)


def scale_img(img, ratio=1.0, gs=32):
    """Resize (bs, 3, h, w) by ``ratio`` and pad right/bottom up to a multiple of ``gs`` with ImageNet grey."""
    if ratio == 1.0:
        return img
    size = scaled_size(*img.shape[2:], ratio)
    img = F.interpolate(img, size=size, mode="bilinear", align_corners=False)
    ph, pw = (math.ceil(x / gs) * gs - x for x in size)
    return F.pad(img, [0, pw, 0, ph], value=0.447)


def eval_forward(model, augment: bool):
    """``x (bs, 3, h, w) -> (pred (bs, N, no), raw or None)``: the model's eval output, with test-time
    augmentation when ``augment``."""
    def forward(im):
        return tta_forward(model, im) if augment else model(im)

    return forward


def tta_forward(model, im):
    """Test-time augmentation: predictions (bs, N, no) at scales 1, 0.83, 0.67 (the 0.83 pass flipped
    left-right), mapped back to ``im``'s pixel frame and concatenated -> ``(pred, None)``."""
    h, w = im.shape[2:]
    gs = int(model.stride.max())
    outputs = []
    for scale, flip in zip(TTA_SCALES, TTA_FLIPS):
        pred = model(scale_img(im.flip(flip) if flip else im, scale, gs))[0].clone()
        sh, sw = scaled_size(h, w, scale)  # whole-pixel sizes: the true gains differ slightly from ``scale``
        pred[..., :4] /= torch.tensor([sw / w, sh / h, sw / w, sh / h], device=pred.device, dtype=pred.dtype)
        if flip == 3:
            pred[..., 0] = w - pred[..., 0]
        outputs.append(pred)
    return torch.cat(outputs, 1), None
