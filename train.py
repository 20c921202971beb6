"""Train a YOLOv5 / FFCA-YOLO detector on a YOLO-format data set.

Usage (YOLOv5's flags and meanings):
    python train.py --data data/shapes.yaml --cfg models/ffca-yolo.yaml --imgsz 640 --epochs 100
    python train.py --resume                       # continue the most recent run under runs/
    torchrun --nproc_per_node 2 train.py --device 0,1 --data D.yaml --cfg models/ffca-yolo.yaml
    python train.py ... --deterministic strict     # determinism mode: scoped (default) | strict | warn | off
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import val as validate
from models.backends import load_backend
from models.experimental import check_blocks_registered, check_fit, stored_model
from models.yolo import Model
from utils.autoanchor import check_anchors
from utils.autobatch import check_train_batch_size
from utils.batch_invariance import aligned_batch_size, eval_micro_batch
from utils.callbacks import Callbacks
from utils.dataloaders import create_dataloader
from utils.dataset.data_config import check_dataset
from utils.dataset.tiles import box_scale, resolve_tile_size
from utils.ddp import (DistInfo, barrier, check_ddp_batch, destroy_process_group, dist_info_from_env, refused_alike,
                       init_process_group, per_rank_batch_size)
from utils.determinism.audit_cache import start_up_audit
from utils.determinism.machine import check_resumed_machine
from utils.determinism.reproducibility import determinism_report, run_guarantee, write_json
from utils.errors import UserError, exit_on_user_error
from utils.extra_hyps import resolve_nwd_constant, with_extra_hyp
from utils.files import increment_path, yaml_load
from utils.logging import LOGGER, colorstr
from utils.metrics import ValMetrics
from utils.ops import check_img_size
from utils.options import (TRAIN_UPSTREAM_FLAGS, OneLineErrorParser, OptionRules, add_shared_flags, check_options,
                           merge_resumed_options, typed_flags)
from utils.out_of_memory import TRAIN_ADVICE, out_of_memory_anywhere, out_of_memory_hint
from utils.plots import plot_labels, plot_results
from utils.rng_state import set_rng_state
from utils.stop_signals import exit_on_stop_signal, stop_stage
from utils.torch_utils import (MODES, configure_determinism, freeze_layers, grid_size, intersect_dicts,
                               prepare_cuda_environment, select_device)
from utils.tracking import LOGGERS, check_loggers, start_tracking
from utils.user_modules import load_user_modules
from utils.training.amp import amp_for_run
from utils.training.checkpoints import float_weights, inference_weights, load_checkpoint
from utils.training.evolve import META, evolve
from utils.training.hooks import run_callbacks, training_hooks
from utils.training.interrupts import exit_after_interrupt
from utils.training.loop import RunContext, TrainLoop
from utils.training.lost_peer import exit_on_lost_peer
from utils.training.micro_batches import check_micro_batch
from utils.training.next_steps import next_steps
from utils.training.nonfinite import NAN_POLICIES
from utils.training.results_log import ResultsLog
from utils.training.run_folder import check_run_folder_free, claim_run_folder, held_run_folder, latest_checkpoint
from utils.training.run_state import CheckpointSaver

ROOT = Path(__file__).resolve().parent
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
    p.add_argument("--nan-policy", choices=NAN_POLICIES, default="stop",
                   help="a batch with a NaN/inf loss: stop (save the state before it) or skip it (counted)")
    p.add_argument("--micro-batch", type=int, default=0, metavar="N",
                   help="split each batch into micro-batches of N images: the same result on 1, 2, 4... processes")
    p.add_argument("--seed", type=int, default=0, help="global training seed")
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="DDP rank (torchrun sets LOCAL_RANK)")
    p.add_argument("--logger", action="append", choices=LOGGERS, default=[], help="also log to a tracker (repeatable)")
    p.add_argument("--deterministic", nargs="?", const="scoped", default="scoped", choices=MODES,
                   help="determinism mode (default scoped; off must be asked for; see docs/determinism.md)")
    return p


# ---------------------------------------------------------------------------------------- options

TRAIN_RULES = OptionRules(positive=("epochs", "imgsz"),
                          non_negative=("patience", "workers", "save_interval", "micro_batch"),
                          files=("cfg", "hyp", "weights"), choices=(("cache", (None, "ram", "disk")),),
                          repo_yamls=("cfg", "hyp", "data"))
RESUME_MAY_DIFFER = {"device", "workers", "local_rank", "resume", "save_interval", "logger", "patience", "nan_policy",
                     "modules"}
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
        check_blocks_registered(ckpt, cfg, f"--weights {opt.weights}")
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


def train(hyp: dict, opt, device, dist: DistInfo, resume_ckpt=None, callbacks: Callbacks | None = None):
    """Train one model; returns the final (P, R, mAP50, mAP50-95, box, obj, cls) of the last validation.

    ``callbacks``: the user's :class:`utils.callbacks.Callbacks`, run on the main process (docs/training.md)."""
    hyp = dict(hyp)
    user_callbacks = Callbacks().extended(callbacks if dist.is_main else None)
    user_callbacks.run("on_pretrain_routine_start")
    policy = configure_determinism(opt.deterministic, opt.seed, dist.rank)
    LOGGER.info(colorstr("hyperparameters: ") + ", ".join(f"{k}={v}" for k, v in hyp.items()))

    data_dict = check_dataset(opt.data)
    names = ["item"] if opt.single_cls else list(data_dict["names"])
    model = build_model(opt, hyp, len(names), names, device, resume_ckpt)
    freeze_layers(model, opt.freeze)
    amp = amp_for_run(model, resume_ckpt, dist)
    grid = grid_size(model)
    imgsz = check_img_size(opt.imgsz, grid, floor=grid * 2)
    opt.train_tiles = resolve_tile_size(getattr(opt, "train_tiles", None), data_dict, grid, resume_ckpt, opt.rect)
    audit, audit_path = start_up_audit(policy, model, imgsz, device, hyp, amp)  # before AutoBatch's trial backward
    if opt.batch_size == -1:
        opt.batch_size = check_train_batch_size(model, imgsz, amp, policy=policy)  # recorded, so a resume keeps it
    per_rank_batch = opt.micro_batch or per_rank_batch_size(opt, dist)
    train_loader, dataset, val_loader = build_loaders(opt, data_dict, imgsz, per_rank_batch, dist, hyp, grid,
                                                     device)
    # only now: bad options, data (an empty val list too) or model YAMLs leave no run folder behind
    save_dir = claim_run_folder(opt) if dist.is_main else Path(opt.save_dir)
    ctx = RunContext(opt=opt, device=device, dist=dist, policy=policy, save_dir=save_dir, data_dict=data_dict,
                     names=names, imgsz=imgsz, batch_size=opt.batch_size, per_rank_batch=per_rank_batch,
                     plots=not opt.evolve and not opt.noplots, train_loader=train_loader, val_loader=val_loader,
                     saver=CheckpointSaver.for_run(save_dir, opt, resume_ckpt), validate=validate.run)
    trained = False  # a stop after the loop names the weights on disk
    with stop_stage(lambda: after_training(ctx) if trained else None), held_run_folder(opt, hyp, dist.is_main):
        results_log = ResultsLog(save_dir / "results.csv")
        loop = start_loop(ctx, model, hyp, amp, dataset, resume_ckpt, audit, audit_path, results_log)
        user_callbacks.run("on_pretrain_routine_end", dataset_labels(dataset), names)
        with start_tracking(opt, save_dir, dist.is_main, loop.start_epoch) as trackers, \
                out_of_memory_hint("training", per_rank_batch, imgsz, device, saved=ctx.saver.describe):
            if dist.is_main:
                own = run_callbacks(results_log, trackers, ctx.plots, save_dir, names)
                loop.callbacks = own.extended(user_callbacks)
            outcome = loop.run(training_hooks(loop))
            trained = True
            return report_run_end(ctx, loop, *outcome)


def dataset_labels(dataset) -> np.ndarray:
    """All training labels (class, x, y, w, h) in one array, as YOLOv5 passes them to its callbacks."""
    labels = [lb for lb in dataset.labels if len(lb)]
    return np.concatenate(labels, 0) if labels else np.zeros((0, 5))


def start_loop(ctx: RunContext, model, hyp: dict, amp: bool, dataset, resume_ckpt, audit, audit_path,
               results_log: ResultsLog) -> TrainLoop:
    """The training loop at its first step: a new run's labels and anchors checked, or a resumed run's state
    restored (its random state last: start-up work may draw numbers); determinism.json written."""
    if resume_ckpt is None:
        prepare_new_run(dataset, model, hyp, ctx)
        hyp = resolve_nwd_constant(hyp, dataset.labels, dataset.shapes, ctx.imgsz,
                                   ctx.dist.is_main and ctx.save_dir / "hyp.yaml",
                                   scale=box_scale(dataset.shapes, ctx.opt.train_tiles))
    loop = TrainLoop(ctx, model, hyp, amp)
    if resume_ckpt is not None:
        with refused_alike(ctx.dist):  # a mid-epoch checkpoint of another world size
            loop.restore(resume_ckpt)
        results_log.truncate(loop.start_epoch)
        LOGGER.info(f"Resuming {ctx.opt.weights} from epoch {loop.start_epoch}, batch {loop.start_batch}")
    loop.wrap_ddp()
    if ctx.dist.is_main:
        report = determinism_report(policy=ctx.policy, audit=audit, audit_path=audit_path, opt=ctx.opt,
                                    dist=ctx.dist, dataset=dataset, device=ctx.device)
        if resume_ckpt is not None:
            report = check_resumed_machine(ctx.save_dir / "determinism.json", report,
                                           (loop.start_epoch, loop.start_batch))
        write_json(ctx.save_dir / "determinism.json", report)
    if resume_ckpt is not None:
        set_rng_state(resume_ckpt["rng"], rank=ctx.dist.rank, device=ctx.device)
    return loop


def report_run_end(ctx: RunContext, loop: TrainLoop, results, last_epoch):
    """After the loop: exit on an interrupt, else finish the run on the main process; returns results."""
    if loop.interrupted:
        exit_after_interrupt(loop.interrupt_code, ctx.saver.describe(), ctx.saver.resume_command(ctx.dist.world_size),
                             ctx.dist.is_main)
    results = results if results is not None else ValMetrics()
    if loop.stop_request:
        on_disk, resume = loop.saved_on_disk()
        if ctx.dist.is_main:
            LOGGER.warning(f"Training stopped early: {loop.stop_request} set stop_training. {on_disk}"
                           + (f" Resume with: {resume}" if resume else ""))
        return results
    if ctx.dist.is_main:
        LOGGER.info(f"\n{last_epoch - loop.start_epoch + 1} epochs completed in {loop.elapsed_hours:.3f} hours.")
        final = (last_epoch + 1, 0) if loop.start_epoch < ctx.opt.epochs else (loop.start_epoch, loop.start_batch)
        results, final_file = finish_run(ctx, final, results)
        LOGGER.info(f"Results saved to {colorstr('bold', ctx.save_dir)}")
        LOGGER.info(f"{colorstr('guarantee: ')}{run_guarantee(ctx.policy)}")
        if not ctx.opt.evolve:
            LOGGER.info(next_steps(final_file, ctx.opt.data, ctx.data_dict["val"], ctx.imgsz, results,
                                   ctx.opt.single_cls, ctx.opt.modules))
        best = ctx.saver.best if ctx.saver.best.is_file() else None
        loop.callbacks.run("on_train_end", ctx.saver.last, best, last_epoch, results)
    barrier(ctx.dist)
    return results


def after_training(ctx: RunContext) -> str:
    """What a stop after the training loop (final validation, plots, callbacks) leaves: the weights, as on disk."""
    resume = ctx.saver.resume_command(ctx.dist.world_size)
    return f"after training finished. {ctx.saver.describe()}" + (f" Finish the run with: {resume}" if resume else "")


def before_first_step(opt) -> str:
    """What a stop before the training loop (start-up, audit, data scan) leaves on disk."""
    if opt.evolve:
        return f"during --evolve; the finished generations are in {Path(opt.save_dir) / 'evolve.csv'}"
    if opt.resume:
        return f"before its first step; {opt.resume} is unchanged and resumes as before"
    return "before its first step; no checkpoint was written"


def build_loaders(opt, data_dict: dict, imgsz: int, per_rank_batch: int, dist: DistInfo, hyp: dict, grid: int,
                  device):
    """Training loader (sharded under DDP) and, on the main process, the validation loader: twice the batch,
    rounded up to whole forward passes on ``device`` (utils/batch_invariance.py)."""
    nc = data_dict["nc"]
    train_loader, dataset = create_dataloader(
        data_dict["train"], imgsz, per_rank_batch, grid, single_cls=opt.single_cls, hyp=hyp,
        augment=True, cache=opt.cache, rect=opt.rect, rank=dist.rank, workers=opt.workers,
        image_weights=opt.image_weights, quad=opt.quad, prefix=colorstr("train: "), shuffle=True, seed=opt.seed,
        nc=nc, train_tiles=opt.train_tiles, reduced_decode=opt.reduced_decode,
        global_batch=opt.batch_size if opt.micro_batch else 0)
    val_loader = None
    if dist.is_main:
        val_batch = aligned_batch_size(per_rank_batch * 2, eval_micro_batch(device))
        val_loader = create_dataloader(
            data_dict["val"], imgsz, val_batch, grid, single_cls=opt.single_cls, hyp=hyp,
            cache=None if opt.noval else opt.cache, rect=True, rank=-1, workers=opt.workers, pad=0.5,
            prefix=colorstr("val: "), seed=opt.seed, nc=nc, reduced_decode=opt.reduced_decode,
            shape_per_image=True)[0]
        validate.warn_if_max_det_caps(val_loader.dataset, validate.detections_per_image(None, data_dict),
                                      "set max_det in the data YAML to")
    return train_loader, dataset, val_loader


def prepare_new_run(dataset, model, hyp: dict, ctx: RunContext) -> None:
    """AutoAnchor (anchors then live in the model, so checkpoints carry them) and labels.jpg."""
    if not ctx.opt.noautoanchor:
        check_anchors(dataset, model=model, thr=hyp["anchor_t"], imgsz=ctx.imgsz, seed=ctx.opt.seed,
                      scale=box_scale(dataset.shapes, ctx.opt.train_tiles))
    elif isinstance(model.yaml.get("anchors"), int):
        LOGGER.warning("--noautoanchor with 'anchors: N' in the model YAML: training with placeholder anchors")
    if ctx.plots and ctx.dist.is_main:
        plot_labels(dataset_labels(dataset), ctx.names, ctx.save_dir)


def finish_run(ctx: RunContext, final: tuple, results):
    """Check the final weights are on disk (else stop with one line), strip them, record their checksum,
    validate best.pt (or last.pt) with plots, draw results.png. Returns (results, the final weights file).

    The final validation is val.py's with its default flags: the weights loaded as val.py loads them (fused,
    channels-last), fp32 (no AMP), conf 0.001, IoU 0.6, rect letterboxes per image; its batch size (twice the
    training one) cannot change a bit (utils/batch_invariance.py). So its metrics are those of the val.py line
    printed after it, bit for bit."""
    final_file = ctx.saver.finish(final)
    if not ctx.opt.evolve:
        LOGGER.info(f"\nValidating {final_file} as val.py does with its default flags (fp32, conf 0.001, IoU 0.6)...")
        model = load_backend(final_file, device=ctx.device, fuse=True)
        results = validate.run(
            ctx.data_dict, batch_size=ctx.per_rank_batch * 2, imgsz=ctx.imgsz, model=model, half=False,
            workers=ctx.opt.workers, single_cls=ctx.opt.single_cls, save_dir=ctx.save_dir, plots=ctx.plots,
            verbose=len(ctx.names) < 50, names=ctx.names).metrics
    if ctx.plots:
        plot_results(ctx.save_dir / "results.csv")
    return results, final_file


# ---------------------------------------------------------------------------------------- main


def main(opt, argv=None, callbacks: Callbacks | None = None):
    """Resolve options, set up devices (and DDP), then train or evolve (with the user's ``callbacks``)."""
    dist = dist_info_from_env(opt.local_rank)
    opt, resume_ckpt = resolve_options(opt, argv)
    load_user_modules(opt.modules)  # a resumed run's own unless typed again; before any model is built
    check_loggers(opt)  # a missing package stops here, before any folder is made
    hyp = load_hyp(opt) if resume_ckpt is None else dict(resume_ckpt["hyp"])
    prepare_cuda_environment(opt.deterministic)  # cuBLAS reads it when CUDA starts, i.e. in select_device
    device = select_device(opt.device, batch_size=opt.batch_size)
    if dist.enabled:
        device = torch.device("cuda", dist.local_rank) if device.type == "cuda" else torch.device("cpu")
        init_process_group(dist, device)
    try:
        with refused_alike(dist):  # every rank finds it: rank 0 alone says so
            if opt.micro_batch:
                check_micro_batch(opt.micro_batch, opt.batch_size, dist.world_size, opt)
            if dist.enabled:
                check_ddp_batch(opt.batch_size, dist.world_size)
        with stop_stage(before_first_step(opt)):
            if opt.evolve:
                if dist.enabled:
                    raise UserError("--evolve is not supported with DDP; run it on one device")
                return evolve(hyp, opt, lambda trial_hyp, trial_opt: train(trial_hyp, trial_opt, device, dist,
                                                                          callbacks=callbacks))
            with exit_on_lost_peer(dist):
                return train(hyp, opt, device, dist, resume_ckpt, callbacks)
    finally:
        destroy_process_group(dist)


def run(callbacks: Callbacks | None = None, **kwargs):
    """Python API: ``train.run(data='data/shapes.yaml', cfg='models/ffca-yolo-n.yaml', imgsz=256)``; the keywords
    are the flags' names (see OneLineErrorParser.parse_keywords); ``callbacks`` is a
    :class:`utils.callbacks.Callbacks` whose hooks the run calls (docs/training.md, "Callbacks")."""
    Callbacks().extended(callbacks)  # a wrong type is one line before anything starts
    return main(build_parser().parse_keywords(kwargs, "train.run"), argv=[], callbacks=callbacks)


@exit_on_stop_signal("training")
@exit_on_user_error
def cli():
    with out_of_memory_anywhere("train.py", TRAIN_ADVICE):
        main(parse_opt())


if __name__ == "__main__":
    cli()
