"""What the exact DDP gradient reduction costs: bytes each rank sends and extra memory per step, on gloo ranks.

    python -m benchmarks.speed.ddp_reduction                                  # yolov5n, 2, 3 and 4 ranks on CPU
    python -m benchmarks.speed.ddp_reduction --cfg models/ffca-yolo.yaml --world-sizes 2 4

Three communication hooks train the same model on the same inputs, each in a fresh DDP:
``local`` (no communication, the memory baseline), ``all-gather`` (every rank's bucket gathered, then
added in rank order: the previous exact hook) and ``all-to-all`` (utils/ddp.py ``rank_ordered_mean_hook``).
Bytes are counted in the collectives each hook calls: an all-to-all of ``n`` bytes sends ``(W-1)/W n``,
an all-gather of ``n`` bytes sends ``(W-1) n``. A ring all-reduce of the same buckets would send
``2 (W-1)/W B``. Memory is the process's peak resident memory over one forward and backward pass
(the kernel's high-water mark, reset before the step) above the ``local`` hook's, the median over the
timed steps and the largest over the ranks. Large tensors are given back to the kernel when freed
(``MALLOC_MMAP_THRESHOLD_``), so the high-water mark follows the tensors alive at the peak.
The last table is arithmetic, not a measurement: the traffic for larger worlds from the parameter count.
"""

import argparse
import copy
import json
import os
import statistics
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.cli import parse_checked, parser_for
from models.yolo import DetectionModel
from utils.ddp import rank_ordered_mean_hook
from utils.errors import exit_on_user_error
from utils.options import OptionRules

RULES = OptionRules(positive=("world_sizes", "imgsz", "steps", "expected_world_sizes"), files=("cfg",),
                    repo_yamls=("cfg",))
SHIPPED_MODELS = ("models/yolov5n.yaml", "models/yolov5s.yaml", "models/ffca-yolo.yaml")
MIB = 2**20
WARMUP_STEPS = 2  # DDP lays its buckets out anew after the first step


def local_hook(_, bucket):
    """No communication: each rank keeps its own gradients (the baseline the memory is measured against)."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def all_gather_mean_hook(process_group, bucket):
    """The previous exact hook: every rank's whole bucket gathered, then added in rank order."""
    world_size = dist.get_world_size(process_group)
    grads = bucket.buffer()
    parts = [torch.empty_like(grads) for _ in range(world_size)]
    work = dist.all_gather(parts, grads, group=process_group, async_op=True)

    def mean_in_rank_order(_):
        total = parts[0].clone()
        for part in parts[1:]:
            total.add_(part)
        return total.div_(world_size)

    return work.get_future().then(mean_in_rank_order)


HOOKS = {"local": local_hook, "all-gather": all_gather_mean_hook, "all-to-all": rank_ordered_mean_hook}
# bytes a rank sends, as a multiple of the input's bytes, per collective the hooks call
SENT_PER_INPUT_BYTE = {"all_to_all_single": lambda w: (w - 1) / w, "all_gather": lambda w: w - 1,
                       "all_gather_single": lambda w: w - 1, "all_gather_into_tensor": lambda w: w - 1}


class Traffic:
    """Bytes this rank hands to collectives for sending, and the bucket bytes the hook reduced."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sent = 0.0
        self.bucket_bytes = 0
        self.buckets = 0

    @contextmanager
    def counting(self, world_size: int):
        originals = {name: getattr(dist, name) for name in SENT_PER_INPUT_BYTE if hasattr(dist, name)}

        def counted(name, collective):
            def call(output, tensor, *args, **kwargs):
                self.sent += tensor.numel() * tensor.element_size() * SENT_PER_INPUT_BYTE[name](world_size)
                return collective(output, tensor, *args, **kwargs)
            return call

        for name, collective in originals.items():
            setattr(dist, name, counted(name, collective))
        try:
            yield
        finally:
            for name, collective in originals.items():
                setattr(dist, name, collective)

    def hook(self, inner):
        def call(process_group, bucket):
            self.bucket_bytes += bucket.buffer().numel() * bucket.buffer().element_size()
            self.buckets += 1
            return inner(process_group, bucket)
        return call


def memory_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak since the last reset) of this process, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (the benchmark needs Linux)")


def peak_above_start_mib(step) -> float:
    """Peak resident memory during ``step()`` above the resident memory before it."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)
    start = memory_kib("VmRSS")
    step()
    return (memory_kib("VmHWM") - start) / 1024


def measure_hook(model, hook, rank: int, world_size: int, imgsz: int, steps: int) -> dict:
    """Traffic and peak memory of one hook per step, after the warm-up steps."""
    traffic = Traffic()
    ddp = DDP(copy.deepcopy(model))
    ddp.register_comm_hook(None, traffic.hook(hook))
    images = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(rank))

    def step():
        sum(out.sum() for out in ddp(images)).backward()

    peaks = []
    for i in range(WARMUP_STEPS + steps):
        if i == WARMUP_STEPS:
            traffic.reset()
        with traffic.counting(world_size):
            peaks.append(peak_above_start_mib(step))
    return {"peak_mib": statistics.median(peaks[WARMUP_STEPS:]), "sent": traffic.sent / steps,
            "bucket_bytes": traffic.bucket_bytes / steps, "buckets": traffic.buckets / steps}


def rank_main(rank: int, world_size: int, store: str, cfg: str, imgsz: int, steps: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = DetectionModel(cfg).train()
        figures = {name: measure_hook(model, hook, rank, world_size, imgsz, steps) for name, hook in HOOKS.items()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def measure_world(cfg: str, world_size: int, imgsz: int, steps: int) -> list:
    """Each rank's figures per hook, from ``world_size`` spawned gloo processes."""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by each new process's C library at start
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(world_size, f"{tmp}/store", cfg, imgsz, steps, tmp), nprocs=world_size)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world_size)]


def print_world(world_size: int, ranks: list) -> None:
    rank0 = ranks[0]
    bucket_bytes = rank0["all-to-all"]["bucket_bytes"]
    ring = 2 * (world_size - 1) / world_size * bucket_bytes
    base = max(r["local"]["peak_mib"] for r in ranks)
    for name in ("all-gather", "all-to-all"):
        sent = rank0[name]["sent"]
        extra = max(r[name]["peak_mib"] for r in ranks) - base
        print(f"{world_size:>3}{rank0[name]['buckets']:>9.0f}{bucket_bytes / MIB:>10.2f}  {name:<12}"
              f"{sent / MIB:>11.2f}{ring / MIB:>10.2f}{sent / ring:>9.3f}{extra:>10.1f}"
              f"{extra * MIB / bucket_bytes:>8.2f}")


def parameter_bytes(cfg: str) -> int:
    return sum(p.numel() * p.element_size() for p in DetectionModel(cfg).parameters() if p.requires_grad)


def print_expected(world_sizes: list) -> None:
    """Traffic per rank and step from the fp32 gradient bytes B, for worlds this machine cannot start."""
    print("\nexpected, not measured: MiB sent per rank and step (B = fp32 gradient bytes)")
    print(f"{'model':<26}{'B MiB':>9}{'W':>4}{'all-gather (W-1)B':>19}{'all-to-all 2(W-1)/W B':>23}{'ratio':>7}")
    for cfg in SHIPPED_MODELS:
        b = parameter_bytes(cfg)
        for w in world_sizes:
            old, new = (w - 1) * b, 2 * (w - 1) / w * b
            print(f"{cfg:<26}{b / MIB:>9.2f}{w:>4}{old / MIB:>19.1f}{new / MIB:>23.1f}{old / new:>7.1f}")


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.ddp_reduction", description=__doc__,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cfg", default="models/yolov5n.yaml", help="model YAML trained by every rank")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3, 4],
                   help="gloo ranks to start, one world at a time")
    p.add_argument("--imgsz", type=int, default=64, help="image size of the one image per rank and step")
    p.add_argument("--steps", type=int, default=3, help="measured steps per hook, after 2 warm-up steps")
    p.add_argument("--expected-world-sizes", type=int, nargs="+", default=[8, 16],
                   help="world sizes of the arithmetic table for the shipped models")
    args = parse_checked(p, RULES, argv)
    print(f"{args.cfg}, {args.imgsz} px, 1 image per rank, gloo on CPU; median of {args.steps} steps")
    print(f"{'W':>3}{'buckets':>9}{'B MiB':>10}  {'hook':<12}{'sent MiB':>11}{'ring MiB':>10}{'/ring':>9}"
          f"{'extra MiB':>10}{'/B':>8}")
    for world_size in args.world_sizes:
        print_world(world_size, measure_world(args.cfg, world_size, args.imgsz, args.steps))
    print_expected(args.expected_world_sizes)


if __name__ == "__main__":
    main()
