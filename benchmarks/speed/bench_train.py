"""Training throughput (images/s, data loading included) and peak memory per model.

    python -m benchmarks.speed.bench_train                       # yolov5n, ffca-yolo-n, ffca-yolo at 256, batch 16
    python -m benchmarks.speed.bench_train --models models/yolov5n.yaml --batches 20

Each model runs in its own process so that peak memory is its own.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = ["models/yolov5n.yaml", "models/ffca-yolo-n.yaml", "models/ffca-yolo.yaml"]


def measure_one(args) -> dict:
    from benchmarks.speed.harness import peak_rss_gib, time_batches

    seconds = time_batches(ROOT / args.one, args.imgsz, args.batch_size, args.workers, batches=args.batches,
                           device=args.device)
    return {"model": args.one, "images_per_s": args.batch_size / seconds, "s_per_batch": seconds,
            "peak_rss_gib": peak_rss_gib()}


RULES = OptionRules(positive=("imgsz", "batch_size", "batches"), non_negative=("workers",))


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.bench_train",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=10, help="timed batches after 2 warm-up batches")
    p.add_argument("--device", default="cpu")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = parse_checked(p, RULES, argv)
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    print(f"imgsz {args.imgsz}, batch {args.batch_size}, workers {args.workers}, device {args.device}, "
          f"median of {args.batches} batches")
    print(f"{'model':<28}{'images/s':>10}{'s/batch':>10}{'peak RSS GiB':>14}")
    for model in args.models:
        cmd = [sys.executable, "-m", "benchmarks.speed.bench_train", "--one", model, "--imgsz", str(args.imgsz),
               "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--batches", str(args.batches),
               "--device", args.device]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(f"{r['model']:<28}{r['images_per_s']:>10.2f}{r['s_per_batch']:>10.3f}{r['peak_rss_gib']:>14.2f}")


if __name__ == "__main__":
    main()
