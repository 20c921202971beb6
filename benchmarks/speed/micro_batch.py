"""What --micro-batch costs one process: a step on one fixed batch, whole against split into micro-batches.

    python -m benchmarks.speed.micro_batch                      # yolov5n, 128 px, batch 16, one thread
    python -m benchmarks.speed.micro_batch --cfg models/ffca-yolo-n.yaml --reps 7

Each repetition times every setting once, in turn, on the same batch (no data loading); prints the median
step time and its ratio to the whole batch, and the gradient copies the split keeps. With W processes and
``--micro-batch batch/W`` each process runs one micro-batch: the "1 micro-batch" row is plain DDP's compute.
A benchmark, not a test: run it on an idle machine.
"""

import statistics
import time

import torch

from benchmarks.cli import parse_checked, parser_for
from benchmarks.speed.harness import build_loop
from utils.errors import exit_on_user_error
from utils.options import OptionRules
from utils.training.micro_batches import MicroBatchStep, join_micro_batches

RULES = OptionRules(positive=("imgsz", "batch_size", "reps", "threads", "warmup"), files=("cfg",))


def step_timer(loop, imgs, targets, micro_batch: int):
    """A function that runs one training step on the batch, whole (``micro_batch`` 0) or split."""
    if not micro_batch:
        return lambda i: loop.train_step(imgs, targets, 0, i, 10**6)
    loop.opt.micro_batch = micro_batch
    micro_step = MicroBatchStep(loop.model, loop.dist, loop.device, 0, imgs.shape[0] // micro_batch)
    micro = []
    for index, start in enumerate(range(0, imgs.shape[0], micro_batch)):
        keep = (targets[:, 0] >= start) & (targets[:, 0] < start + micro_batch)
        part = targets[keep].clone()
        part[:, 0] -= start
        micro.append((index, imgs[start:start + micro_batch], part, []))
    assert join_micro_batches(micro)[0].shape == imgs.shape

    def step(i):
        loop.micro = micro_step
        try:
            return loop.train_micro_step(micro, 0, i, 10**6)
        finally:
            loop.micro = None

    return step


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.micro_batch", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default="models/yolov5n.yaml")
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    loop, loader = build_loop(args.cfg, args.imgsz, args.batch_size, 0, mode="scoped")
    loop.model.train()
    loader.set_epoch(0)
    imgs, targets, _, _ = next(iter(loader))
    splits = [0] + [m for m in (args.batch_size, args.batch_size // 2, args.batch_size // 4) if m >= 1]
    steps = {m: step_timer(loop, imgs, targets, m) for m in splits}
    seconds = {m: [] for m in splits}
    for rep in range(args.warmup + args.reps):
        for m, step in steps.items():
            t = time.perf_counter()
            step(rep)
            if rep >= args.warmup:
                seconds[m].append(time.perf_counter() - t)
    whole = statistics.median(seconds[0])
    params = sum(p.numel() for p in loop.model.parameters() if p.requires_grad)
    print(f"{args.cfg}, {args.imgsz} px, batch {args.batch_size}, {args.threads} thread(s), median of {args.reps}")
    for m in splits:
        label = "whole batch (no --micro-batch)" if not m else f"--micro-batch {m} ({args.batch_size // m} in turn)"
        copies = 0 if not m else args.batch_size // m
        median = statistics.median(seconds[m])
        print(f"  {label:36s} {median * 1e3:8.1f} ms  x{median / whole:.2f}  gradient copies {copies} x "
              f"{params * 4 / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    main()
