"""Learning-rate schedules: YOLOv5's linear and cosine one-cycle decay, and warmup."""

import math

import numpy as np


def one_cycle(y1: float = 0.0, y2: float = 1.0, steps: int = 100):
    """Cosine ramp from ``y1`` to ``y2`` over ``steps``: returns ``f(x)`` for x in [0, steps]."""
    return lambda x: ((1 - math.cos(x * math.pi / steps)) / 2) * (y2 - y1) + y1


def linear_decay(lrf: float, epochs: int):
    """Linear ramp of the LR factor from 1 at epoch 0 to ``lrf`` at the last epoch."""
    return lambda x: (1 - x / epochs) * (1.0 - lrf) + lrf


def lr_lambda(lrf: float, epochs: int, cosine: bool):
    """The per-epoch LR factor YOLOv5 uses (``--cos-lr`` picks the cosine one-cycle)."""
    return one_cycle(1, lrf, epochs) if cosine else linear_decay(lrf, epochs)


def apply_warmup(optimizer, ni: int, n_warmup: int, epoch: int, lr_factor, hyp: dict, accumulate_nbs: float):
    """Set LR and momentum of each param group for warmup iteration ``ni`` (< ``n_warmup``).

    The bias group (index 0, see smart_optimizer) falls from ``warmup_bias_lr`` to its scheduled LR; the others rise
    from 0. Momentum rises from ``warmup_momentum`` to ``momentum``. Returns the accumulation
    count to use at this iteration (it grows from 1 to nominal_batch / batch_size).
    """
    xi = [0, n_warmup]
    accumulate = max(1, int(np.interp(ni, xi, [1, accumulate_nbs]).round()))
    for j, group in enumerate(optimizer.param_groups):
        start = hyp["warmup_bias_lr"] if j == 0 else 0.0
        group["lr"] = float(np.interp(ni, xi, [start, group["initial_lr"] * lr_factor(epoch)]))
        if "momentum" in group:
            group["momentum"] = float(np.interp(ni, xi, [hyp["warmup_momentum"], hyp["momentum"]]))
    return accumulate
