"""Tiny 4-class shapes models and the checkpoints the val, detect, export and API tests load."""

import torch

from models.yolo import Model
from utils.training.checkpoints import save_checkpoint

NAMES = ["circle", "square", "triangle", "cross"]


def confident_model(cfg):
    """Tiny 4-class model that always detects something: on the coarsest level only (so NMS gets a
    few dozen candidates, not every anchor) objectness is raised, and anchor k favours class k."""
    torch.manual_seed(0)
    model = Model(cfg, nc=len(NAMES))
    detect_head = model.model[-1]
    with torch.no_grad():
        bias = detect_head.m[-1].bias.view(detect_head.na, -1)
        bias[:, 4] += 6.0
        for k in range(detect_head.na):
            bias[k, 5 + k] += 6.0
    return model.eval()


def write_checkpoint(net, path, **overrides):
    """``net`` saved as a trained checkpoint (fp16 weights, epoch 3), with ``overrides`` replacing keys."""
    ckpt = {"model_cfg": net.yaml, "nc": len(NAMES), "names": NAMES,
            "model": {k: v.half() if v.is_floating_point() else v for k, v in net.state_dict().items()},
            "ema": None, "epoch": 3, "best_fitness": 0.0}
    ckpt.update(overrides)
    save_checkpoint(ckpt, path)
    return path


def write_tiny_checkpoint(cfg, path, seed=0):
    """A tiny-model checkpoint with 4 classes whose detection head predicts many boxes (so mAP is not 0)."""
    torch.manual_seed(seed)
    model = Model(cfg, nc=len(NAMES))
    with torch.no_grad():
        for conv in model.model[-1].m:
            conv.bias.view(model.model[-1].na, -1)[:, 4] += 8.0  # objectness up: boxes everywhere
    save_checkpoint({"model_cfg": model.yaml, "nc": len(NAMES), "names": NAMES, "model": model.state_dict(),
                     "ema": None}, path)
    return path
