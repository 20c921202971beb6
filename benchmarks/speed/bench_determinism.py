"""Cost of each determinism mode: median time per training batch and the ratio to ``off``.

    python -m benchmarks.speed.bench_determinism                                  # CPU, yolov5n and ffca-yolo, 256 px
    python -m benchmarks.speed.bench_determinism --device 0 --batch-size 32      # the same on a GPU

Modes are measured round-robin (off, warn, scoped, strict, off, ...) so that drift in machine load
spreads over all of them; each figure is the median over rounds of per-round medians.
"""

import argparse
import statistics
from pathlib import Path

from benchmarks.speed.harness import time_batches

ROOT = Path(__file__).resolve().parents[2]

MODES = ("off", "warn", "scoped", "strict")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["models/yolov5n.yaml", "models/ffca-yolo.yaml"])
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batches", type=int, default=5, help="timed batches per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = "cpu" if args.device == "cpu" else f"cuda:{args.device}"
    print(f"imgsz {args.imgsz}, batch {args.batch_size}, workers {args.workers}, device {device}, "
          f"{args.rounds} rounds x {args.batches} batches")
    print(f"{'model':<26}{'mode':<8}{'s/batch':>10}{'vs off':>9}")
    for model in args.models:
        samples = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                samples[mode].append(time_batches(ROOT / model, args.imgsz, args.batch_size, args.workers, mode,
                                                  warmup=1, batches=args.batches, device=device))
        base = statistics.median(samples["off"])
        for mode in MODES:
            median = statistics.median(samples[mode])
            print(f"{model:<26}{mode:<8}{median:>10.3f}{median / base:>9.3f}")


if __name__ == "__main__":
    main()
