"""What the non-finite step guard costs: a model's optimizer step (unscale, clip at 10, step, scaler update,
zero the gradients, EMA) taken plainly and through ``utils.training.nonfinite.GuardedStep`` (a copy of the
weights and optimizer state, the finite checks, the copy kept for undoing), beside one forward and backward
pass for scale. Medians over ``--repeats`` and their ratios, measured in one run, one thread.

    python -m benchmarks.speed.guarded_step                                  # ffca-yolo, SGD, batch 8 at 256
    python -m benchmarks.speed.guarded_step --cfg models/yolov5s.yaml --optimizer AdamW --repeats 30

A training step takes one optimizer step every ``64 / --batch-size`` batches (YOLOv5's accumulation) after
warm-up, so the guard's share of a batch is smaller still than the ratio to one forward and backward shows.
"""

import statistics
import time

import torch

from benchmarks.cli import parse_checked, parser_for
from models.yolo import Model
from utils.ddp import DistInfo
from utils.errors import exit_on_user_error
from utils.options import OptionRules
from utils.torch_utils import ModelEMA, smart_optimizer
from utils.training.nonfinite import CLIP_NORM, GuardedStep

RULES = OptionRules(positive=("repeats", "batch", "imgsz"), files=("cfg",))


def plain_step(model, optimizer, scaler, ema) -> None:
    """The step as it was before the guard."""
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP_NORM)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    ema.update(model)


def median_ms(action, repeats: int) -> float:
    return statistics.median(timed_ms(action) for _ in range(repeats))


def timed_ms(action) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1e3


def interleaved_medians(actions: dict, repeats: int) -> dict:
    """Each action's median ms, the actions taking turns, so a change of machine load hits them alike."""
    times = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            times[name].append(timed_ms(action))
    return {name: statistics.median(t) for name, t in times.items()}


def measure(opt) -> dict:
    torch.manual_seed(0)
    model = Model(opt.cfg, ch=3, nc=4).train()
    optimizer = smart_optimizer(model, opt.optimizer, lr=1e-4, momentum=0.9, decay=5e-4)
    scaler, ema, guarded = torch.amp.GradScaler("cuda", enabled=False), ModelEMA(model), GuardedStep(optimizer)
    images = torch.rand(opt.batch, 3, opt.imgsz, opt.imgsz)

    def backward():
        optimizer.zero_grad()
        sum(p.sum() for p in model(images)).backward()

    def with_gradients(step):
        def run():
            for p in model.parameters():
                p.grad = torch.full_like(p, 1e-3)
            step()
        return run

    backward()
    plain_step(model, optimizer, scaler, ema)  # optimizer state exists from here on, as in training
    ms = interleaved_medians({"plain": with_gradients(lambda: plain_step(model, optimizer, scaler, ema)),
                              "guarded": with_gradients(lambda: guarded(model, scaler, ema, DistInfo())),
                              "fill": with_gradients(lambda: None)}, opt.repeats)
    forward_backward = median_ms(backward, max(3, opt.repeats // 5))
    return {"plain": ms["plain"] - ms["fill"], "guarded": ms["guarded"] - ms["fill"],
            "forward_backward": forward_backward}


@exit_on_user_error
def main(argv=None) -> None:
    parser = parser_for("benchmarks.speed.guarded_step", __doc__.splitlines()[0])
    parser.add_argument("--cfg", default="models/ffca-yolo.yaml")
    parser.add_argument("--optimizer", default="SGD", choices=["SGD", "Adam", "AdamW"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    opt = parse_checked(parser, RULES, argv)
    torch.set_num_threads(1)
    ms = measure(opt)
    extra = ms["guarded"] - ms["plain"]
    print(f"{opt.cfg} {opt.optimizer}, one thread, CPU, medians of {opt.repeats}")
    print(f"optimizer step, plain:      {ms['plain']:8.2f} ms")
    print(f"optimizer step, guarded:    {ms['guarded']:8.2f} ms  ({ms['guarded'] / ms['plain']:.2f}x)")
    print(f"forward + backward (batch {opt.batch} at {opt.imgsz}): {ms['forward_backward']:8.2f} ms")
    print(f"the guard's extra time per optimizer step: {extra:.2f} ms = "
          f"{100 * extra / ms['forward_backward']:.1f}% of one forward + backward")


if __name__ == "__main__":
    main()
