"""val.py and detect.py throughput (images/s) for yolov5s and FFCA-YOLO with random-init weights.

    python -m benchmarks.speed.bench_val_detect                          # 640 px, CPU, 32 images, 3 runs
    python -m benchmarks.speed.bench_val_detect --images 8 --runs 2      # quicker
    python -m benchmarks.speed.bench_val_detect --device 0 --batch-size 32

Validation figures include data loading, inference, NMS (conf 0.001, IoU 0.6, as val.py's
defaults) and the metric computation; detect figures include reading and letterboxing each image,
inference and NMS (conf 0.25), without writing results. The model is loaded once per
architecture (not timed); each figure is the median of ``--runs`` timed passes over the first
``--images`` validation images of the embedded shapes data set (generated offline on first use).
A benchmark, not a test: run it on an idle machine.
"""

import statistics
import tempfile
import time
from pathlib import Path

import torch

import detect
import val
from models.experimental import attempt_load
from models.yolo import Model
from utils.training.checkpoints import save_checkpoint
from utils.dataset.data_config import check_dataset
from utils.dataloaders import create_dataloader
from utils.torch_utils import select_device
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"yolov5s": ROOT / "models" / "yolov5s.yaml", "ffca-yolo": ROOT / "models" / "ffca-yolo.yaml"}


def random_checkpoint(cfg, names, path):
    """Save a random-init (seed 0) model of ``cfg`` for ``names`` as a project checkpoint."""
    torch.manual_seed(0)
    model = Model(cfg, nc=len(names))
    save_checkpoint({"model_cfg": model.yaml, "nc": len(names), "names": names, "model": model.state_dict(),
                     "ema": None, "epoch": -1}, path)
    return path


def median_rate(fn, n_images, runs):
    """Median images/s over ``runs`` calls of ``fn`` (each processing ``n_images``), after one warm-up call."""
    fn()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        rates.append(n_images / (time.perf_counter() - t0))
    return statistics.median(rates), rates


RULES = OptionRules(positive=("imgsz", "batch_size", "images", "runs"), files=("data",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_val_detect", description="val.py / detect.py throughput benchmark")
    parser.add_argument("--data", default=str(ROOT / "data" / "shapes.yaml"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=8, help="val batch size")
    parser.add_argument("--images", type=int, default=32, help="validation images per timed pass")
    parser.add_argument("--runs", type=int, default=3, help="timed passes (median reported)")
    parser.add_argument("--device", default="cpu")
    args = parse_checked(parser, RULES, argv)

    data = check_dataset(args.data)
    device = select_device(args.device, batch_size=args.batch_size)
    work = Path(tempfile.mkdtemp(prefix="bench_val_detect_"))
    val_images = sorted(Path(data["val"]).glob("*.*"))[:args.images]
    image_list = work / "images.txt"
    image_list.write_text("".join(f"{p}\n" for p in val_images))
    n = len(val_images)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, imgsz {args.imgsz}, "
          f"{n} images, val batch {args.batch_size}, {args.runs} runs")

    for name in args.models:
        weights = random_checkpoint(MODELS[name], data["names"], work / f"{name}.pt")
        model = attempt_load(weights, device=device, fuse=True)
        loader = create_dataloader(str(image_list), args.imgsz, args.batch_size, int(model.stride.max()),
                                   pad=0.5, rect=True, workers=0, nc=data["nc"])[0]

        def validate():
            val.run(data, batch_size=args.batch_size, imgsz=args.imgsz, model=model, dataloader=loader,
                    save_dir=work, plots=False, half=False)

        def run_detect():
            detect.run(None, str(image_list), imgsz=(args.imgsz,), model=model, nosave=True,
                       project=work, name="detect", exist_ok=True)

        val_rate, val_runs = median_rate(validate, n, args.runs)
        det_rate, det_runs = median_rate(run_detect, n, args.runs)
        print(f"{name:10s} val {val_rate:6.2f} images/s (runs {', '.join(f'{r:.2f}' for r in val_runs)}) | "
              f"detect {det_rate:6.2f} images/s (runs {', '.join(f'{r:.2f}' for r in det_runs)})")


if __name__ == "__main__":
    main()
