"""Everything a training run needs to continue bit-exactly: capture, restore, save, strip.

A training state is plain data (see utils/training/checkpoints.py). It is captured only at batch
boundaries; gradients accumulated towards the next optimizer step are stored too, so a
checkpoint written mid-accumulation (end of an epoch, an interrupt, a mid-epoch save)
resumes exactly.

:class:`CheckpointSaver` keeps an honest record of what is on disk: which position the last
good ``last.pt`` holds, whether ``best.pt`` exists and still holds the best epoch. A run keeps
training after a failed save only while an earlier good ``last.pt`` exists; only a ``last.pt``
holding the final state is stripped and checksummed (from the file), never a stale one.
"""

import shlex
import time
from copy import deepcopy
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch

from utils.training.checkpoints import (float_weights, load_checkpoint, save_checkpoint, state_dict_sha256,
                                        stored_weights, to_plain)
from utils.errors import UserError, first_line
from utils.files import remove_orphaned_temp_files
from utils.logging import LOGGER
from utils.determinism.reproducibility import record_checksum
from utils.rng_state import get_rng_state
from utils.torch_utils import de_parallel
from utils.torchvision_ops import version as torchvision_version
from utils.training.nonfinite import all_finite
from utils.user_modules import CHECKPOINT_KEY, module_records


def cloned_state(state_dict: dict) -> dict:
    """A CPU copy of a state dict, detached from the live model."""
    return {k: v.detach().cpu().clone() for k, v in state_dict.items()}


def plain_opt(opt) -> dict:
    """argparse options as plain data (Paths to strings) for YAML and checkpoints."""
    return to_plain(dict(vars(opt)))


@dataclass
class Optimisation:
    """The live objects a training state is captured from and restored into."""

    model: torch.nn.Module  # possibly DDP-wrapped
    ema: object  # utils.torch_utils.ModelEMA, or None off the main process
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    stopper: object  # utils.torch_utils.EarlyStopping


@dataclass
class Progress:
    """How far a run has got, beyond its weights: stored in every checkpoint, restored on --resume."""

    mloss: torch.Tensor = field(default_factory=lambda: torch.zeros(3))  # the epoch's running mean losses
    best_fitness: float = 0.0
    last_opt_step: int = -1  # the global batch index of the last optimizer step
    skipped: int = 0  # batches of this epoch skipped for a non-finite loss (--nan-policy skip)


def training_state(parts: Optimisation, progress: Progress, position, *, opt, hyp, world_size=1,
                   cuda_rng_by_rank=None) -> dict:
    """Capture the full training state; ``position = (epoch, next_batch)`` is where to continue.

    ``cuda_rng_by_rank``: every rank's CUDA generator state on its training device, gathered by the
    caller (one entry outside DDP; see :func:`utils.rng_state.get_rng_state`).
    """
    m, ema = de_parallel(parts.model), parts.ema
    return {
        "model_cfg": deepcopy(m.yaml),
        "nc": int(m.nc),
        "names": list(m.names),
        "model": cloned_state(m.state_dict()),
        "ema": cloned_state(ema.ema.state_dict()) if ema else None,
        "updates": int(ema.updates) if ema else 0,
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": to_plain(parts.scheduler.state_dict()),
        "scaler": parts.scaler.state_dict(),
        "amp": bool(parts.scaler.is_enabled()),
        "grads": [None if p.grad is None else p.grad.detach().cpu().clone() for p in m.parameters()],
        "epoch": int(position[0]) - 1,
        "next_position": [int(position[0]), int(position[1])],
        "world_size": int(world_size),
        "best_fitness": float(progress.best_fitness),
        "last_opt_step": int(progress.last_opt_step),
        "mloss": progress.mloss.detach().cpu().clone(),
        "skipped": int(progress.skipped),
        "stopper": parts.stopper.state_dict(),
        "rng": get_rng_state(cuda_by_rank=cuda_rng_by_rank),
        "opt": plain_opt(opt),
        "hyp": to_plain(dict(hyp)),
        "date": datetime.now().isoformat(),
        "versions": {"torch": torch.__version__, "torchvision": torchvision_version()},
        CHECKPOINT_KEY: module_records(getattr(opt, "modules", ())),
    }


def restore_training_state(ckpt: dict, parts: Optimisation, device, world_size=1, any_world_size=False) -> tuple:
    """Load a captured state into live objects; returns ``((epoch, batch), Progress)``. ``any_world_size``
    (``--micro-batch``): a mid-epoch position counts steps, which every world size shares.

    The model's own weights are loaded when it is built; the RNG state is restored by the caller
    right before the first batch, after any start-up work that draws random numbers.
    """
    epoch, batch = ckpt["next_position"]
    if batch and ckpt.get("world_size", 1) != world_size and not any_world_size:
        raise UserError(f"--resume: this checkpoint was written mid-epoch by {ckpt.get('world_size', 1)} "
                        f"process(es); resume it with the same number (now {world_size}), because the batch "
                        "position depends on how the data set is sharded")
    if parts.ema is not None and ckpt.get("ema") is not None:
        parts.ema.ema.load_state_dict(float_weights(ckpt["ema"]))
        parts.ema.updates = int(ckpt["updates"])
    parts.optimizer.load_state_dict(ckpt["optimizer"])
    parts.scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler"):
        parts.scaler.load_state_dict(ckpt["scaler"])
    params = list(de_parallel(parts.model).parameters())
    for param, grad in zip(params, ckpt.get("grads") or [None] * len(params)):
        param.grad = None if grad is None else grad.to(device)
    parts.stopper.load_state_dict(ckpt["stopper"])
    progress = Progress(mloss=ckpt["mloss"].to(device), best_fitness=float(ckpt["best_fitness"]),
                        last_opt_step=int(ckpt["last_opt_step"]), skipped=int(ckpt.get("skipped", 0)))
    return (int(epoch), int(batch)), progress


def strip_optimizer(path, on_commit=None) -> str:
    """Finish a checkpoint for inference: EMA weights in fp16, no optimizer or RNG state.

    Returns the SHA-256 (:func:`state_dict_sha256`) of the weights as read from the file before
    stripping (the EMA, else the model, as stored: fp32). A failed write raises OSError and leaves
    the file as it was.
    """
    ckpt = load_checkpoint(path)
    weights = stored_weights(ckpt)
    checksum = state_dict_sha256(weights)
    ckpt["model"] = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    for key in ("ema", "optimizer", "scheduler", "scaler", "grads", "rng", "mloss"):
        ckpt[key] = None
    ckpt["finished"] = True
    save_checkpoint(ckpt, path, on_commit=on_commit)
    LOGGER.info(f"Optimizer stripped from {path}, {Path(path).stat().st_size / 1e6:.1f}MB")
    return checksum


class CheckpointNotSaved(UserError):
    """A checkpoint the run cannot go on without could not be written (one line: what is on disk)."""


def describe_position(position) -> str:
    """``(epoch, next_batch)`` as words: (2, 0) -> 'after epoch 1', (2, 5) -> 'at epoch 2 batch 5'."""
    epoch, batch = position
    return f"after epoch {epoch - 1}" if batch == 0 else f"at epoch {epoch} batch {batch}"


def epochs_behind(held, now) -> str:
    """How far a checkpoint at position ``held`` lags the run at position ``now``, in words."""
    epochs = now[0] - held[0]
    if epochs <= 0:
        return "less than an epoch behind"
    exact = held[1] == 0 and now[1] == 0
    return f"{'' if exact else 'about '}{epochs} epoch{'s' if epochs != 1 else ''} behind"


def error_text(error: Exception) -> str:
    """The short reason of a failed write, e.g. 'No space left on device'."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return first_line(error)


class NonFiniteWeights(ValueError):
    """A state whose weights hold NaN or inf: never written (it would replace a good file with a useless one)."""


def weights_finite(state: dict) -> bool:
    """True when the model's and the EMA's weights in ``state`` are all finite."""
    return all(all_finite(list((state.get(key) or {}).values())) for key in ("model", "ema"))


class CheckpointSaver:
    """Writes last.pt / best.pt / epochN.pt and records what each file on disk actually holds.

    ``last_position`` is the position the last good last.pt holds (None: none written by this
    run, or on resume the checkpoint resumed from); ``best_state`` is 'absent', 'current',
    'stale' (a newer best epoch could not be saved) or 'earlier' (present before this session).
    """

    def __init__(self, last: Path, best: Path, weights_dir: Path, save_period: int = -1,
                 save_interval_min: float = 0.0, last_position=None):
        self.last, self.best, self.weights_dir = Path(last), Path(best), Path(weights_dir)
        self.save_period = save_period
        self.interval_s = save_interval_min * 60
        self._last_save = time.monotonic()
        self.last_position = tuple(last_position) if last_position is not None and self.last.is_file() else None
        self.last_finished = False
        self.best_state, self.best_epoch = ("earlier" if self.best.is_file() else "absent"), None
        self.best_wanted = None  # the best epoch a failed best.pt write could not save
        self._orphans_checked = False

    @classmethod
    def for_run(cls, save_dir, opt, resume_ckpt=None) -> "CheckpointSaver":
        """The saver of a run folder; on --resume of its own last.pt (``resume_ckpt``), that file counts as good."""
        weights = Path(save_dir) / "weights"
        last = weights / "last.pt"
        resumed = resume_ckpt is not None and Path(str(opt.resume)).resolve() == last.resolve()
        return cls(last, weights / "best.pt", weights, opt.save_period, opt.save_interval,
                   last_position=tuple(resume_ckpt["next_position"]) if resumed else None)

    def interval_due(self) -> bool:
        """True when ``--save-interval`` minutes have passed since the last write."""
        return self.interval_s > 0 and time.monotonic() - self._last_save >= self.interval_s

    @property
    def resumable(self) -> bool:
        """True when last.pt holds a good, unfinished training state written by this run."""
        return self.last_position is not None and not self.last_finished

    def resume_command(self, world_size: int = 1) -> str | None:
        """The command that continues this run from last.pt, or None when last.pt cannot be resumed.

        A DDP run resumes with as many processes as wrote last.pt, so with its own torchrun launch(es).
        """
        if not self.resumable:
            return None
        if world_size > 1:
            return (f"the same torchrun command(s) on every node ({world_size} processes in all), "
                    f"with train.py's arguments replaced by --resume {self.last}")
        return f"python train.py --resume {self.last}"

    def resume_advice(self, world_size: int, any_world_size: bool = False) -> str | None:
        """The command that continues from last.pt as it is, or None when it cannot be resumed: a mid-epoch
        checkpoint of W processes needs W again, unless ``any_world_size`` (``--micro-batch``)."""
        if not self.resumable:
            return None
        command = f"python train.py --resume {shlex.quote(str(self.last))}"
        if world_size == 1:
            return command
        if self.last_position[1] and not any_world_size:
            return (f"torchrun --nproc_per_node {world_size} train.py --resume {shlex.quote(str(self.last))}: "
                    f"{world_size} processes in all, on one node or several, as wrote it mid-epoch")
        if any_world_size:
            return f"{command}, or torchrun with any process count that --micro-batch allows"
        return f"{command}, or torchrun with any process count that divides --batch-size"

    def save_last(self, state: dict, required: bool = True) -> bool:
        """Write last.pt. On failure: warn and go on if an earlier good last.pt exists; otherwise
        raise :class:`CheckpointNotSaved` when ``required`` (training must not continue unsaved)."""
        position = tuple(state["next_position"])
        error = self._write(state, self.last, on_commit=lambda: self._last_written(position))
        if error is None:
            return True
        message = f"Could not write {self.last} ({error_text(error)}); "
        if self.last_position is not None:
            held = f"last.pt still holds {describe_position(self.last_position)}"
            LOGGER.warning(f"{message}{held}, {epochs_behind(self.last_position, position)}"
                           f"{'; training continues' if required else ''}")
        elif required:
            fix = ("lower lr0 or fix the labels" if isinstance(error, NonFiniteWeights)
                   else f"free space or fix permissions in {self.weights_dir}")
            raise CheckpointNotSaved(f"{message}no earlier last.pt of this run exists, so nothing is saved; "
                                     f"{fix}, then start again")
        else:
            LOGGER.error(f"{message}no last.pt of this run exists")
        return False

    def save_epoch(self, state: dict, epoch: int, improved: bool) -> None:
        """End of an epoch: last.pt always, best.pt when fitness improved, epochN.pt per --save-period."""
        self.save_last(state)
        if improved:
            self._save_best(state, epoch)
        if self.save_period > 0 and epoch % self.save_period == 0:
            path = self.weights_dir / f"epoch{epoch}.pt"
            error = self._write(state, path)
            if error is not None:
                LOGGER.warning(f"Could not write {path} ({error_text(error)}); skipped")

    def _save_best(self, state: dict, epoch: int) -> None:
        error = self._write(state, self.best, on_commit=lambda: self._best_written(epoch))
        if error is None:
            return
        if self.best_state == "absent":
            held = "no best.pt exists"
        else:
            self.best_state = "stale"
            held = f"best.pt still holds {self._best_words()}, not the new best epoch {epoch}"
        self.best_wanted = epoch
        LOGGER.warning(f"Could not write {self.best} ({error_text(error)}); {held}")

    def _last_written(self, position) -> None:
        self.last_position, self.last_finished = tuple(position), False

    def _best_written(self, epoch: int) -> None:
        self.best_state, self.best_epoch = "current", epoch

    def _best_words(self) -> str:
        return f"epoch {self.best_epoch}" if self.best_epoch is not None else "an epoch of an earlier session"

    def _write(self, state: dict, path: Path, on_commit=None):
        """Write one checkpoint; returns None on success, else the exception (the old file is intact)."""
        if not self._orphans_checked:
            self._orphans_checked = True
            self._remove_orphans()
        if not weights_finite(state):
            return NonFiniteWeights("its weights hold NaN or inf, so it was not written")
        try:
            save_checkpoint(state, path, on_commit=on_commit)
        except (OSError, RuntimeError) as e:
            return e
        finally:
            self._last_save = time.monotonic()
        return None

    def _remove_orphans(self) -> None:
        """Temporary checkpoint files left by a killed earlier process would otherwise fill the disk."""
        removed = remove_orphaned_temp_files(self.weights_dir, ".pt")
        if removed:
            size = sum(s for _, s in removed) / 1e6
            LOGGER.info(f"Removed {len(removed)} temporary file(s) ({size:.1f}MB) left in {self.weights_dir} "
                        f"by an interrupted save: {', '.join(p.name for p, _ in removed)}")

    def describe(self) -> str:
        """One line: what last.pt and best.pt on disk hold right now."""
        if self.last_position is not None:
            kind = "with the final weights" if self.last_finished else "(resumable)"
            last = f"last.pt {describe_position(self.last_position)} {kind}"
        else:
            last = "last.pt from before this run" if self.last.is_file() else "no last.pt"
        if self.best_state == "absent" or not self.best.is_file():
            best = "no best.pt"
        elif self.best_state == "stale":
            best = f"best.pt from {self._best_words()} (stale: the best epoch {self.best_wanted} could not be saved)"
        else:
            best = f"best.pt from {self._best_words()}"
        return f"On disk in {self.weights_dir}: {last}; {best}."

    def finish(self, final_position) -> Path:
        """End of a run: check last.pt holds ``final_position``, strip it (and a current best.pt),
        record the weights' SHA-256 read from last.pt; returns the file to validate.

        Raises :class:`CheckpointNotSaved` (one line naming what is on disk) when the final
        state is not in last.pt, or last.pt cannot be stripped: such a run must not end as a success.
        """
        final_position = tuple(final_position)
        if self.last_position != final_position:
            resume = f" Free space and resume with: {self.resume_command()}" if self.resumable else ""
            raise CheckpointNotSaved(f"the final weights ({describe_position(final_position)}) could not be saved. "
                                     f"{self.describe()}{resume}")
        try:
            checksum = strip_optimizer(self.last, on_commit=lambda: setattr(self, "last_finished", True))
        except (OSError, RuntimeError) as e:
            raise CheckpointNotSaved(f"the final weights are in {self.last}, complete but not stripped or marked "
                                     f"finished ({error_text(e)}). Free space and resume with: "
                                     f"{self.resume_command()}") from e
        if self.best.is_file() and self.best_state in ("current", "earlier"):
            self._strip(self.best)
        elif self.best_state == "stale":
            LOGGER.warning(f"{self.best} is stale ({self._best_words()}; the best epoch {self.best_wanted} "
                           "could not be saved): left as it is, validating last.pt instead")
        try:
            record_checksum(self.weights_dir.parent, checksum)
        except OSError as e:
            LOGGER.warning(f"Could not write {self.weights_dir / 'sha256.txt'} ({error_text(e)})")
        LOGGER.info(f"Final EMA weights sha256 (read back from {self.last.name}): {checksum}")
        usable_best = self.best.is_file() and self.best_state in ("current", "earlier")
        return self.best if usable_best else self.last

    def _strip(self, path: Path, on_commit=None) -> str:
        """Strip one final checkpoint; a failed write keeps the full (larger) file and is only a warning."""
        try:
            return strip_optimizer(path, on_commit=on_commit)
        except (OSError, RuntimeError) as e:
            LOGGER.warning(f"Could not strip {path} ({error_text(e)}); it keeps the full training state")
            return state_dict_sha256(stored_weights(load_checkpoint(path)))

