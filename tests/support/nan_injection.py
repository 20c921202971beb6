"""A NaN loss, gradient or weight injected at a chosen batch through train.py's callbacks (tests/test_callbacks.py).

    python tests/support/nan_injection.py BATCH train.py-arguments...        # also under torchrun
    python tests/support/nan_injection.py BATCH@RANK train.py-arguments...   # under torchrun
    python tests/support/nan_injection.py stop@BATCH train.py-arguments...   # under torchrun

``BATCH``: at the end of global batch ``BATCH - 1`` a callback hangs a one-shot forward hook on the Detect
layer, so batch ``BATCH``'s predictions, and with them its loss, are NaN; the weights are not touched.
Callbacks run on the main process only, so under DDP the NaN appears on rank 0 alone. ``BATCH@RANK``:
the loss of global batch ``BATCH`` is NaN on rank ``RANK`` alone (the loop's forward is wrapped there).
``stop@BATCH``: a YOLOv5-style callback sets ``stop_training`` at the end of global batch ``BATCH``.
"""

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.callbacks import Callbacks  # noqa: E402
from utils.torch_utils import de_parallel  # noqa: E402


def nan_at_batch(batch: int, before: dict | None = None) -> Callbacks:
    """Callbacks that make global batch ``batch`` (>= 1) give NaN predictions; ``before`` receives a copy of
    the model's weights as they were before that batch (key 'model')."""

    def arm(model, ni, imgs, targets, paths, mloss):
        if ni + 1 != batch:
            return
        detect = de_parallel(model).model[-1]
        if before is not None:
            before["model"] = {k: v.detach().clone() for k, v in de_parallel(model).state_dict().items()}

        def poison(module, inputs, output):
            handle.remove()
            return [torch.full_like(x, math.nan) for x in output]

        handle = detect.register_forward_hook(poison)

    callbacks = Callbacks()
    callbacks.register_action("on_train_batch_end", "NaN at the next batch", arm)
    return callbacks


def nan_in_micro_batch(batch: int, micro: int) -> Callbacks:
    """Callbacks that make micro-batch ``micro`` (its forward pass in the step, from 0) of global batch ``batch``
    give NaN predictions, the step's other micro-batches finite ones (``--micro-batch``, one process)."""

    def arm(model, ni, imgs, targets, paths, mloss):
        if ni + 1 != batch:
            return
        calls = []

        def poison(module, inputs, output):
            calls.append(1)
            if len(calls) <= micro:
                return output
            handle.remove()
            return [torch.full_like(x, math.nan) for x in output]

        handle = de_parallel(model).model[-1].register_forward_hook(poison)

    callbacks = Callbacks()
    callbacks.register_action("on_train_batch_end", "NaN in one micro-batch", arm)
    return callbacks


def inf_gradient_at_batch(batch: int, before: dict) -> Callbacks:
    """Callbacks that make one gradient of global batch ``batch`` infinite (the loss stays finite); ``before``
    receives the weights and EMA as they were before that batch (keys 'model', 'ema')."""

    def arm(model, ni, imgs, targets, paths, mloss):
        if ni + 1 != batch:
            return
        weight = de_parallel(model).model[-1].m[0].weight
        before["model"] = {k: v.detach().clone() for k, v in de_parallel(model).state_dict().items()}

        def overflow(grad):
            handle.remove()
            return grad * math.inf

        handle = weight.register_hook(overflow)

    callbacks = Callbacks()
    callbacks.register_action("on_train_batch_end", "infinite gradient at the next batch", arm)
    return callbacks


def nan_weight_after_batch(batch: int) -> Callbacks:
    """Callbacks that write a NaN into one weight of the model at the end of global batch ``batch``."""

    def poison(model, ni, imgs, targets, paths, mloss):
        if ni == batch:
            with torch.no_grad():
                de_parallel(model).model[-1].m[0].weight[0, 0, 0, 0] = math.nan

    callbacks = Callbacks()
    callbacks.register_action("on_train_batch_end", "NaN weight", poison)
    return callbacks


def nan_loss_on_rank(batch: int, rank: int) -> None:
    """Make global batch ``batch``'s loss NaN on rank ``rank`` only, by wrapping the training loop's forward."""
    from utils.training.loop import TrainLoop

    forward_loss = TrainLoop.forward_loss

    def poisoned(self, imgs, targets, epoch, i):
        loss, items = forward_loss(self, imgs, targets, epoch, i)
        if self.dist.rank == rank and epoch * self.nb + i == batch:
            return loss * math.nan, items * math.nan
        return loss, items

    TrainLoop.forward_loss = poisoned


def stop_at_batch(batch: int) -> Callbacks:
    """A YOLOv5-style callback that sets ``stop_training`` at the end of global batch ``batch``."""
    callbacks = Callbacks()

    def enough(model, ni, imgs, targets, paths, mloss):
        if ni == batch:
            callbacks.stop_training = True

    callbacks.register_action("on_train_batch_end", "enough", enough)
    return callbacks


def callbacks_for(spec: str) -> Callbacks | None:
    if spec.startswith("stop@"):
        return stop_at_batch(int(spec[len("stop@"):]))
    if "@" in spec:
        batch, rank = spec.split("@")
        nan_loss_on_rank(int(batch), int(rank))
        return None
    return nan_at_batch(int(spec))


if __name__ == "__main__":
    import train
    from utils.errors import exit_on_user_error

    exit_on_user_error(lambda: train.main(train.parse_opt(sys.argv[2:]), callbacks=callbacks_for(sys.argv[1])))()
