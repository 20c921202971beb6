"""Cost of the deterministic twins of grid_sample, deform_conv2d, roi_align and roi_pool against the native ops.

    python -m benchmarks.speed.bench_twins_sampling                      # CPU, 1 thread, 7 repetitions
    python -m benchmarks.speed.bench_twins_sampling --device cuda --reps 21

For each case the native op and its twin run alternately (the order swapped every repetition, so
load from other processes hits both alike): the forward, then the backward of a fixed upstream
gradient. Times are medians. Peak memory is the most the phase allocates above what existed
before it: for the forward it includes what autograd saves, for the backward it counts only what
the backward allocates (gradients and temporaries). On CUDA it is the caching allocator's peak; on
a CPU it is the peak total of the tensors the dispatcher sees (``MemTracker``, a private torch
tool), which misses buffers a native kernel allocates inside itself (deform_conv2d's column buffer),
so there the native figures are lower bounds. Ratios are twin / native. ``max |diff|`` is the
largest forward difference between the two.
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torchvision.ops as tvo

from benchmarks.cli import parse_checked, parser_for
from utils.determinism.twins.sampling import grid_sample
from utils.determinism.twins.vision_ops import deform_conv2d, roi_align, roi_pool
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules

MIB = 2 ** 20


def _grid_case(options: dict):
    def make(g, device):
        image = torch.randn((4, 32, 40, 40), generator=g).to(device).requires_grad_()
        grid = (torch.rand((4, 40, 40, 2), generator=g) * 2.4 - 1.2).to(device).requires_grad_()
        return (image, grid), options
    return make


def _deform_case(masked: bool):
    def make(g, device):
        image = torch.randn((2, 32, 40, 40), generator=g)
        offset = torch.randn((2, 18, 40, 40), generator=g) * 2
        weight = torch.randn((32, 32, 3, 3), generator=g) * 0.1
        bias = torch.randn((32,), generator=g)
        mask = torch.rand((2, 9, 40, 40), generator=g) if masked else None
        tensors = [t.to(device).requires_grad_() if t is not None else None for t in (image, offset, weight, bias, mask)]
        return tuple(tensors[:4]), {"padding": 1, "mask": tensors[4]}
    return make


def _roi_case(options: dict):
    def make(g, device):
        features = torch.randn((2, 64, 40, 40), generator=g).to(device).requires_grad_()
        corner = torch.rand((64, 2), generator=g) * 280
        size = torch.rand((64, 2), generator=g) * 60 + 4
        image = torch.arange(64).remainder(2).float().view(-1, 1)
        boxes = torch.cat([image, corner, corner + size], dim=1).to(device)  # on a 320 px image, stride 8
        return (features, boxes), {"output_size": 7, "spatial_scale": 0.125, **options}
    return make


CASES = (  # (native, twin, label, inputs)
    (F.grid_sample, grid_sample, "grid_sample bilinear zeros", _grid_case({"align_corners": False})),
    (F.grid_sample, grid_sample, "grid_sample bilinear reflection ac", _grid_case(
        {"padding_mode": "reflection", "align_corners": True})),
    (F.grid_sample, grid_sample, "grid_sample nearest border", _grid_case(
        {"mode": "nearest", "padding_mode": "border", "align_corners": False})),
    (tvo.deform_conv2d, deform_conv2d, "deform_conv2d 32->32 3x3", _deform_case(False)),
    (tvo.deform_conv2d, deform_conv2d, "deform_conv2d 32->32 3x3 mask", _deform_case(True)),
    (tvo.roi_align, roi_align, "roi_align 64 boxes 7x7 adaptive", _roi_case({"aligned": True})),
    (tvo.roi_align, roi_align, "roi_align 64 boxes 7x7 ratio 2", _roi_case({"sampling_ratio": 2})),
    (tvo.roi_pool, roi_pool, "roi_pool 64 boxes 7x7", _roi_case({})),
)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(step, device: torch.device) -> tuple:
    """(result of ``step()``, the most bytes ``step`` held allocated above what existed before it)."""
    if device.type == "cuda":
        _synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = step()
        _synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - before
    from torch.distributed._tools.mem_tracker import MemTracker  # private; imported only to measure
    tracker = MemTracker()
    with tracker:
        result = step()
    return result, sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())


def measure_once(op, inputs: tuple, options: dict, upstream: torch.Tensor | None, device) -> dict:
    """One forward and one backward of ``op``: seconds and peak bytes of each, and the output."""
    leaves = [t for t in (*inputs, *options.values()) if isinstance(t, torch.Tensor) and t.requires_grad]
    _synchronize(device)
    start = time.perf_counter()
    out = op(*inputs, **options)
    _synchronize(device)
    forward = time.perf_counter() - start
    upstream = torch.ones_like(out) if upstream is None else upstream
    start = time.perf_counter()
    torch.autograd.grad(out, leaves, upstream)
    _synchronize(device)
    backward = time.perf_counter() - start
    out_peak, forward_peak = _peak_bytes(lambda: op(*inputs, **options), device)
    _, backward_peak = _peak_bytes(lambda: torch.autograd.grad(out_peak, leaves, upstream), device)
    return {"forward": forward, "backward": backward, "forward_peak": forward_peak,
            "backward_peak": backward_peak, "out": out.detach()}


def compare(native, twin, make_inputs, reps: int, device) -> dict:
    """Medians of both ops over ``reps`` alternating repetitions (after one warm-up of each)."""
    inputs, options = make_inputs(torch.Generator().manual_seed(0), device)
    upstream = torch.randn(native(*inputs, **options).shape, generator=torch.Generator().manual_seed(1)).to(device)
    runs = {"native": [], "twin": []}
    for rep in range(reps + 1):
        order = (("native", native), ("twin", twin)) if rep % 2 else (("twin", twin), ("native", native))
        for name, op in order:
            result = measure_once(op, inputs, options, upstream, device)
            if rep:  # repetition 0 warms up
                runs[name].append(result)
    summary = {name: {key: statistics.median(r[key] for r in results) for key in
                      ("forward", "backward", "forward_peak", "backward_peak")} for name, results in runs.items()}
    summary["diff"] = (runs["twin"][0]["out"] - runs["native"][0]["out"]).abs().max().item()
    return summary


def format_row(label: str, s: dict) -> str:
    n, t = s["native"], s["twin"]
    ratio = {key: t[key] / n[key] if n[key] else float("nan") for key in n}
    return (f"{label:<36}{n['forward'] * 1e3:>8.2f}{t['forward'] * 1e3:>8.2f}{ratio['forward']:>7.2f}x"
            f"{n['backward'] * 1e3:>8.2f}{t['backward'] * 1e3:>8.2f}{ratio['backward']:>7.2f}x"
            f"{n['forward_peak'] / MIB:>8.1f}{t['forward_peak'] / MIB:>8.1f}{ratio['forward_peak']:>7.2f}x"
            f"{n['backward_peak'] / MIB:>8.1f}{t['backward_peak'] / MIB:>8.1f}{ratio['backward_peak']:>7.2f}x"
            f"{s['diff']:>11.1e}")


HEADER = (f"{'case':<36}{'fwd ms':>8}{'twin':>8}{'ratio':>8}{'bwd ms':>8}{'twin':>8}{'ratio':>8}"
          f"{'fwd MiB':>8}{'twin':>8}{'ratio':>8}{'bwd MiB':>8}{'twin':>8}{'ratio':>8}{'max |diff|':>11}")

RULES = OptionRules(positive=("reps", "threads"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_twins_sampling", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions of each op (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parse_checked(parser, RULES, argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UserError(f"--device {args.device}: not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        raise UserError(f"--device {args.device}: no such device here; use --device cpu, or cuda on a GPU machine")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {device}, {args.threads} thread(s), median of {args.reps}; "
          "columns: native, twin, twin/native")
    print(HEADER)
    for native, twin, label, make_inputs in CASES:
        print(format_row(label, compare(native, twin, make_inputs, args.reps, device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
