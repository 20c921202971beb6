"""The training loop: one step (forward, non-finite guard, scoped backward, optimizer step) and the epochs
around it. Every side task (progress, callbacks, signals, saves, validation) is a hook: utils/training/hooks.py.
"""

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from utils.augmentations import random_rescale
from utils.callbacks import Callbacks
from utils.ddp import DistInfo, broadcast_object, gather_objects, launched_by_torchrun, rank_ordered_mean_hook
from utils.errors import NonFiniteLoss
from utils.logging import LOGGER, colorstr
from utils.loss import ComputeLoss, scale_loss_gains
from utils.rng_state import cuda_rng_state
from utils.torch_utils import DeterminismPolicy, EarlyStopping, ModelEMA, de_parallel, grid_size, smart_optimizer
from utils.training.interrupts import GracefulInterrupt
from utils.training.micro_batches import MicroBatchStep, broadcast_weights, join_micro_batches
from utils.training.nonfinite import (BufferSnapshot, GuardedStep, describe_origins, loss_report, nonfinite_message,
                                      nonfinite_origins)
from utils.training.run_state import CheckpointSaver, Optimisation, Progress, restore_training_state, training_state
from utils.training.schedule import apply_warmup, lr_lambda

NOMINAL_BATCH = 64  # YOLOv5's nominal batch size: gradients accumulate up to it


@dataclass(frozen=True)
class RunContext:
    """One training run's settings and collaborators, built once (complete) by train.py, read by the loop."""

    opt: argparse.Namespace
    device: torch.device
    dist: DistInfo
    policy: DeterminismPolicy
    save_dir: Path
    data_dict: dict
    names: list
    imgsz: int
    batch_size: int  # total over all ranks (YOLOv5's --batch-size)
    per_rank_batch: int
    plots: bool
    train_loader: Any
    val_loader: Any  # None on the other DDP ranks: only the main process validates
    saver: CheckpointSaver
    validate: Callable = None  # val.run, passed in (utils/ does not import entry scripts)

    @property
    def nc(self) -> int:
        return len(self.names)


class TrainLoop:
    """The optimisation loop and its state (model, EMA, optimizer, scheduler, scaler, early stopping).

    Control flow; the hooks run in the order given to :meth:`run`::

        hooks.before_train()
        for epoch in epochs:                      # from the resumed position
            hooks.before_epoch()
            for batch in loader:
                hooks.before_step()
                loop.train_step(batch)            # twinned forward, non-finite guard, scoped backward, optimizer step
                hooks.after_step()                # progress, callbacks, signal agreement, mid-epoch save
                if a signal or stop_training stopped it mid-epoch: stop
            hooks.after_epoch()                   # LR schedule, validation, results.csv, early stop, save
            if stopped: break
        hooks.after_train()                       # always, also after an exception
    """

    def __init__(self, ctx: RunContext, model, hyp: dict, amp: bool):
        self.ctx, self.opt, self.device, self.dist, self.amp = ctx, ctx.opt, ctx.device, ctx.dist, amp
        # channels-last convolutions are ~1.4x faster for YOLOv5n on CPU (oneDNN) and suit tensor cores
        model = model.to(memory_format=torch.channels_last)
        self.hyp_for_checkpoint = dict(hyp)
        hyp = dict(hyp)
        self.accumulate_nbs = max(round(NOMINAL_BATCH / ctx.batch_size), 1)
        hyp["weight_decay"] *= ctx.batch_size * self.accumulate_nbs / NOMINAL_BATCH
        optimizer = smart_optimizer(model, self.opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
        self.lf = lr_lambda(hyp["lrf"], self.opt.epochs, self.opt.cos_lr)
        self.parts = Optimisation(model=model, ema=ModelEMA(model) if ctx.dist.is_main else None,
                                  optimizer=optimizer,
                                  scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=self.lf),
                                  scaler=torch.amp.GradScaler("cuda", enabled=amp),
                                  stopper=EarlyStopping(patience=self.opt.patience))
        self.progress = Progress(mloss=torch.zeros(3, device=self.device))
        self.hyp = scale_loss_gains(hyp, model.model[-1].nl, ctx.nc, ctx.imgsz)
        self.grid_size = grid_size(model)
        self.buffers = BufferSnapshot(model)
        self.guarded_step = GuardedStep(optimizer, self.buffers.live)
        self.start_epoch, self.start_batch = 0, 0
        self.epoch, self.batch, self.nb = 0, 0, 0  # where the loop is; batch = (i, imgs, targets, paths)
        self.interrupted, self.interrupt_code, self.elapsed_hours = False, 0, 0.0
        self.stop_signal = 0  # the signal any rank received, shared by all ranks at each batch
        self.early_stop = False
        self.stop_request = None  # who set Callbacks.stop_training (rank 0's callbacks), once every rank agreed
        self.results, self.interrupt = None, None
        self.callbacks = Callbacks()  # the run's own (results.csv, trackers, plots), then the user's; rank 0
        self.compute_loss, self.n_warmup = None, 0
        self.micro = None  # MicroBatchStep with --micro-batch (world-size invariance), set in wrap_ddp

    @property
    def model(self):
        return self.parts.model

    @property
    def ema(self):
        return self.parts.ema

    @property
    def optimizer(self):
        return self.parts.optimizer

    def restore(self, ckpt) -> None:
        (self.start_epoch, self.start_batch), self.progress = restore_training_state(
            ckpt, self.parts, device=self.device, world_size=self.dist.world_size,
            any_world_size=bool(self.opt.micro_batch))

    def wrap_ddp(self) -> None:
        """DDP around the model; with --micro-batch, rank 0's weights on every rank and no wrapper (the
        micro-batch step reduces the gradients itself)."""
        if self.opt.micro_batch:
            broadcast_weights(self.model, self.dist)
            self.micro = MicroBatchStep(self.model, self.dist, self.device, self.opt.seed,
                                        self.ctx.batch_size // self.opt.micro_batch)
            return
        if not self.dist.enabled:
            return
        cuda = self.device.type == "cuda"
        if self.opt.sync_bn and not cuda:
            LOGGER.warning("--sync-bn needs CUDA devices (SyncBatchNorm has no CPU kernel); ignored")
        elif self.opt.sync_bn:
            self.parts.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model).to(self.device)
            self.buffers = BufferSnapshot(self.model)
            self.guarded_step = GuardedStep(self.optimizer, self.buffers.live)
            LOGGER.info("Using SyncBatchNorm()")
        self.parts.model = DDP(self.model, device_ids=[self.dist.local_rank] if cuda else None,
                               output_device=self.dist.local_rank if cuda else None)
        if self.ctx.policy.mode != "off":  # reproducible sums at any world size, also across a resume
            self.model.register_comm_hook(None, rank_ordered_mean_hook)

    def gather_cuda_rng(self) -> list:
        """Every rank's CUDA generator state on its training device, for the checkpoint (all ranks must
        call it); not the current device's, which ``train.run(device="1")`` may not have changed."""
        return gather_objects(cuda_rng_state(self.device), self.dist)

    def state(self, position, cuda_rng=None) -> dict:
        """The resumable training state at ``position = (epoch, next_batch)``."""
        return training_state(self.parts, self.progress, position, opt=self.opt, hyp=self.hyp_for_checkpoint,
                              world_size=self.dist.world_size, cuda_rng_by_rank=cuda_rng)

    def save_last(self, position, required: bool = True) -> None:
        """last.pt at ``position`` (every rank must call it), then the ``on_model_save`` callbacks."""
        cuda_rng = self.gather_cuda_rng()
        if self.dist.is_main and self.ctx.saver.save_last(self.state(position, cuda_rng), required=required):
            self.callbacks.run("on_model_save", self.ctx.saver.last, position[0], False,
                                   self.progress.best_fitness, None)

    def run(self, hooks: list):
        """All epochs with ``hooks`` (utils/training/hooks.py); returns (last validation results, last epoch)."""
        self.compute_loss = ComputeLoss(de_parallel(self.model), self.hyp)
        sampler = self.ctx.train_loader.batch_sampler
        self.nb = sampler.steps() if self.micro else len(self.ctx.train_loader)
        self.n_warmup = max(round(self.hyp["warmup_epochs"] * self.nb), 100) if self.hyp["warmup_epochs"] > 0 else 0
        finished, self.epoch, t0 = True, self.start_epoch, time.time()
        with GracefulInterrupt(describe_saved=self.ctx.saver.describe,
                               launcher_passes_signals_on=launched_by_torchrun()) as self.interrupt:
            self.announce()
            self._run_hooks(hooks, "before_train")
            try:
                for self.epoch in range(self.start_epoch, self.opt.epochs):
                    finished = self.run_epoch(hooks, self.start_batch if self.epoch == self.start_epoch else 0)
                    if not finished or self.interrupted or self.early_stop or self.stop_request:
                        break
            finally:
                self._run_hooks(hooks, "after_train")  # also when a step or hook raised, as detectron2's
            # a rank stopped by another rank's signal exits as that rank does (128 + the signal), not with 1
            self.interrupt_code = 128 + self.stop_signal if self.stop_signal else self.interrupt.exit_code
        if self.interrupted and finished and self.epoch + 1 == self.opt.epochs:
            self.interrupted = False  # the signal came during the last batch: the run is complete
        if self.stop_request and finished and self.epoch + 1 == self.opt.epochs:
            self.stop_request = None  # asked for at the last batch: the run is complete
        self.elapsed_hours = (time.time() - t0) / 3600
        return self.results, self.epoch

    def announce(self) -> None:
        LOGGER.info(f"Image sizes {self.ctx.imgsz} train, {self.ctx.imgsz} val\n"
                    f"Using {self.ctx.train_loader.num_workers} dataloader workers\n"
                    f"Logging results to {colorstr('bold', self.ctx.save_dir)}\n"
                    f"Starting training for {self.opt.epochs} epochs...")

    def run_epoch(self, hooks: list, first_batch: int) -> bool:
        """One epoch from ``first_batch``; False if a signal stopped it before its last batch."""
        self.model.train()
        if first_batch == 0:
            self.progress.mloss, self.progress.skipped = torch.zeros(3, device=self.device), 0
            self.optimizer.zero_grad()  # YOLOv5 drops an epoch's unfinished accumulation
        self.ctx.train_loader.set_epoch(self.epoch, start_batch=first_batch)
        self._run_hooks(hooks, "before_epoch")
        for i, imgs, targets, paths, micro in self.batches(first_batch):
            self.batch = (i, imgs, targets, paths)
            self._run_hooks(hooks, "before_step")
            if micro is None:
                loss_items = self.train_step(imgs, targets, self.epoch, i, self.nb)
            else:
                loss_items = self.train_micro_step(micro, self.epoch, i, self.nb)
            if loss_items is not None:
                self.progress.mloss = (self.progress.mloss * i + loss_items) / (i + 1)
            self._run_hooks(hooks, "after_step")
            if (self.interrupted or self.stop_request) and i + 1 < self.nb:
                return False
        self._run_hooks(hooks, "after_epoch")
        return True

    def batches(self, first_batch: int):
        """``(i, imgs, targets, paths, micro)`` per step; with --micro-batch, ``micro`` is this rank's
        micro-batches ``(global index, imgs, targets, paths)`` and the rest joins them; otherwise None."""
        loader = self.ctx.train_loader
        if self.micro is None:
            for i, (imgs, targets, paths, _) in enumerate(loader, start=first_batch):
                yield i, imgs, targets, paths, None
            return
        delivered = iter(loader)
        for i in range(first_batch, self.nb):
            micro = [(index, *next(delivered)[:3]) for index in loader.batch_sampler.step_share(i)]
            yield (i, *join_micro_batches(micro), micro)

    def _run_hooks(self, hooks: list, stage: str) -> None:
        for hook in hooks:
            getattr(hook, stage)(self)

    def train_step(self, imgs, targets, epoch: int, i: int, nb: int):
        """Forward, the non-finite guard, scoped backward, and an optimizer step when enough gradient has
        accumulated. Returns the loss terms, or None for a batch skipped for a non-finite loss or step."""
        ni = i + nb * epoch
        accumulate = self.accumulation(ni, epoch)
        self.buffers.take()
        loss, loss_items = self.forward_loss(imgs, targets, epoch, i)
        if self.dist.enabled:
            loss *= self.dist.world_size
        if self.opt.quad:
            loss *= 4.0
        finite = bool(torch.isfinite(loss.detach()).all())
        origins = nonfinite_origins(None if finite else loss_report(max(self.dist.rank, 0), loss_items), self.dist)
        if origins:
            self.buffers.restore()  # the forward pass moved BatchNorm's running statistics
            return self.nonfinite_batch("non-finite loss", describe_origins(origins, self.dist.world_size), epoch, i)
        self.backward(loss)
        problem = self.step_when_due(ni, accumulate)
        if problem:
            self.buffers.restore()
            return self.nonfinite_batch(problem, "", epoch, i, step=True)
        return loss_items

    def train_micro_step(self, micro: list, epoch: int, i: int, nb: int):
        """:meth:`train_step` for this rank's micro-batches (``--micro-batch``, utils/training/micro_batches.py):
        the same bits whatever the number of processes."""
        ni = i + nb * epoch
        accumulate = self.accumulation(ni, epoch)
        held = [p.grad for p in self.micro.params]  # BatchNorm's buffers: put back after each micro-batch
        leaves, items, stats = self.micro.local_gradients(
            micro, lambda imgs, targets: self.forward_loss(imgs, targets, epoch, i), ni, self.backward)
        for p, grad in zip(self.micro.params, held):
            p.grad = grad
        first_bad = next(((m[0], terms) for m, leaf, terms in zip(micro, leaves, items) if leaf is None), None)
        local = None if first_bad is None else loss_report(max(self.dist.rank, 0), first_bad[1], first_bad[0])
        origins = nonfinite_origins(local, self.dist)
        if origins:
            return self.nonfinite_batch("non-finite loss", describe_origins(origins, self.dist.world_size), epoch, i)
        self.micro.apply(leaves, held)
        loss_items = self.micro.loss_terms(items)
        problem = self.step_when_due(ni, accumulate)
        if problem:
            return self.nonfinite_batch(problem, "", epoch, i, step=True)
        self.micro.fold_batch_norm(stats)  # only for a step that was kept: a bad one leaves them as before it
        return loss_items

    def accumulation(self, ni: int, epoch: int) -> int:
        """Batches per optimizer step at global batch ``ni`` (fewer during warm-up, which also sets the LRs)."""
        if ni < self.n_warmup:
            return apply_warmup(self.optimizer, ni, self.n_warmup, epoch, self.lf, self.hyp, self.accumulate_nbs)
        return self.accumulate_nbs

    def forward_loss(self, imgs, targets, epoch: int, i: int):
        """Images to the device in [0, 1] (rescaled with --multi-scale), forward, loss -> (loss, loss terms)."""
        imgs = imgs.to(self.device, non_blocking=True).float().div_(255)
        imgs = imgs.contiguous(memory_format=torch.channels_last)
        if self.opt.multi_scale:
            imgs = random_rescale(imgs, self.ctx.imgsz, self.grid_size, self.opt.seed, epoch, i)
        with self.ctx.policy.forward_scope(), torch.autocast(self.device.type, enabled=self.amp):
            pred = self.model(imgs)
            return self.compute_loss(pred, targets.to(self.device, non_blocking=True))

    def backward(self, loss) -> None:
        with self.ctx.policy.backward_scope():
            self.parts.scaler.scale(loss).backward()

    def step_when_due(self, ni: int, accumulate: int) -> str | None:
        """The optimizer step once enough gradient has accumulated; None, or what made it non-finite (then it
        was undone, and the next accumulation starts at the next batch this run or a resume trains)."""
        if ni - self.progress.last_opt_step < accumulate:
            return None
        problem = self.guarded_step(self.model, self.parts.scaler, self.ema, self.dist)
        self.progress.last_opt_step = ni if problem is None or self.opt.nan_policy == "skip" else ni - 1
        return problem

    def nonfinite_batch(self, what: str, where: str, epoch: int, i: int, step: bool = False) -> None:
        """A non-finite loss or step, the model as it was before the batch: skip the batch (``--nan-policy
        skip``) or save the state before it as last.pt and stop, every rank saying what rank 0 left on disk."""
        skipping = self.opt.nan_policy == "skip"
        message = nonfinite_message(what, where, epoch, i, self.amp, skipping, step)
        if skipping:
            self.progress.skipped += 1
            if self.dist.is_main:
                LOGGER.warning(message)
            return None
        self.save_last((epoch, i), required=False)
        on_disk, resume = self.saved_on_disk()  # a collective: last.pt is complete before any rank exits
        advice = (f"To go on, lower lr0 or fix the labels and resume ({resume}), or pass --nan-policy skip" if resume
                  else "Nothing resumable is saved: lower lr0 or fix the labels and start again, or pass "
                       "--nan-policy skip")
        raise NonFiniteLoss(f"{message}. {on_disk} {advice}")

    def saved_on_disk(self) -> tuple:
        """(what last.pt and best.pt hold, the command that resumes last.pt or None), as rank 0, which writes
        them, knows it; on every rank (all must call it)."""
        saver = self.ctx.saver
        return broadcast_object((saver.describe(), saver.resume_advice(self.dist.world_size,
                                                                         bool(self.opt.micro_batch))), self.dist)
