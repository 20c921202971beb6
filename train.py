"""Train a YOLOv5 / FFCA-YOLO detector on a YOLO-format data set.

Usage (YOLOv5's flags and meanings):
    python train.py --data data/shapes.yaml --cfg models/ffca-yolo.yaml --imgsz 640 --epochs 100
    python train.py --resume                       # continue the most recent run under runs/
    torchrun --nproc_per_node 2 train.py --device 0,1 --data D.yaml --cfg models/ffca-yolo.yaml
    python train.py ... --deterministic strict     # determinism mode: scoped (default) | strict | warn | off
"""

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import val as validate  # noqa: E402
from models.experimental import attempt_load, check_fit, stored_model  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.training.amp import amp_for_run  # noqa: E402
from utils.training.next_steps import next_steps  # noqa: E402
from utils.autoanchor import check_anchors  # noqa: E402
from utils.augmentations import random_rescale  # noqa: E402
from utils.autobatch import check_train_batch_size  # noqa: E402
from utils.training.checkpoints import float_weights, inference_weights, load_checkpoint  # noqa: E402
from utils.dataset.data_config import check_dataset  # noqa: E402
from utils.dataset.tiles import box_scale, resolve_tile_size  # noqa: E402
from utils.dataloaders import create_dataloader  # noqa: E402
from utils.ddp import (DistInfo, barrier, broadcast_object, check_ddp_batch,  # noqa: E402
                       destroy_process_group, dist_info_from_env, gather_objects, init_process_group,
                       launched_by_torchrun, max_over_ranks, per_rank_batch_size, rank_ordered_mean_hook)
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.extra_hyps import resolve_nwd_constant, with_extra_hyp  # noqa: E402
from utils.files import increment_path, yaml_load  # noqa: E402
from utils.training.interrupts import GracefulInterrupt, exit_after_interrupt  # noqa: E402
from utils.training.lost_peer import exit_on_lost_peer  # noqa: E402
from utils.logging import LOGGER, colorstr  # noqa: E402
from utils.loss import ComputeLoss, scale_loss_gains  # noqa: E402
from utils.metrics import fitness  # noqa: E402
from utils.training.evolve import META, evolve  # noqa: E402
from utils.options import (TRAIN_UPSTREAM_FLAGS, OneLineErrorParser, OptionRules, add_shared_flags,  # noqa: E402
                           check_options, merge_resumed_options, typed_flags)
from utils.ops import check_img_size  # noqa: E402
from utils.out_of_memory import out_of_memory_hint  # noqa: E402
from utils.plots import plot_images, plot_labels, plot_results  # noqa: E402
from utils.determinism.reproducibility import determinism_report, run_guarantee, write_json  # noqa: E402
from utils.training.results_log import ResultsLog  # noqa: E402
from utils.tracking import LOGGERS, check_loggers, start_tracking  # noqa: E402
from utils.training.run_folder import (check_run_folder_free, claim_run_folder, held_run_folder,  # noqa: E402
                                       latest_checkpoint)
from utils.training.run_state import (CheckpointSaver, plain_opt, restore_training_state,  # noqa: E402
                                      sigkill_after_batch, training_state)
from utils.size_metrics import band_row  # noqa: E402
from utils.training.schedule import apply_warmup, lr_lambda  # noqa: E402
from utils.determinism.audit_cache import start_up_audit  # noqa: E402
from utils.rng_state import cuda_rng_state, set_rng_state  # noqa: E402
from utils.torch_utils import (MODES, DeterminismPolicy, EarlyStopping, ModelEMA,  # noqa: E402
                               configure_determinism, de_parallel, freeze_layers, intersect_dicts,
                               optimizer_step, prepare_cuda_environment, select_device, smart_optimizer)

NOMINAL_BATCH = 64  # YOLOv5's nominal batch size: gradients accumulate up to it
DEFAULT_DATA = ROOT / "data" / "shapes.yaml"
DEFAULT_HYP = ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"
DEFAULT_PROJECT = ROOT / "runs" / "train"


def parse_opt(argv=None):
    """Parse YOLOv5's training flags (plus --deterministic and --save-interval)."""
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python train.py", description="Train a YOLOv5 / FFCA-YOLO detector",
                          upstream_flags=TRAIN_UPSTREAM_FLAGS)
    add_shared_flags(p, project=DEFAULT_PROJECT, many_weights=False, imgsz_help="train and val image size (px)",
                     weights_help="checkpoint to start from ('' = from scratch)")
    p.add_argument("--cfg", type=str, default="", help="model YAML, e.g. models/ffca-yolo.yaml")
    p.add_argument("--data", type=str, default=str(DEFAULT_DATA), help="data set YAML")
    p.add_argument("--hyp", type=str, default=str(DEFAULT_HYP), help="hyperparameters YAML")
    p.add_argument("--epochs", type=int, default=100, help="total training epochs")
    p.add_argument("--batch-size", type=int, default=16, help="total batch size over all GPUs, -1 = AutoBatch")
    p.add_argument("--rect", action="store_true", help="rectangular training")
    p.add_argument("--train-tiles", type=int, metavar="N", help="train on random N x N tiles (data YAML: train_tiles)")
    p.add_argument("--resume", nargs="?", const=True, default=False, help="resume the most recent or a given run")
    p.add_argument("--nosave", action="store_true", help="only save the final checkpoint")
    p.add_argument("--noval", action="store_true", help="only validate the final epoch")
    p.add_argument("--noautoanchor", action="store_true", help="disable AutoAnchor")
    p.add_argument("--noplots", action="store_true", help="save no plot files")
    p.add_argument("--evolve", type=int, nargs="?", const=300, help="evolve hyperparameters for N generations")
    p.add_argument("--cache", type=str, nargs="?", const="ram", help="cache images in 'ram' (default) or 'disk'")
    p.add_argument("--reduced-decode", action="store_true",
                   help="decode large JPEGs at 1/2, 1/4 or 1/8 scale in libjpeg when that still covers --imgsz (faster)")
    p.add_argument("--image-weights", action="store_true", help="sample images by class rarity")
    p.add_argument("--multi-scale", action="store_true", help="vary image size +/- 50%%")
    p.add_argument("--single-cls", action="store_true", help="train multi-class data as single-class")
    p.add_argument("--optimizer", type=str, choices=["SGD", "Adam", "AdamW"], default="SGD", help="optimizer")
    p.add_argument("--sync-bn", action="store_true", help="use SyncBatchNorm, only available in DDP mode")
    p.add_argument("--workers", type=int, default=8, help="max dataloader workers (per rank in DDP mode)")
    p.add_argument("--quad", action="store_true", help="quad dataloader")
    p.add_argument("--cos-lr", action="store_true", help="cosine LR scheduler")
    p.add_argument("--label-smoothing", type=float, default=0.0, help="label smoothing epsilon")
    p.add_argument("--patience", type=int, default=100, help="EarlyStopping patience (epochs without improvement)")
    p.add_argument("--freeze", nargs="+", type=int, default=[0], help="freeze layers: backbone=10, first3=0 1 2")
    p.add_argument("--save-period", type=int, default=-1, help="save a checkpoint every x epochs (disabled if < 1)")
    p.add_argument("--save-interval", type=float, default=30.0,
                   help="also write last.pt mid-epoch every N minutes (0 = only at epoch ends)")
    p.add_argument("--seed", type=int, default=0, help="global training seed")
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="DDP rank (torchrun sets LOCAL_RANK)")
    p.add_argument("--logger", action="append", choices=LOGGERS, default=[], help="also log to a tracker (repeatable)")
    p.add_argument("--deterministic", nargs="?", const="scoped", default="scoped", choices=MODES,
                   help="determinism mode (default scoped; off must be asked for; see docs/determinism.md)")
    return p


# ---------------------------------------------------------------------------------------- options

TRAIN_RULES = OptionRules(positive=("epochs", "imgsz"), non_negative=("patience", "workers", "save_interval"),
                          files=("cfg", "hyp", "weights"), choices=(("cache", (None, "ram", "disk")),),
                          repo_yamls=("cfg", "hyp", "data"))
RESUME_MAY_DIFFER = {"device", "workers", "local_rank", "resume", "save_interval", "logger", "patience"}
# the rules of TRAIN_RULES on flags a resume may change (the checkpoint's own values passed them when it began)
RESUME_RULES = OptionRules(non_negative=TRAIN_RULES.non_negative)


def resolve_options(opt, argv=None):
    """Check the flags, resolve --resume, and choose the run folder. Returns (opt, resume_ckpt)."""
    if opt.resume and opt.evolve:
        raise UserError(f"--resume {opt.resume} does not apply to --evolve; to continue an evolution, rerun it "
                        "with the same --project and --name and with --exist-ok (it continues from evolve.csv)")
    if opt.resume:
        return resume_options(opt, argv)
    if not opt.cfg and not opt.weights:
        raise UserError("--cfg is required when training from scratch (--weights ''), e.g. --cfg models/ffca-yolo.yaml")
    check_options(opt, TRAIN_RULES)
    if opt.batch_size == 0 or opt.batch_size < -1:
        raise UserError(f"--batch-size {opt.batch_size}: must be positive, or -1 for AutoBatch")
    project = Path(opt.project)
    if opt.evolve and project == DEFAULT_PROJECT:
        project = ROOT / "runs" / "evolve"  # YOLOv5's folder for evolution runs
    opt.save_dir = str(increment_path(project / opt.name, exist_ok=opt.exist_ok))
    return opt, None


def resume_options(opt, argv=None):
    """Load the checkpoint named by --resume (or the latest) and restore its options."""
    path = Path(opt.resume) if isinstance(opt.resume, str) else latest_checkpoint(ROOT / "runs")
    if path.is_dir():
        path = path / "weights" / "last.pt"
    check_run_folder_free(path.parent.parent, f"--resume {path}")
    ckpt = load_checkpoint(path)
    if ckpt.get("finished") or "optimizer" not in ckpt or ckpt.get("optimizer") is None:
        raise UserError(f"--resume {path}: that run finished; there is nothing to resume "
                        "(start a new run with --weights to fine-tune from it)")
    typed = typed_flags(build_parser(), sys.argv[1:] if argv is None else argv)
    # flags added since the checkpoint was written take their defaults, which is how that run was trained
    saved = check_options(merge_resumed_options({**vars(parse_opt([])), **ckpt["opt"]}, typed, RESUME_MAY_DIFFER),
                          RESUME_RULES)
    saved.resume = str(path)
    saved.weights = str(path)
    saved.save_dir = str(path.parent.parent)
    return saved, ckpt


def load_hyp(opt) -> dict:
    hyp = yaml_load(opt.hyp) if isinstance(opt.hyp, (str, Path)) else dict(opt.hyp)
    if not isinstance(hyp, dict):
        raise UserError(f"--hyp {opt.hyp}: expected a mapping of hyperparameters, e.g. data/hyps/hyp.scratch-low.yaml")
    missing = [k for k in META if not isinstance(hyp.get(k), (int, float)) or isinstance(hyp.get(k), bool)]
    if missing:
        raise UserError(f"--hyp {opt.hyp}: missing or non-numeric {', '.join(missing)}; see {DEFAULT_HYP.name}")
    hyp["label_smoothing"] = opt.label_smoothing  # the flag wins, as in YOLOv5
    return with_extra_hyp(hyp, f"--hyp {opt.hyp}")


# ---------------------------------------------------------------------------------------- build


def build_model(opt, hyp: dict, nc: int, names: list, device, resume_ckpt):
    """Build the model from --cfg (or the checkpoint's config) and load weights when given."""
    if resume_ckpt is not None:
        model = stored_model(resume_ckpt, float_weights(resume_ckpt["model"]), f"--resume {opt.resume}").to(device)
        if resume_ckpt.get("ema") is not None:  # loaded later by the training loop; checked now, before any folder
            check_fit(model, float_weights(resume_ckpt["ema"]), f"--resume {opt.resume}")
    elif opt.weights:
        ckpt = load_checkpoint(opt.weights)
        cfg = opt.cfg or ckpt["model_cfg"]
        model = Model(cfg, ch=3, nc=nc, anchors=hyp.get("anchors")).to(device)
        source = inference_weights(ckpt, opt.weights)
        exclude = ["anchor"] if (opt.cfg or hyp.get("anchors")) else []
        matched = intersect_dicts(source, model.state_dict(), exclude=exclude)
        model.load_state_dict(matched, strict=False)
        LOGGER.info(f"Transferred {len(matched)}/{len(model.state_dict())} items from {opt.weights}")
    else:
        model = Model(opt.cfg, ch=3, nc=nc, anchors=hyp.get("anchors")).to(device)
    model.names = list(names)
    model.nc = nc
    return model


# ---------------------------------------------------------------------------------------- train


@dataclass(frozen=True)
class RunContext:
    """One training run's settings and collaborators, built once (complete) by :func:`train`, read by the loop."""

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
    results_log: ResultsLog
    saver: CheckpointSaver

    @property
    def weights_dir(self) -> Path:
        return self.save_dir / "weights"

    @property
    def nc(self) -> int:
        return len(self.names)


def train(hyp: dict, opt, device, dist: DistInfo, resume_ckpt=None):
    """Train one model; returns the final (P, R, mAP50, mAP50-95, box, obj, cls) of the last validation."""
    hyp = dict(hyp)
    policy = configure_determinism(opt.deterministic, opt.seed, dist.rank)
    LOGGER.info(colorstr("hyperparameters: ") + ", ".join(f"{k}={v}" for k, v in hyp.items()))

    data_dict = check_dataset(opt.data)
    names = ["item"] if opt.single_cls else list(data_dict["names"])
    model = build_model(opt, hyp, len(names), names, device, resume_ckpt)
    freeze_layers(model, opt.freeze)
    amp = amp_for_run(model, resume_ckpt)
    grid_size = max(int(model.stride.max()), 32)
    imgsz = check_img_size(opt.imgsz, grid_size, floor=grid_size * 2)
    opt.train_tiles = resolve_tile_size(getattr(opt, "train_tiles", None), data_dict, grid_size, resume_ckpt, opt.rect)
    audit, audit_path = start_up_audit(policy, model, imgsz, device, hyp, amp)  # before AutoBatch's trial backward
    if opt.batch_size == -1:
        opt.batch_size = check_train_batch_size(model, imgsz, amp, policy=policy)  # recorded, so a resume keeps it
    per_rank_batch = per_rank_batch_size(opt, dist)
    train_loader, dataset, val_loader = build_loaders(opt, data_dict, imgsz, per_rank_batch, dist, hyp, grid_size)
    # only now: bad options, data (an empty val list too) or model YAMLs leave no run folder behind
    save_dir = claim_run_folder(opt) if dist.is_main else Path(opt.save_dir)
    ctx = RunContext(opt=opt, device=device, dist=dist, policy=policy, save_dir=save_dir, data_dict=data_dict,
                     names=names, imgsz=imgsz, batch_size=opt.batch_size, per_rank_batch=per_rank_batch,
                     plots=not opt.evolve and not opt.noplots, train_loader=train_loader, val_loader=val_loader,
                     results_log=ResultsLog(save_dir / "results.csv"),
                     saver=CheckpointSaver.for_run(save_dir, opt, resume_ckpt))
    with held_run_folder(opt, hyp, dist.is_main):
        loop = start_loop(ctx, model, hyp, amp, dataset, resume_ckpt, audit, audit_path)
        with start_tracking(opt, save_dir, dist.is_main, loop.start_epoch) as ctx.results_log.mirror, \
                out_of_memory_hint("training", per_rank_batch, imgsz, device, saved=ctx.saver.describe):
            return report_run_end(ctx, loop, *loop.run())


def start_loop(ctx: RunContext, model, hyp: dict, amp: bool, dataset, resume_ckpt, audit, audit_path) -> "TrainLoop":
    """The training loop at its first step: a new run's labels and anchors checked, or a resumed run's state
    restored (its random state last: start-up work may draw numbers); determinism.json written."""
    if resume_ckpt is None:
        prepare_new_run(dataset, model, hyp, ctx)
        hyp = resolve_nwd_constant(hyp, dataset.labels, dataset.shapes, ctx.imgsz,
                                   ctx.dist.is_main and ctx.save_dir / "hyp.yaml",
                                   scale=box_scale(dataset.shapes, ctx.opt.train_tiles))
    loop = TrainLoop(ctx, model, hyp, amp)
    if resume_ckpt is not None:
        loop.restore(resume_ckpt)
        ctx.results_log.truncate(loop.start_epoch)
        LOGGER.info(f"Resuming {ctx.opt.weights} from epoch {loop.start_epoch}, batch {loop.start_batch}")
    loop.wrap_ddp()
    if ctx.dist.is_main:
        write_json(ctx.save_dir / "determinism.json", determinism_report(
            policy=ctx.policy, audit=audit, audit_path=audit_path, opt=ctx.opt, dist=ctx.dist, dataset=dataset,
            device=ctx.device))
    if resume_ckpt is not None:
        set_rng_state(resume_ckpt["rng"], rank=ctx.dist.rank, device=ctx.device)
    return loop


def report_run_end(ctx: RunContext, loop, results, last_epoch):
    """After the loop: exit on an interrupt, else finish the run on the main process; returns results."""
    if loop.interrupted:
        exit_after_interrupt(loop.interrupt_code, ctx.saver.describe(), ctx.saver.resume_command(ctx.dist.world_size),
                             ctx.dist.is_main)
    if ctx.dist.is_main:
        LOGGER.info(f"\n{last_epoch - loop.start_epoch + 1} epochs completed in {loop.elapsed_hours:.3f} hours.")
        final = (last_epoch + 1, 0) if loop.start_epoch < ctx.opt.epochs else (loop.start_epoch, loop.start_batch)
        results, final_file = finish_run(ctx, final, results)
        LOGGER.info(f"Results saved to {colorstr('bold', ctx.save_dir)}")
        LOGGER.info(f"{colorstr('guarantee: ')}{run_guarantee(ctx.policy)}")
        if not ctx.opt.evolve:
            LOGGER.info(next_steps(final_file, ctx.opt.data, ctx.data_dict["val"], ctx.imgsz, results))
    barrier(ctx.dist)
    return results


def build_loaders(opt, data_dict: dict, imgsz: int, per_rank_batch: int, dist: DistInfo, hyp: dict, grid_size: int):
    """Training loader (sharded under DDP) and, on the main process, the validation loader."""
    nc = data_dict["nc"]
    train_loader, dataset = create_dataloader(
        data_dict["train"], imgsz, per_rank_batch, grid_size, single_cls=opt.single_cls, hyp=hyp,
        augment=True, cache=opt.cache, rect=opt.rect, rank=dist.rank, workers=opt.workers,
        image_weights=opt.image_weights, quad=opt.quad, prefix=colorstr("train: "), shuffle=True, seed=opt.seed,
        nc=nc, train_tiles=opt.train_tiles, reduced_decode=opt.reduced_decode)
    val_loader = None
    if dist.is_main:
        val_loader = create_dataloader(
            data_dict["val"], imgsz, per_rank_batch * 2, grid_size, single_cls=opt.single_cls, hyp=hyp,
            cache=None if opt.noval else opt.cache, rect=True, rank=-1, workers=opt.workers * 2, pad=0.5,
            prefix=colorstr("val: "), seed=opt.seed, nc=nc, reduced_decode=opt.reduced_decode)[0]
    return train_loader, dataset, val_loader


def prepare_new_run(dataset, model, hyp: dict, ctx: RunContext) -> None:
    """AutoAnchor (anchors then live in the model, so checkpoints carry them) and labels.jpg."""
    if not ctx.opt.noautoanchor:
        check_anchors(dataset, model=model, thr=hyp["anchor_t"], imgsz=ctx.imgsz, seed=ctx.opt.seed,
                      scale=box_scale(dataset.shapes, ctx.opt.train_tiles))
    elif isinstance(model.yaml.get("anchors"), int):
        LOGGER.warning("--noautoanchor with 'anchors: N' in the model YAML: training with placeholder anchors")
    if ctx.plots and ctx.dist.is_main:
        labels = [lb for lb in dataset.labels if len(lb)]
        plot_labels(np.concatenate(labels, 0) if labels else np.zeros((0, 5)), ctx.names, ctx.save_dir)


class TrainLoop:
    """The optimisation loop and its state (model, EMA, optimizer, scheduler, scaler, early stopping)."""

    def __init__(self, ctx: RunContext, model, hyp: dict, amp: bool):
        self.ctx, self.opt, self.device, self.dist, self.amp = ctx, ctx.opt, ctx.device, ctx.dist, amp
        # channels-last convolutions are ~1.4x faster for YOLOv5n on CPU (oneDNN) and suit tensor cores
        self.model = model.to(memory_format=torch.channels_last)
        self.hyp_for_checkpoint = dict(hyp)
        hyp = dict(hyp)
        self.accumulate_nbs = max(round(NOMINAL_BATCH / ctx.batch_size), 1)
        hyp["weight_decay"] *= ctx.batch_size * self.accumulate_nbs / NOMINAL_BATCH
        self.optimizer = smart_optimizer(model, self.opt.optimizer, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
        self.lf = lr_lambda(hyp["lrf"], self.opt.epochs, self.opt.cos_lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.ema = ModelEMA(model) if ctx.dist.is_main else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp)
        self.stopper = EarlyStopping(patience=self.opt.patience)
        self.hyp = scale_loss_gains(hyp, model.model[-1].nl, ctx.nc, ctx.imgsz)
        self.grid_size = max(int(model.stride.max()), 32)
        self.progress_every = 10 if self.device.type == "cuda" else 1  # the text reads losses: waits for the GPU
        self.start_epoch, self.start_batch, self.best_fitness, self.last_opt_step = 0, 0, 0.0, -1
        self.mloss = torch.zeros(3, device=self.device)
        self.interrupted, self.interrupt_code, self.elapsed_hours = False, 0, 0.0
        self.stop_signal = 0  # the signal any rank received, shared by all ranks at each batch
        self.compute_loss, self.n_warmup = None, 0
        self.sigkill_after = sigkill_after_batch()

    def restore(self, ckpt) -> None:
        (self.start_epoch, self.start_batch, self.best_fitness, self.last_opt_step,
         self.mloss) = restore_training_state(
            ckpt, model=self.model, ema=self.ema, optimizer=self.optimizer, scheduler=self.scheduler,
            scaler=self.scaler, stopper=self.stopper, device=self.device, world_size=self.dist.world_size)

    def wrap_ddp(self) -> None:
        if not self.dist.enabled:
            return
        cuda = self.device.type == "cuda"
        if self.opt.sync_bn and not cuda:
            LOGGER.warning("--sync-bn needs CUDA devices (SyncBatchNorm has no CPU kernel); ignored")
        elif self.opt.sync_bn:
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model).to(self.device)
            LOGGER.info("Using SyncBatchNorm()")
        self.model = DDP(self.model, device_ids=[self.dist.local_rank] if cuda else None,
                         output_device=self.dist.local_rank if cuda else None)
        if self.ctx.policy.mode != "off":  # reproducible sums at any world size, also across a resume
            self.model.register_comm_hook(None, rank_ordered_mean_hook)

    def gather_cuda_rng(self) -> list:
        """Every rank's CUDA generator state on its training device, for the checkpoint (all ranks must
        call it); not the current device's, which ``train.run(device="1")`` may not have changed."""
        return gather_objects(cuda_rng_state(self.device), self.dist)

    def state(self, position, cuda_rng=None) -> dict:
        """The resumable training state at ``position = (epoch, next_batch)``."""
        return training_state(
            model=self.model, ema=self.ema, optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler,
            stopper=self.stopper, position=position, best_fitness=self.best_fitness,
            last_opt_step=self.last_opt_step, mloss=self.mloss, opt=self.opt, hyp=self.hyp_for_checkpoint,
            world_size=self.dist.world_size, cuda_rng_by_rank=cuda_rng)

    def run(self):
        """All epochs; returns (last validation results, last epoch index)."""
        self.compute_loss = ComputeLoss(de_parallel(self.model), self.hyp)
        nb = len(self.ctx.train_loader)
        self.n_warmup = max(round(self.hyp["warmup_epochs"] * nb), 100) if self.hyp["warmup_epochs"] > 0 else 0
        results, finished, epoch, t0 = (0, 0, 0, 0, 0, 0, 0), True, self.start_epoch, time.time()
        with GracefulInterrupt(describe_saved=self.ctx.saver.describe,
                               launcher_passes_signals_on=launched_by_torchrun()) as interrupt:
            self.announce()
            for epoch in range(self.start_epoch, self.opt.epochs):
                first_batch = self.start_batch if epoch == self.start_epoch else 0
                finished = self.train_epoch(epoch, first_batch, interrupt)
                if not finished:
                    break
                lr = [group["lr"] for group in self.optimizer.param_groups]
                self.scheduler.step()
                stop, cuda_rng = False, self.gather_cuda_rng()
                if self.dist.is_main:
                    results, stop = self.end_epoch(epoch, lr, cuda_rng)
                stop = bool(broadcast_object(stop, self.dist))
                if self.interrupted or stop:
                    break
            # a rank stopped by another rank's signal exits as that rank does (128 + the signal), not with 1
            self.interrupt_code = 128 + self.stop_signal if self.stop_signal else interrupt.exit_code
        if self.interrupted and finished and epoch + 1 == self.opt.epochs:
            self.interrupted = False  # the signal came during the last batch: the run is complete
        self.elapsed_hours = (time.time() - t0) / 3600
        return results, epoch

    def announce(self) -> None:
        LOGGER.info(f"Image sizes {self.ctx.imgsz} train, {self.ctx.imgsz} val\n"
                    f"Using {self.ctx.train_loader.num_workers} dataloader workers\n"
                    f"Logging results to {colorstr('bold', self.ctx.save_dir)}\n"
                    f"Starting training for {self.opt.epochs} epochs...")

    def train_epoch(self, epoch: int, first_batch: int, interrupt) -> bool:
        """One epoch from ``first_batch``; False if an interrupt stopped it before its last batch."""
        ctx, main = self.ctx, self.dist.is_main
        loader, nb = ctx.train_loader, len(ctx.train_loader)
        self.model.train()
        if first_batch == 0:
            self.mloss = torch.zeros(3, device=self.device)
            self.optimizer.zero_grad()  # YOLOv5 drops an epoch's unfinished accumulation
        loader.set_epoch(epoch, start_batch=first_batch)
        if main:
            LOGGER.info(("\n" + "%11s" * 7) % ("Epoch", "GPU_mem", "box_loss", "obj_loss", "cls_loss",
                                              "Instances", "Size"))
        pbar = tqdm(enumerate(loader, start=first_batch), total=nb, initial=first_batch, disable=not main,
                    bar_format="{l_bar}{bar:10}{r_bar}")
        for i, (imgs, targets, paths, _) in pbar:
            loss_items = self.train_step(imgs, targets, epoch, i, nb)
            self.mloss = (self.mloss * i + loss_items) / (i + 1)
            if main:
                self.show_progress(pbar, epoch, imgs, targets, paths, i, nb)
            interval_save = main and ctx.saver.interval_due() and not self.opt.nosave
            self.stop_signal, save_now = max_over_ranks([interrupt.requested, interval_save], self.dist)
            self.interrupted = bool(self.stop_signal)
            if self.interrupted and not interrupt.requested and main:
                LOGGER.warning(f"{signal.Signals(self.stop_signal).name} received by another rank: "
                               "stopping after this step on every rank")
            if i + 1 < nb and (self.interrupted or save_now):
                cuda_rng = self.gather_cuda_rng()
                if main:
                    ctx.saver.save_last(self.state((epoch, i + 1), cuda_rng), required=not self.interrupted)
                if self.interrupted:
                    return False
            if epoch == 0 and i + 1 == self.sigkill_after and i + 1 < nb:
                cuda_rng = self.gather_cuda_rng()
                if main:
                    ctx.saver.save_last(self.state((epoch, i + 1), cuda_rng), required=True)
                os.kill(os.getpid(), signal.SIGKILL)
        return True

    def show_progress(self, pbar, epoch: int, imgs, targets, paths, i: int, nb: int) -> None:
        """Progress text every ``progress_every`` batches and at the last; epoch 0's first 3 batches drawn."""
        if i % self.progress_every == 0 or i + 1 == nb:
            memory = f"{torch.cuda.memory_reserved() / 1e9 if torch.cuda.is_available() else 0:.3g}G"
            pbar.set_description(("%11s" * 2 + "%11.4g" * 5) % (
                f"{epoch}/{self.opt.epochs - 1}", memory, *self.mloss, targets.shape[0], imgs.shape[-1]))
        if self.ctx.plots and epoch == 0 and i < 3:
            plot_images(imgs, targets, paths, self.ctx.save_dir / f"train_batch{i}.jpg", self.ctx.names)

    def train_step(self, imgs, targets, epoch: int, i: int, nb: int):
        """Forward, scoped backward, and an optimizer step when enough gradient has accumulated."""
        ni = i + nb * epoch
        imgs = imgs.to(self.device, non_blocking=True).float().div_(255)
        imgs = imgs.contiguous(memory_format=torch.channels_last)
        accumulate = self.accumulate_nbs
        if ni < self.n_warmup:
            accumulate = apply_warmup(self.optimizer, ni, self.n_warmup, epoch, self.lf, self.hyp, self.accumulate_nbs)
        if self.opt.multi_scale:
            imgs = random_rescale(imgs, self.ctx.imgsz, self.grid_size, self.opt.seed, epoch, i)
        with torch.autocast(self.device.type, enabled=self.amp):
            pred = self.model(imgs)
            loss, loss_items = self.compute_loss(pred, targets.to(self.device, non_blocking=True))
            if self.dist.enabled:
                loss *= self.dist.world_size
            if self.opt.quad:
                loss *= 4.0
        with self.ctx.policy.backward_scope():
            self.scaler.scale(loss).backward()
        if ni - self.last_opt_step >= accumulate:
            optimizer_step(self.model, self.optimizer, self.scaler, self.ema)
            self.last_opt_step = ni
        return loss_items

    def end_epoch(self, epoch: int, lr: list, cuda_rng):
        """Validate, log results.csv, early-stop check, save checkpoints (main process only)."""
        ctx, opt = self.ctx, self.opt
        self.ema.update_attr(de_parallel(self.model), include=["yaml", "nc", "names", "stride"])
        final_epoch = epoch + 1 == opt.epochs or self.stopper.possible_stop
        results, bands = (0, 0, 0, 0, 0, 0, 0), None
        if not opt.noval or final_epoch:
            checked = validate.run(
                ctx.data_dict, batch_size=ctx.per_rank_batch, imgsz=ctx.imgsz, half=self.amp, model=self.ema.ema,
                single_cls=opt.single_cls, dataloader=ctx.val_loader, save_dir=ctx.save_dir, plots=False,
                compute_loss=self.compute_loss, names=ctx.names, size_bands=True)
            results, bands = checked.metrics, checked.bands
        fi = float(fitness(np.array(results).reshape(1, -1))[0])
        stop = self.stopper(epoch=epoch, fitness=fi)
        self.best_fitness = max(self.best_fitness, fi)
        improved = fi == self.best_fitness  # YOLOv5 also rewrites best.pt on a tie
        ctx.results_log.append(epoch, [*self.mloss.tolist(), *results, *lr, *band_row(bands)])
        if not opt.nosave or final_epoch or stop or self.interrupted:
            ctx.saver.save_epoch(self.state((epoch + 1, 0), cuda_rng), epoch, improved)
        return results, stop


def finish_run(ctx: RunContext, final: tuple, results):
    """Check the final weights are on disk (else stop with one line), strip them, record their checksum,
    validate best.pt (or last.pt) with plots, draw results.png. Returns (results, the final weights file)."""
    final_file = ctx.saver.finish(final)
    if not ctx.opt.evolve:
        LOGGER.info(f"\nValidating {final_file}...")
        model = attempt_load(final_file, device=ctx.device, fuse=True)
        results = validate.run(
            ctx.data_dict, batch_size=ctx.per_rank_batch * 2, imgsz=ctx.imgsz, model=model, half=False,
            single_cls=ctx.opt.single_cls, save_dir=ctx.save_dir, plots=ctx.plots, verbose=len(ctx.names) < 50,
            names=ctx.names).metrics
    if ctx.plots:
        plot_results(ctx.save_dir / "results.csv")
    return results, final_file


# ---------------------------------------------------------------------------------------- main


def main(opt, argv=None):
    """Resolve options, set up devices (and DDP), then train or evolve."""
    dist = dist_info_from_env(opt.local_rank)
    opt, resume_ckpt = resolve_options(opt, argv)
    check_loggers(opt)  # a missing package stops here, before any folder is made
    sigkill_after_batch()  # so does a bad value of this test-only variable (the loop reads it again)
    hyp = load_hyp(opt) if resume_ckpt is None else dict(resume_ckpt["hyp"])
    prepare_cuda_environment(opt.deterministic)  # cuBLAS reads it when CUDA starts, i.e. in select_device
    device = select_device(opt.device, batch_size=opt.batch_size)
    if dist.enabled:
        check_ddp_batch(opt.batch_size, dist.world_size)
        device = torch.device("cuda", dist.local_rank) if device.type == "cuda" else torch.device("cpu")
        init_process_group(dist, device)
    try:
        if opt.evolve:
            if dist.enabled:
                raise UserError("--evolve is not supported with DDP; run it on one device")
            return evolve(hyp, opt, lambda trial_hyp, trial_opt: train(trial_hyp, trial_opt, device, dist))
        with exit_on_lost_peer(dist):
            return train(hyp, opt, device, dist, resume_ckpt)
    finally:
        destroy_process_group(dist)


def run(**kwargs):
    """Python API: ``train.run(data='data/shapes.yaml', cfg='models/ffca-yolo-n.yaml', imgsz=256)``; the keywords
    are the flags' names (see OneLineErrorParser.parse_keywords)."""
    return main(build_parser().parse_keywords(kwargs, "train.run"), argv=[])


@exit_on_user_error
def cli():
    main(parse_opt())


if __name__ == "__main__":
    cli()
