"""Network inference time per image by memory layout, batch size and (optionally) torch.compile.

    python -m benchmarks.speed.bench_inference                                  # yolov5n, 256 px, CPU
    python -m benchmarks.speed.bench_inference --cfg models/ffca-yolo-n.yaml --imgsz 640 --batches 1 4
    python -m benchmarks.speed.bench_inference --compile                        # adds inductor (freezing) rows

The fused (Conv+BN folded) eval model only: no data loading, no NMS. Each row is the median of
``--runs`` timed calls after ``--warmup`` calls, divided by the batch size; the ratio column is
against plain-layout batch 1 measured in the same process. ``--compile`` also reports the one-time
compile cost and the largest output difference to the eager model. A benchmark, not a test: run
it on an idle machine.
"""

import copy
import statistics
import time
from pathlib import Path

import torch

from models.yolo import Model
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]


def median_ms(fn, x, warmup, runs):
    """Median wall time of ``fn(x)`` in milliseconds under ``torch.no_grad``."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(x)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compiled(model, example):
    """``(torch.compile'd copy with inductor freezing, compile seconds, max abs difference to eager)``."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True  # folds weights as constants: lets inductor pre-pack convolutions
    fast = torch.compile(copy.deepcopy(model))
    start = time.perf_counter()
    with torch.no_grad():
        out, ref = fast(example)[0], model(example)[0]
    return fast, time.perf_counter() - start, float((out - ref).abs().max())


RULES = OptionRules(positive=("imgsz", "batches", "runs", "threads"), non_negative=("warmup",), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_inference", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default=str(ROOT / "models" / "yolov5n.yaml"))
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--compile", action="store_true", help="add torch.compile (inductor, freezing) rows")
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = Model(args.cfg, nc=4).eval().fuse()
    last = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    rows, base = [], None
    for bs in args.batches:
        x = torch.rand(bs, 3, args.imgsz, args.imgsz)
        xl = x.contiguous(memory_format=torch.channels_last)
        variants = [("plain (NCHW)", plain, x), ("channels-last", last, xl)]
        if args.compile:
            fast, seconds, diff = compiled(last, xl)
            variants.append((f"compiled channels-last ({seconds:.0f} s to compile, max diff {diff:.1e})", fast, xl))
        for name, model, inp in variants:
            per_image = median_ms(model, inp, args.warmup, max(args.runs // bs, 5)) / bs
            base = base or per_image
            rows.append(f"| {name} | {bs} | {per_image:.2f} | {base / per_image:.2f}x |")
    print(f"{Path(args.cfg).stem}, {args.imgsz} px, {args.threads} threads, fused, median of {args.runs} calls "
          f"(fewer for big batches)\n| layout | batch | ms per image | speed vs plain batch {args.batches[0]} |\n"
          "| --- | --- | --- | --- |\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
