"""Everything a training run needs to continue bit-exactly: capture, restore, save, strip.

A training state is plain data (see utils/checkpoints.py). It is captured only at batch
boundaries; gradients accumulated towards the next optimizer step are stored too, so a
checkpoint written mid-accumulation (end of an epoch, an interrupt, a mid-epoch save)
resumes exactly.
"""

import time
from copy import deepcopy
from datetime import datetime
from pathlib import Path

import torch
import torchvision

from utils.checkpoints import float_weights, load_checkpoint, save_checkpoint, to_plain
from utils.errors import UserError
from utils.logging import LOGGER
from utils.torch_utils import de_parallel, get_rng_state


def cloned_state(state_dict: dict) -> dict:
    """A CPU copy of a state dict, detached from the live model."""
    return {k: v.detach().cpu().clone() for k, v in state_dict.items()}


def plain_opt(opt) -> dict:
    """argparse options as plain data (Paths to strings) for YAML and checkpoints."""
    return to_plain(dict(vars(opt)))


def training_state(*, model, ema, optimizer, scheduler, scaler, stopper, position, best_fitness,
                   last_opt_step, mloss, opt, hyp, world_size=1, cuda_rng_by_rank=None) -> dict:
    """Capture the full training state; ``position = (epoch, next_batch)`` is where to continue.

    ``cuda_rng_by_rank``: every DDP rank's CUDA generator state, gathered by the caller (see
    :func:`utils.torch_utils.get_rng_state`); None outside DDP.
    """
    m = de_parallel(model)
    return {
        "model_cfg": deepcopy(m.yaml),
        "nc": int(m.nc),
        "names": list(m.names),
        "model": cloned_state(m.state_dict()),
        "ema": cloned_state(ema.ema.state_dict()) if ema else None,
        "updates": int(ema.updates) if ema else 0,
        "optimizer": optimizer.state_dict(),
        "scheduler": to_plain(scheduler.state_dict()),
        "scaler": scaler.state_dict(),
        "grads": [None if p.grad is None else p.grad.detach().cpu().clone() for p in m.parameters()],
        "epoch": int(position[0]) - 1,
        "next_position": [int(position[0]), int(position[1])],
        "world_size": int(world_size),
        "best_fitness": float(best_fitness),
        "last_opt_step": int(last_opt_step),
        "mloss": mloss.detach().cpu().clone(),
        "stopper": stopper.state_dict(),
        "rng": get_rng_state(cuda_by_rank=cuda_rng_by_rank),
        "opt": plain_opt(opt),
        "hyp": to_plain(dict(hyp)),
        "date": datetime.now().isoformat(),
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__},
    }


def restore_training_state(ckpt: dict, *, model, ema, optimizer, scheduler, scaler, stopper, device,
                           world_size=1):
    """Load a captured state into live objects; returns (epoch, batch, best_fitness, last_opt_step, mloss).

    The model's own weights are loaded when it is built; the RNG state is restored by the caller
    right before the first batch, after any start-up work that draws random numbers.
    """
    epoch, batch = ckpt["next_position"]
    if batch and ckpt.get("world_size", 1) != world_size:
        raise UserError(f"--resume: this checkpoint was written mid-epoch by {ckpt.get('world_size', 1)} "
                        f"process(es); resume it with the same number (now {world_size}), because the batch "
                        "position depends on how the data set is sharded")
    if ema is not None and ckpt.get("ema") is not None:
        ema.ema.load_state_dict(float_weights(ckpt["ema"]))
        ema.updates = int(ckpt["updates"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    params = list(de_parallel(model).parameters())
    for param, grad in zip(params, ckpt.get("grads") or [None] * len(params)):
        param.grad = None if grad is None else grad.to(device)
    stopper.load_state_dict(ckpt["stopper"])
    mloss = ckpt["mloss"].to(device)
    return int(epoch), int(batch), float(ckpt["best_fitness"]), int(ckpt["last_opt_step"]), mloss


def strip_optimizer(path) -> None:
    """Finish a checkpoint for inference: EMA weights in fp16, no optimizer or RNG state."""
    ckpt = load_checkpoint(path)
    weights = ckpt.get("ema") or ckpt["model"]
    ckpt["model"] = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    for key in ("ema", "optimizer", "scheduler", "scaler", "grads", "rng", "mloss"):
        ckpt[key] = None
    ckpt["finished"] = True
    save_checkpoint(ckpt, path)
    LOGGER.info(f"Optimizer stripped from {path}, {Path(path).stat().st_size / 1e6:.1f}MB")


class CheckpointSaver:
    """Writes last.pt / best.pt / epochN.pt; a failed write is reported and the old file kept."""

    def __init__(self, last: Path, best: Path, weights_dir: Path, save_period: int = -1,
                 save_interval_min: float = 0.0):
        self.last, self.best, self.weights_dir = Path(last), Path(best), Path(weights_dir)
        self.save_period = save_period
        self.interval_s = save_interval_min * 60
        self._last_save = time.monotonic()

    def interval_due(self) -> bool:
        """True when ``--save-interval`` minutes have passed since the last write."""
        return self.interval_s > 0 and time.monotonic() - self._last_save >= self.interval_s

    def save_last(self, state: dict) -> bool:
        return self._write(state, self.last)

    def save_epoch(self, state: dict, epoch: int, improved: bool) -> None:
        """End of an epoch: last.pt always, best.pt when fitness improved, epochN.pt per --save-period."""
        self._write(state, self.last)
        if improved:
            self._write(state, self.best)
        if self.save_period > 0 and epoch % self.save_period == 0:
            self._write(state, self.weights_dir / f"epoch{epoch}.pt")

    def _write(self, state: dict, path: Path) -> bool:
        try:
            save_checkpoint(state, path)
        except (OSError, RuntimeError) as e:
            LOGGER.error(f"Could not write {path} ({e}); the previous {path.name} is intact")
            return False
        finally:
            self._last_save = time.monotonic()
        return True
