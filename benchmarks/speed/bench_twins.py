"""Deterministic twins against the native ops: forward and backward time, and peak memory, on the CPU.

    python -m benchmarks.speed.bench_twins                 # every case, 9 repetitions, 1 thread
    python -m benchmarks.speed.bench_twins --reps 15 --threads 2

For each case (the ops of utils/determinism/twins/ at feature-map sizes of a YOLO neck) it times the
forward and the backward (given the forward's output) of the native op and of its twin, native and
twin back to back in every repetition, and prints the median times and the median of the
repetitions' twin / native ratios. Peak memory is the
largest total of live CPU tensors in the torch profiler's memory timeline, for the forward alone and
for forward plus backward (inputs included), measured once per case. A benchmark, not a test: the
figures move with the machine's load; the ratios come from one run.
"""

import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from benchmarks.cli import parse_checked, parser_for
from utils.determinism.twins import interpolation, pooling
from utils.errors import exit_on_user_error
from utils.options import OptionRules

# name -> (input shape, native(x), twin(x))
CASES = {
    "adaptive_max_pool2d 7x7 (overlapping)": ((8, 64, 40, 40), lambda x: F.adaptive_max_pool2d(x, 7),
                                              lambda x: pooling.adaptive_max_pool2d(x, 7)),
    "adaptive_max_pool2d 1x1 (CBAM)": ((8, 64, 40, 40), lambda x: F.adaptive_max_pool2d(x, 1),
                                       lambda x: pooling.adaptive_max_pool2d(x, 1)),
    "adaptive_max_pool3d 3x3x3": ((4, 16, 9, 20, 20), lambda x: F.adaptive_max_pool3d(x, 3),
                                  lambda x: pooling.adaptive_max_pool3d(x, 3)),
    "adaptive_avg_pool2d 6x6 (PSP)": ((8, 64, 40, 40), lambda x: F.adaptive_avg_pool2d(x, 6),
                                      lambda x: pooling.adaptive_avg_pool2d(x, 6)),
    "adaptive_avg_pool2d (None, 1) (coord. att.)": ((8, 64, 40, 40), lambda x: F.adaptive_avg_pool2d(x, (None, 1)),
                                                    lambda x: pooling.adaptive_avg_pool2d(x, (None, 1))),
    "adaptive_avg_pool3d 3x3x3": ((4, 16, 9, 20, 20), lambda x: F.adaptive_avg_pool3d(x, 3),
                                  lambda x: pooling.adaptive_avg_pool3d(x, 3)),
    "interpolate bilinear x2": ((8, 64, 20, 20), lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                                lambda x: interpolation.interpolate(x, scale_factor=2, mode="bilinear")),
    "interpolate bicubic x2": ((8, 64, 20, 20), lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
                               lambda x: interpolation.interpolate(x, scale_factor=2, mode="bicubic")),
    "interpolate bilinear antialias x0.5": (
        (8, 64, 40, 40), lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
        lambda x: interpolation.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)),
    "interpolate trilinear x2": ((4, 16, 5, 10, 10), lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"),
                                 lambda x: interpolation.interpolate(x, scale_factor=2, mode="trilinear")),
}


def timed_pass(fn, x: torch.Tensor) -> tuple:
    """``(forward seconds, backward seconds)`` of one pass of ``fn`` on ``x``."""
    x.grad = None
    start = time.perf_counter()
    out = fn(x)
    middle = time.perf_counter()
    out.backward(torch.ones_like(out))
    return middle - start, time.perf_counter() - middle


def peak_mib(step) -> float:
    """The largest total of live CPU tensors (MiB) in the profiler's memory timeline of ``step()``."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            step()
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max((sum(s) for s in sizes), default=0) / 2 ** 20


def measure(shape, native, twin, reps: int) -> dict:
    """Median times (ms), median paired ratios and peaks (MiB) of ``native`` and ``twin`` on one input of ``shape``.

    Each repetition times native and twin back to back (3 passes each, averaged), so a burst of load
    on the machine hits both sides of a ratio.
    """
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    for fn in (native, twin):  # warm-up: matrices, caches, first allocations
        timed_pass(fn, x)
    passes = {"native": [], "twin": []}
    for _ in range(reps):
        for name, fn in (("native", native), ("twin", twin)):
            runs = [timed_pass(fn, x) for _ in range(3)]
            passes[name].append(tuple(statistics.fmean(r[i] for r in runs) for i in (0, 1)))
    result = {"ratio": {phase: statistics.median(t[i] / n[i] for n, t in zip(passes["native"], passes["twin"]))
                        for i, phase in enumerate(("forward", "backward"))}}
    for name, fn in (("native", native), ("twin", twin)):
        result[name] = {"forward": statistics.median(t[0] for t in passes[name]) * 1e3,
                        "backward": statistics.median(t[1] for t in passes[name]) * 1e3,
                        "forward_peak": peak_mib(lambda: fn(x.detach())),
                        "step_peak": peak_mib(lambda: timed_pass(fn, x))}
    return result


def table(results: dict) -> str:
    header = (f"{'case':<46}{'fwd ms':>8}{'twin':>8}{'ratio':>7}{'bwd ms':>8}{'twin':>8}{'ratio':>7}"
              f"{'fwd MiB':>9}{'twin':>8}{'f+b MiB':>9}{'twin':>8}{'ratio':>7}")
    lines = [header, "-" * len(header)]
    for case, r in results.items():
        n, t, ratio = r["native"], r["twin"], r["ratio"]
        lines.append(f"{case:<46}{n['forward']:8.2f}{t['forward']:8.2f}{ratio['forward']:7.2f}"
                     f"{n['backward']:8.2f}{t['backward']:8.2f}{ratio['backward']:7.2f}"
                     f"{n['forward_peak']:9.2f}{t['forward_peak']:8.2f}{n['step_peak']:9.2f}{t['step_peak']:8.2f}"
                     f"{t['step_peak'] / n['step_peak']:7.2f}")
    return "\n".join(lines)


RULES = OptionRules(positive=("reps", "threads"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_twins", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9, help="repetitions per case (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU, {args.threads} thread(s), float32, median of {args.reps}; "
          "ratio = median of paired twin / native")
    results = {case: measure(shape, native, twin, args.reps) for case, (shape, native, twin) in CASES.items()}
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
