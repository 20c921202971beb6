"""PyTorch vs ONNX Runtime vs OpenVINO inference time per image on CPU (batch 1, fp32, fused model, untrained weights).

Usage: python -m benchmarks.speed.bench_onnx [--imgsz 640] [--runs 20] [--threads 0] [--cfg models/yolov5n.yaml ...]

Each model is built from its YAML, saved as a checkpoint in a temporary folder, exported with
export.py to ONNX and OpenVINO (static shape, checked against PyTorch), then all three are timed on
the same input; the script prints the median milliseconds per image of each and PyTorch's time
divided by ONNX Runtime's.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import export
from models.backends import load_backend
from models.yolo import Model
from utils.training.checkpoints import save_checkpoint
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("models/yolov5n.yaml", "models/ffca-yolo-n.yaml", "models/ffca-yolo.yaml")


def median_ms(fn, im, warmup: int, runs: int) -> float:
    """Median wall-clock milliseconds of ``fn(im)`` over ``runs`` calls after ``warmup`` calls."""
    times = []
    with torch.no_grad():
        for i in range(warmup + runs):
            start = time.perf_counter()
            fn(im)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_one(cfg: str, imgsz: int, warmup: int, runs: int, folder: Path) -> tuple[float, float, float]:
    """(PyTorch ms, ONNX Runtime ms, OpenVINO ms) per image for model YAML ``cfg`` at ``imgsz``."""
    model = Model(ROOT / cfg)
    weights = folder / f"{Path(cfg).stem}.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": model.nc, "names": model.names, "model": model.state_dict(),
                     "ema": None}, weights)
    exported = export.run(weights, imgsz=[imgsz], include=["onnx", "openvino"])
    im = torch.rand(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    return tuple(median_ms(load_backend(path), im, warmup, runs) for path in (weights, *exported))


RULES = OptionRules(positive=("imgsz", "runs"), non_negative=("warmup", "threads"), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_onnx",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", nargs="+", default=list(MODELS), help="model YAMLs")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = leave as is)")
    opt = parse_checked(parser, RULES, argv)
    if opt.threads:
        torch.set_num_threads(opt.threads)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for cfg in opt.cfg:
            rows.append((cfg, *bench_one(cfg, opt.imgsz, opt.warmup, opt.runs, Path(folder))))
    print(f"\n{'model':<28}{'PyTorch ms':>12}{'ONNX RT ms':>12}{'ratio':>8}{'OpenVINO ms':>13}"
          f"   (CPU, batch 1, {opt.imgsz} px)")
    for cfg, pt_ms, ort_ms, ov_ms in rows:
        print(f"{cfg:<28}{pt_ms:>12.1f}{ort_ms:>12.1f}{pt_ms / ort_ms:>8.2f}{ov_ms:>13.1f}")


if __name__ == "__main__":
    main()
