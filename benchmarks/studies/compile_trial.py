"""Trial of torch.compile for training on CPU: step time, compile cost and run-to-run equality.

    python -m benchmarks.studies.compile_trial                                   # yolov5n, 256 px, batch 16
    python -m benchmarks.studies.compile_trial --cfg models/ffca-yolo-n.yaml --steps 20
    python -m benchmarks.studies.compile_trial --profile-only                    # where the eager step's time goes

One training step = forward, ComputeLoss, backward and an SGD step on a fixed random batch with
fixed targets (no data loading, so only the model's share of a step is compared). Eager and
compiled models are both channels-last, as train.py runs them. For each variant it prints the
first-step time (compilation included), the median of the later steps, and whether two fresh runs
from one seed end with bit-identical weights. A benchmark, not a test: run it on an idle machine.
"""

import hashlib
import statistics
import time
from pathlib import Path

import torch

from models.yolo import Model
from utils.loss import ComputeLoss
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
HYP = {"box": 0.05, "cls": 0.5, "cls_pw": 1.0, "obj": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0,
       "label_smoothing": 0.0}


def fixed_batch(batch, imgsz, boxes_per_image=8):
    """Random images (batch, 3, imgsz, imgsz) and targets (n, 6) [image, class, x, y, w, h] from seed 0."""
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, imgsz, imgsz, generator=g).contiguous(memory_format=torch.channels_last)
    n = batch * boxes_per_image
    image_index = torch.arange(batch).repeat_interleave(boxes_per_image).float()
    xy = torch.rand(n, 2, generator=g) * 0.8 + 0.1
    wh = torch.rand(n, 2, generator=g) * 0.1 + 0.02
    cls = torch.randint(0, 4, (n,), generator=g).float()
    return images, torch.cat((image_index[:, None], cls[:, None], xy, wh), 1)


def run(cfg, images, targets, steps, compile_model):
    """(seconds per step list, sha256 of the final weights) for one fresh model from seed 0."""
    torch.manual_seed(0)
    model = Model(cfg, nc=4).to(memory_format=torch.channels_last).train()
    loss_fn = ComputeLoss(model, HYP)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    forward = torch.compile(model) if compile_model else model
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, _ = loss_fn(forward(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return times, digest.hexdigest()[:16]


def profile_eager(cfg, images, targets, steps=3, rows=8):
    """Print the ``rows`` aten ops with the most self CPU time over ``steps`` eager steps (after 2 warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    run(cfg, images, targets, 2, compile_model=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(cfg, images, targets, steps, compile_model=False)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print("| op | share of self CPU time |\n| --- | --- |")
    for event in events[:rows]:
        print(f"| {event.key} | {100 * event.self_cpu_time_total / total:.1f} % |")


RULES = OptionRules(positive=("imgsz", "batch_size", "steps", "threads"), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.studies.compile_trial", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default=str(ROOT / "models" / "yolov5n.yaml"))
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--profile-only", action="store_true", help="only the op profile of the eager step")
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    images, targets = fixed_batch(args.batch_size, args.imgsz)
    if args.profile_only:
        return profile_eager(args.cfg, images, targets)
    rows = []
    for compile_model in (False, True):
        first, second = (run(args.cfg, images, targets, args.steps, compile_model) for _ in range(2))
        steady = statistics.median(first[0][2:] + second[0][2:])
        rows.append((compile_model, first[0][0], steady, first[1] == second[1]))
    eager_steady = rows[0][2]
    print(f"{Path(args.cfg).stem}, {args.imgsz} px, batch {args.batch_size}, {args.threads} threads, channels-last, "
          f"{args.steps} steps per run, 2 runs per variant\n"
          "| variant | first step s | median later step s | speed vs eager | two runs bit-identical |\n"
          "| --- | --- | --- | --- | --- |")
    for compile_model, first_step, steady, same in rows:
        print(f"| {'torch.compile' if compile_model else 'eager'} | {first_step:.1f} | {steady:.3f} | "
              f"{eager_steady / steady:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
