"""A NaN loss injected at a chosen batch through train.py's callbacks (tests/test_callbacks.py).

    python tests/support/nan_injection.py BATCH train.py-arguments...   # also under torchrun

At the end of global batch ``BATCH - 1`` a callback hangs a one-shot forward hook on the Detect layer,
so batch ``BATCH``'s predictions, and with them its loss, are NaN; the weights are not touched.
Callbacks run on the main process only, so under DDP the NaN appears on rank 0 alone.
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


if __name__ == "__main__":
    import train
    from utils.errors import exit_on_user_error

    exit_on_user_error(lambda: train.main(train.parse_opt(sys.argv[2:]), callbacks=nan_at_batch(int(sys.argv[1]))))()
