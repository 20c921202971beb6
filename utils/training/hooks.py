"""The training loop's side tasks, one hook each, run in a fixed order (see :func:`run_hooks`).

A hook has six stages, each called with the loop (utils/training/loop.py): ``before_train``,
``before_epoch``, ``before_step``, ``after_step``, ``after_epoch`` (complete epochs only) and
``after_train`` (always, also when a step or a hook raised). The user's YOLOv5 callbacks run from
:class:`CallbackHook`; results.csv, the trackers and the batch plots are themselves callbacks
(utils/callbacks.py), registered first.
"""

import signal

import numpy as np
import torch
from tqdm import tqdm

from utils.callbacks import Callbacks
from utils.ddp import broadcast_object, max_over_ranks
from utils.logging import LOGGER
from utils.metrics import ValMetrics, fitness
from utils.plots import plot_images
from utils.size_metrics import band_row
from utils.torch_utils import de_parallel


class TrainHook:
    """A side task of the training loop; every stage does nothing unless overridden."""

    def before_train(self, loop) -> None:
        pass

    def before_epoch(self, loop) -> None:
        pass

    def before_step(self, loop) -> None:
        pass

    def after_step(self, loop) -> None:
        pass

    def after_epoch(self, loop) -> None:
        pass

    def after_train(self, loop) -> None:
        pass


class ProgressHook(TrainHook):
    """The per-epoch progress bar and its loss text (main process only)."""

    HEADER = ("Epoch", "GPU_mem", "box_loss", "obj_loss", "cls_loss", "Instances", "Size")

    def __init__(self, every: int, world_size: int = 1):
        self.every = every  # on CUDA the text reads the losses, so it waits for the GPU: not every batch
        self.bar = None
        # the labels of rank 0's images only: counting every rank's would cost a collective per step
        self.header = self.HEADER if world_size == 1 else (*self.HEADER[:5], "Inst/rank0", self.HEADER[6])

    def before_epoch(self, loop) -> None:
        LOGGER.info(("\n" + "%11s" * 7) % self.header)
        first = loop.start_batch if loop.epoch == loop.start_epoch else 0
        self.bar = tqdm(total=loop.nb, initial=first, bar_format="{l_bar}{bar:10}{r_bar}")

    def after_step(self, loop) -> None:
        i, imgs, targets, _ = loop.batch
        if i % self.every == 0 or i + 1 == loop.nb:
            self.bar.set_description(self.describe(loop.epoch, loop.opt.epochs, loop.progress.mloss, imgs, targets))
        self.bar.update(1)
        if i + 1 == loop.nb or loop.interrupted:
            self.bar.close()

    def after_train(self, loop) -> None:
        if self.bar is not None:
            self.bar.close()  # an error line that follows starts on a line of its own

    @staticmethod
    def describe(epoch: int, epochs: int, mloss, imgs, targets) -> str:
        memory = f"{torch.cuda.memory_reserved() / 1e9 if torch.cuda.is_available() else 0:.3g}G"
        return ("%11s" * 2 + "%11.4g" * 5) % (f"{epoch}/{epochs - 1}", memory, *mloss, targets.shape[0],
                                              imgs.shape[-1])


class CallbackHook(TrainHook):
    """YOLOv5's training callbacks, with YOLOv5's arguments (main process only)."""

    def __init__(self, callbacks: Callbacks):
        self.callbacks = callbacks

    def before_train(self, loop) -> None:
        self.callbacks.run("on_train_start")

    def before_epoch(self, loop) -> None:
        self.callbacks.run("on_train_epoch_start")

    def before_step(self, loop) -> None:
        self.callbacks.run("on_train_batch_start")

    def after_step(self, loop) -> None:
        i, imgs, targets, paths = loop.batch
        self.callbacks.run("on_train_batch_end", loop.model, i + loop.nb * loop.epoch, imgs, targets, paths,
                           loop.progress.mloss.tolist())

    def after_epoch(self, loop) -> None:
        self.callbacks.run("on_train_epoch_end", epoch=loop.epoch)


class SignalHook(TrainHook):
    """Every rank stops, or writes last.pt mid-epoch (``--save-interval``), at the same batch: a signal
    any rank received, the main process's save timer and its callbacks' ``stop_training`` are agreed on
    after each step."""

    def after_step(self, loop) -> None:
        ctx, main, requested = loop.ctx, loop.dist.is_main, loop.interrupt.requested
        interval_save = main and ctx.saver.interval_due() and not loop.opt.nosave
        asked = main and loop.callbacks.stop_training
        loop.stop_signal, save_now, asked = max_over_ranks([requested, interval_save, asked], loop.dist)
        loop.interrupted = bool(loop.stop_signal)
        if loop.interrupted and not requested and main:
            LOGGER.warning(f"{signal.Signals(loop.stop_signal).name} received by another rank: "
                           "stopping after this step on every rank")
        if asked and not loop.stop_request:
            loop.stop_request = loop.callbacks.stop_request if main else "a callback on rank 0"
        i = loop.batch[0]
        if i + 1 < loop.nb and (loop.interrupted or loop.stop_request or save_now):
            loop.save_last((loop.epoch, i + 1), required=not loop.interrupted)


class EpochEndHook(TrainHook):
    """The LR schedule's step, then on the main process validation, the results row (the
    ``on_fit_epoch_end`` callbacks: results.csv, trackers, the user's), early stopping and the
    epoch's checkpoints (then ``on_model_save``); every rank learns whether to stop early."""

    def after_epoch(self, loop) -> None:
        lr = [group["lr"] for group in loop.optimizer.param_groups]
        loop.parts.scheduler.step()
        cuda_rng, stop = loop.gather_cuda_rng(), False
        if loop.dist.is_main:
            stop = self.validate_log_save(loop, lr, cuda_rng)
        asked = loop.callbacks.stop_request if loop.dist.is_main else None  # on_fit_epoch_end, on_model_save
        stop, asked = broadcast_object((stop, asked), loop.dist)
        loop.early_stop = bool(stop)
        loop.stop_request = loop.stop_request or asked

    def validate_log_save(self, loop, lr: list, cuda_rng) -> bool:
        ctx, epoch, progress = loop.ctx, loop.epoch, loop.progress
        loop.ema.update_attr(de_parallel(loop.model), include=["yaml", "nc", "names", "stride"])
        final_epoch = epoch + 1 == loop.opt.epochs or loop.parts.stopper.possible_stop
        results, bands = ValMetrics(), None
        if not loop.opt.noval or final_epoch:
            checked = ctx.validate(
                ctx.data_dict, batch_size=ctx.per_rank_batch, imgsz=ctx.imgsz, half=loop.amp, model=loop.ema.ema,
                single_cls=loop.opt.single_cls, dataloader=ctx.val_loader, save_dir=ctx.save_dir, plots=False,
                compute_loss=loop.compute_loss, names=ctx.names, size_bands=True)
            results, bands = checked.metrics, checked.bands
        loop.results = results
        fi = float(fitness(np.array(results).reshape(1, -1))[0])
        stop = loop.parts.stopper(epoch=epoch, fitness=fi)
        progress.best_fitness = max(progress.best_fitness, fi)
        improved = fi == progress.best_fitness  # YOLOv5 also rewrites best.pt on a tie
        row = [*progress.mloss.tolist(), *results, *lr, progress.skipped, *band_row(bands)]
        loop.callbacks.run("on_fit_epoch_end", row, epoch, progress.best_fitness, fi)
        if not loop.opt.nosave or final_epoch or stop or loop.interrupted:
            ctx.saver.save_epoch(loop.state((epoch + 1, 0), cuda_rng), epoch, improved)
            if ctx.saver.last_position == (epoch + 1, 0):
                loop.callbacks.run("on_model_save", ctx.saver.last, epoch, final_epoch, progress.best_fitness, fi)
        return stop


def training_hooks(loop) -> list:
    """The hooks of a run in their fixed order: progress, the user's callbacks (so a callback sees a batch
    before the loop decides to stop or save after it), signal agreement and saves, then the epoch's end."""
    main = loop.dist.is_main
    every = 10 if loop.device.type == "cuda" else 1
    progress = ProgressHook(every, loop.dist.world_size)
    return [*([progress, CallbackHook(loop.callbacks)] if main else []), SignalHook(), EpochEndHook()]


def run_callbacks(results_log, trackers, plots: bool, save_dir, names) -> Callbacks:
    """The run's own callbacks: results.csv, then the trackers, on ``on_fit_epoch_end``; with ``plots``, the
    first three training batches drawn (``on_train_batch_end``)."""
    callbacks = Callbacks()
    columns = results_log.columns[1:]
    callbacks.register_action("on_fit_epoch_end", "results.csv",
                              lambda row, epoch, best_fitness, fi: results_log.append(epoch, row))
    callbacks.register_action("on_fit_epoch_end", "trackers",
                              lambda row, epoch, best_fitness, fi: trackers.log_epoch(epoch, dict(zip(columns, row))))
    if plots:
        def plot_first_batches(model, ni, imgs, targets, paths, mloss):
            if ni < 3:
                plot_images(imgs, targets, paths, save_dir / f"train_batch{ni}.jpg", names)

        callbacks.register_action("on_train_batch_end", "plots", plot_first_batches)
    return callbacks
