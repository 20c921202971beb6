"""Cost of each determinism mode: median time per training batch and the ratio to ``off``.

    python -m benchmarks.speed.bench_determinism                                  # CPU, yolov5n and ffca-yolo, 256 px
    python -m benchmarks.speed.bench_determinism --device 0 --batch-size 32      # the same on a GPU

Modes are measured round-robin (off, warn, scoped, strict, off, ...) so that drift in machine load
spreads over all of them; each figure is the median over rounds of per-round medians.
``--fixed-batch`` times the training step alone on one batch, without loading or augmenting data,
which removes the loader's variance from a comparison of step costs.
"""

import argparse
import statistics
from pathlib import Path

from benchmarks.speed.harness import time_batches, time_fixed_batch
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]

MODES = ("off", "warn", "scoped", "strict")
# (row label, --deterministic mode, NaN fill of new tensors: None = as the mode sets it). The last row is
# scoped as it ran before the fill was skipped, measured in the same rounds for the ratio.
ROWS = [(mode, mode, None) for mode in MODES] + [("scoped+nanfill", "scoped", True)]


RULES = OptionRules(positive=("imgsz", "batch_size", "batches", "rounds"), non_negative=("workers",))


def time_mode(args, cfg: Path, mode: str, device: str, nan_fill) -> float:
    """One round's median seconds per step for ``mode``."""
    if args.fixed_batch:
        return time_fixed_batch(cfg, args.imgsz, args.batch_size, mode, device, warmup=2, batches=args.batches,
                                nan_fill=nan_fill)
    return time_batches(cfg, args.imgsz, args.batch_size, args.workers, mode, warmup=1, batches=args.batches,
                        device=device, nan_fill=nan_fill)


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.bench_determinism",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["models/yolov5n.yaml", "models/ffca-yolo.yaml"])
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=5, help="timed batches per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--fixed-batch", action="store_true", help="time the step on one batch, without the loader")
    args = parse_checked(p, RULES, argv)
    device = "cpu" if args.device == "cpu" else f"cuda:{args.device}"
    print(f"imgsz {args.imgsz}, batch {args.batch_size}, workers {args.workers}, device {device}, "
          f"{args.rounds} rounds x {args.batches} batches")
    print(f"{'model':<26}{'mode':<16}{'s/batch':>10}{'vs off':>9}")
    for model in args.models:
        samples = {label: [] for label, _, _ in ROWS}
        for _ in range(args.rounds):
            for label, mode, nan_fill in ROWS:
                samples[label].append(time_mode(args, ROOT / model, mode, device, nan_fill))
        base = statistics.median(samples["off"])
        for label, _, _ in ROWS:
            median = statistics.median(samples[label])
            print(f"{model:<26}{label:<16}{median:>10.3f}{median / base:>9.3f}")


if __name__ == "__main__":
    main()
