"""train.py with a fault injected through its callbacks, for the GPU proof's kill-and-resume row.

    python -m benchmarks.gpu_proof.fault_train --kill-after-batch N [--proof-modules] TRAIN_FLAGS...

Every batch of epoch 0 writes last.pt (the save interval is made tiny), and the process SIGKILLs
itself right after the write that follows batch N: a point fixed by the run's own progress, not by
when a watcher looks. ``--proof-modules`` registers the proof's blocks (benchmarks/gpu_proof/modules.py)
first. Product code has no switch for this: the fault is a user's callback like any other.
"""

import argparse
import importlib
import os
import signal

from utils.callbacks import Callbacks
from utils.errors import exit_on_user_error

EVERY_BATCH_MINUTES = "1e-9"  # --save-interval: shorter than any step, so every batch of the epoch is saved


def kill_after_batch(batch: int) -> Callbacks:
    """Callbacks that SIGKILL the process at the first last.pt write after ``batch`` batches of epoch 0."""
    seen = {"batches": 0}

    def count(model, ni, imgs, targets, paths, mloss):
        seen["batches"] = ni + 1

    def kill(last, epoch, final_epoch, best_fitness, fi):
        if epoch == 0 and seen["batches"] >= batch:
            os.kill(os.getpid(), signal.SIGKILL)

    callbacks = Callbacks()
    callbacks.register_action("on_train_batch_end", "count batches", count)
    callbacks.register_action("on_model_save", "SIGKILL", kill)
    return callbacks


@exit_on_user_error
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_proof.fault_train", description=__doc__)
    parser.add_argument("--kill-after-batch", type=int, required=True, metavar="N")
    parser.add_argument("--proof-modules", action="store_true", help="register the proof's blocks first")
    opt, train_flags = parser.parse_known_args(argv)
    if opt.kill_after_batch < 1:
        parser.error(f"--kill-after-batch {opt.kill_after_batch}: must be at least 1")
    if opt.proof_modules:
        importlib.import_module("benchmarks.gpu_proof.modules")
    train = importlib.import_module("train")
    train_opt = train.parse_opt([*train_flags, "--save-interval", EVERY_BATCH_MINUTES])
    train.main(train_opt, callbacks=kill_after_batch(opt.kill_after_batch))


if __name__ == "__main__":
    main()
