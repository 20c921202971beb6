"""Shared measuring harness: time train.py's own training step on the embedded data set.

The step is ``train.TrainLoop.train_step`` (forward, loss, scoped backward, optimizer step, EMA),
fed by the real augmenting loader, so the figures include data loading.
"""

import resource
import statistics
import time
from pathlib import Path

import torch

import train
from models.yolo import Model
from utils.dataset.data_config import check_dataset
from utils.dataloaders import create_dataloader
from utils.determinism.audit_cache import start_up_audit
from utils.ddp import DistInfo
from utils.files import yaml_load
from utils.loss import ComputeLoss
from utils.torch_utils import configure_determinism, grid_size

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "shapes.yaml"
HYP = ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"


def build_loop(cfg, imgsz: int, batch_size: int, workers: int, mode: str = "off", device="cpu", data_yaml=DATA):
    """A TrainLoop, its loss and a shuffled augmenting loader, as train.py builds them (AMP on CUDA)."""
    device = torch.device(device)
    policy = configure_determinism(mode, seed=0)
    data = check_dataset(data_yaml)
    hyp = yaml_load(HYP)
    opt = train.parse_opt(["--cfg", str(cfg), "--imgsz", str(imgsz), "--batch-size", str(batch_size),
                           "--workers", str(workers)])
    model = Model(cfg, nc=data["nc"]).to(device)
    model.names = data["names"]
    loader, _ = create_dataloader(data["train"], imgsz, batch_size, grid_size(model), hyp=hyp,
                                  augment=True, workers=workers, shuffle=True, seed=0, nc=data["nc"])
    amp = device.type == "cuda"  # train.py turns AMP on for CUDA once check_amp agrees
    ctx = train.RunContext(opt=opt, device=device, dist=DistInfo(), policy=policy, save_dir=Path(opt.project),
                           data_dict=data, names=list(data["names"]), imgsz=imgsz, batch_size=batch_size,
                           per_rank_batch=batch_size, plots=False, train_loader=loader, val_loader=None,
                           saver=None)  # the harness times train_step only
    loop = train.TrainLoop(ctx, model, hyp, amp=amp)
    loop.n_warmup = 0
    if mode != "off":
        start_up_audit(policy, model, imgsz, device, hyp, amp)
    loop.compute_loss = ComputeLoss(model, loop.hyp)
    return loop, loader


def time_batches(cfg, imgsz=256, batch_size=16, workers=2, mode="off", warmup=2, batches=10, device="cpu",
                 nan_fill=None):
    """Median seconds per batch over ``batches`` steps after ``warmup`` steps (data loading included).

    ``nan_fill``: True or False overrides the mode's ``torch.utils.deterministic.fill_uninitialized_memory``.
    """
    loop, loader = build_loop(cfg, imgsz, batch_size, workers, mode, device)
    if nan_fill is not None:
        torch.utils.deterministic.fill_uninitialized_memory = nan_fill
    loop.model.train()
    times, epoch = [], 0
    nb = len(loader)
    while len(times) < warmup + batches:
        loader.set_epoch(epoch)
        t = time.perf_counter()
        for i, (imgs, targets, _, _) in enumerate(loader):
            loop.train_step(imgs, targets, epoch, i, nb)
            if device != "cpu":
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - t)
            t = now
            if len(times) >= warmup + batches:
                break
        epoch += 1
    return statistics.median(times[warmup:])


def time_fixed_batch(cfg, imgsz: int, batch_size: int, mode: str, device, data_yaml=DATA, warmup: int = 3,
                     batches: int = 10, nan_fill=None) -> float:
    """Median seconds of ``train_step`` on one fixed batch (no data loading), after ``warmup`` steps.

    Timing one batch over and over isolates what a determinism mode costs in the step itself.
    ``nan_fill`` as in :func:`time_batches`.
    """
    loop, loader = build_loop(cfg, imgsz, batch_size, 0, mode, device, data_yaml)
    if nan_fill is not None:
        torch.utils.deterministic.fill_uninitialized_memory = nan_fill
    loop.model.train()
    loader.set_epoch(0)
    imgs, targets, _, _ = next(iter(loader))
    times = []
    for i in range(warmup + batches):
        t = time.perf_counter()
        loop.train_step(imgs, targets, 0, i, warmup + batches)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[warmup:])


def peak_rss_gib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
