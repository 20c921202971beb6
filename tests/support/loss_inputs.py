"""A tiny two-level model YAML, loss hyperparameters and a fixed batch for the loss tests (64 px)."""

import torch

TINY_CFG = {
    "nc": 2, "depth_multiple": 0.33, "width_multiple": 0.125,
    "anchors": [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119]],
    "backbone": [[-1, 1, "Conv", [32, 3, 2]], [-1, 1, "Conv", [64, 3, 2]], [-1, 1, "C3", [64]],
                 [-1, 1, "Conv", [128, 3, 2]], [-1, 1, "C3", [128]], [-1, 1, "Conv", [128, 3, 2]],
                 [-1, 1, "SPPF", [128, 5]]],
    "head": [[[4, 6], 1, "Detect", ["nc", "anchors"]]],
}
HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0}


def sample_targets():
    """Three boxes on two images, (3, 6) ``[image, cls, x, y, w, h]``."""
    # normalised; sizes near the anchors of both levels
    return torch.tensor([[0, 0, 0.30, 0.30, 0.20, 0.25],
                         [0, 1, 0.70, 0.60, 0.50, 0.40],
                         [1, 1, 0.50, 0.50, 0.15, 0.15]])


def sample_images():
    """A fixed random batch, (2, 3, 64, 64) in [0, 1)."""
    g = torch.Generator().manual_seed(1)
    return torch.rand((2, 3, 64, 64), generator=g)
