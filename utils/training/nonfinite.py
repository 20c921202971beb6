"""The guard against a non-finite loss: decided on every rank at once, before the backward.

A NaN or infinite loss (a learning rate too high, a bad label, fp16 overflow) would otherwise be
back-propagated, stepped into the weights and the EMA, and saved in every later checkpoint. The
batch's forward pass has already updated BatchNorm's running statistics by then, so they are put
back from a copy taken before the forward: the model is left exactly as it was before the batch.
"""

import torch
import torch.nn as nn

from utils.ddp import DistInfo, max_over_ranks

NAN_POLICIES = ("stop", "skip")


def any_rank_nonfinite(loss: torch.Tensor, dist: DistInfo) -> bool:
    """True on every rank when the loss is NaN or infinite on any rank (one small all-reduce under DDP)."""
    local = not bool(torch.isfinite(loss.detach()).all())
    return bool(max_over_ranks([local], dist)[0])


class BufferSnapshot:
    """A copy of the BatchNorm buffers that a training forward pass updates, to put back after a bad batch."""

    def __init__(self, model: nn.Module):
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.live = [b for m in norms for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                     if b is not None]
        self.saved = [b.clone() for b in self.live]

    def take(self) -> None:
        if self.live:
            torch._foreach_copy_(self.saved, self.live)

    def restore(self) -> None:
        if self.live:
            torch._foreach_copy_(self.live, self.saved)


def nonfinite_message(epoch: int, batch: int, loss_items, amp: bool, skipping: bool) -> str:
    """One line: where the loss stopped being finite, its terms, and the likely causes."""
    box, obj, cls = (float(v) for v in loss_items)
    causes = "a learning rate too high (lr0 in --hyp), a label with a box of zero or negative size"
    causes += ", fp16 overflow (AMP: try --device cpu to compare)" if amp else ""
    action = "skipped (--nan-policy skip)" if skipping else "not back-propagated or stepped"
    return (f"non-finite loss at epoch {epoch} batch {batch} (box {box:.4g}, obj {obj:.4g}, cls {cls:.4g}): "
            f"{action}; likely causes: {causes}")
