"""Hyperparameters this project adds to YOLOv5's set: their defaults, their checks, and NWD's constant C.

A hyp file written before a key existed still works: the missing key takes the value that reproduces
the behaviour from before the key existed (``min_box_px`` 2, the YOLOv5 rule it replaced; the rest
off). The shipped data/hyps/*.yaml files state every key explicitly, so their values, not these
fall-backs, are the project's defaults.
"""

import math

import numpy as np

from utils.errors import UserError
from utils.files import yaml_save
from utils.logging import LOGGER

# key: (value when the hyp file lacks it, lowest allowed, highest allowed, integer 0/1 switch)
EXTRA_HYP = {
    "min_box_px": (2.0, 0.0, math.inf, False),  # augmentation keeps boxes wider and taller than this (px)
    "nwd": (0.0, 0.0, 1.0, False),  # weight of 1 - NWD in the box loss; 1 - CIoU gets 1 - nwd
    "nwd_assign": (0, 0, 1, True),  # 1: tiny targets take anchors by NWD instead of the w/h ratio rule
    "nwd_c": (0.0, 0.0, math.inf, False),  # NWD constant C (px at --imgsz); 0: the training set's mean size
    "copy_paste_small": (0.0, 0.0, 1.0, False),  # probability of pasting copies of a sample's small objects
    "obj_balance_by_stride": (0, 0, 1, True),  # 1: objectness weight per level from its stride (utils/loss.py)
}


def with_extra_hyp(hyp: dict, source: str) -> dict:
    """``hyp`` with every :data:`EXTRA_HYP` key present (missing ones at their fall-back) and checked.

    ``source`` names where the values came from (e.g. ``--hyp data/hyps/x.yaml``) for the error line.
    """
    out = dict(hyp)
    for key, (default, lo, hi, switch) in EXTRA_HYP.items():
        value = out.setdefault(key, default)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not is_number or not lo <= value <= hi or (switch and value not in (0, 1)):
            allowed = "0 or 1" if switch else f"a number in [{lo}, {hi}]"
            raise UserError(f"{source}: {key}={value!r} must be {allowed}; see data/hyps/hyp.scratch-low.yaml")
    return out


def nwd_in_use(hyp: dict) -> bool:
    """Whether the NWD loss or the NWD assignment is switched on."""
    return hyp.get("nwd", 0) > 0 or hyp.get("nwd_assign", 0) == 1


def mean_object_size(labels: list, shapes: np.ndarray, img_size: int, scale=None) -> float:
    """Mean ``sqrt(w * h)`` of all objects, in pixels once each image's long side is ``img_size``.

    ``labels``: per image (n, 5) ``[cls, x, y, w, h]`` normalised; ``shapes``: (images, 2) ``(w, h)``
    in pixels; ``scale``: optional (images, 1) extra factor per image (training tiles show objects
    larger, utils/dataset/tiles.py ``box_scale``). Returns nan when there are no objects.
    """
    sizes = []
    extra = np.ones(len(labels)) if scale is None else np.asarray(scale, dtype=np.float64).reshape(-1)
    for lb, (w0, h0), k in zip(labels, np.asarray(shapes, dtype=np.float64), extra):
        gain = img_size / max(w0, h0) * k  # k = 1.0 leaves the gain bit-identical
        sizes.append(np.sqrt(lb[:, 3] * w0 * lb[:, 4] * h0) * gain)
    sizes = np.concatenate(sizes) if sizes else np.zeros(0)
    return float(sizes.mean()) if len(sizes) else math.nan


def resolve_nwd_constant(hyp: dict, labels: list, shapes: np.ndarray, img_size: int, record=None, scale=None) -> dict:
    """``hyp`` with ``nwd_c`` set from the training set's mean object size when NWD is on and ``nwd_c`` is 0.

    A positive ``nwd_c`` (given by the user, or recorded by an earlier run) is kept as it is. A new value
    is rounded to 4 decimals and, when ``record`` is a path (the run's hyp.yaml), written there with
    the rest of ``hyp``; the checkpoints carry it too, so a resumed run keeps it.
    """
    if not nwd_in_use(hyp) or hyp.get("nwd_c", 0) > 0:
        return dict(hyp)
    size = mean_object_size(labels, shapes, img_size, scale)
    if not size > 0:
        raise UserError("nwd/nwd_assign need the training set's mean object size for the constant C, but the "
                        "training labels have no objects; set nwd_c (pixels at --imgsz) in the --hyp YAML")
    on_tiles = "" if scale is None else ", on the training tiles"
    LOGGER.info(f"NWD constant C = {size:.4g} px (mean object size of the training set at {img_size} px{on_tiles})")
    resolved = {**hyp, "nwd_c": round(size, 4)}
    if record:
        yaml_save(record, resolved)
    return resolved
