"""NMS before/after in one process: the per-image reference (tests/test_ops.py) against utils.ops, alternating.

    python benchmarks/ab_nms.py              # 16 images x 4032 predictions (yolov5n at 256 px), 3 classes
    python benchmarks/ab_nms.py --reps 9 --threads 1

Prints the median of per-repetition time ratios (reference / current) at val.py's and detect.py's settings.
A benchmark, not a test: run it on an idle machine.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "tests"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from test_ops import _random_prediction, _reference_nms  # noqa: E402
from utils.ops import non_max_suppression  # noqa: E402

SETTINGS = {"val": {"conf_thres": 0.001, "iou_thres": 0.6, "multi_label": True},
            "detect": {"conf_thres": 0.25, "iou_thres": 0.45, "max_det": 1000}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--predictions", type=int, default=4032)
    parser.add_argument("--nc", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pred = _random_prediction(torch.Generator().manual_seed(0), args.images, args.predictions, args.nc)
    for name, kwargs in SETTINGS.items():
        ratios, current = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            _reference_nms(pred, **kwargs)
            t1 = time.perf_counter()
            non_max_suppression(pred, **kwargs)
            t2 = time.perf_counter()
            ratios.append((t1 - t0) / (t2 - t1))
            current.append((t2 - t1) / args.images * 1e3)
        print(f"{name}: reference / current = {statistics.median(ratios):.2f}x "
              f"(current {statistics.median(current):.2f} ms per image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
