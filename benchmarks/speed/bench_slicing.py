"""Sliced-inference throughput (tiles/s and images/s) against tile batch size, with the unsliced pass for scale.

    python -m benchmarks.speed.bench_slicing                                    # FFCA-YOLO-n, 4 images of 1536 px, CPU
    python -m benchmarks.speed.bench_slicing --cfg models/ffca-yolo.yaml --device 0 --batches 1 8 32
    python -m benchmarks.speed.bench_slicing --weights runs/train/exp/weights/best.pt

Images are synthetic large shapes images (data/scripts/make_shapes.py, made in memory, seed 0).
Each figure is the median of ``--runs`` timed passes over all images after one warm-up pass and
includes cutting and letterboxing the tiles, inference, per-tile NMS (conf 0.25, IoU 0.45, as
detect.py), mapping back, the full-image pass (unless --no-full-pass) and the merge. Without
--weights the model is random-init (seed 0). A benchmark, not a test: run it on an idle machine.
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from models.experimental import attempt_load
from models.yolo import Model
from utils.augmentations import letterbox
from utils.dataset.synthetic.shapes import make_image
from utils.ops import non_max_suppression
from utils.slicing import sliced_predictor, tile_grid
from utils.torch_utils import select_device
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]


def large_images(n, size):
    """``n`` synthetic BGR images of ``size`` px with 40-80 objects of 6-16 px."""
    return [make_image(np.random.default_rng([0, i]), size, (6, 16), (40, 80))[0] for i in range(n)]


def load_model(args, device):
    if args.weights:
        return attempt_load(args.weights, device=device, fuse=True)
    torch.manual_seed(0)
    return Model(args.cfg, nc=4).to(device).fuse().eval()


def median_seconds(fn, runs):
    """Median wall time of ``runs`` calls of ``fn`` after one warm-up call (CUDA synchronised)."""
    fn()
    times = []
    for _ in range(runs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def unsliced_pass(model, images, imgsz, stride, device):
    """detect.py's single letterboxed pass over every image."""
    for im0 in images:
        im = letterbox(im0, imgsz, stride=stride, auto=True)[0]
        x = torch.from_numpy(np.ascontiguousarray(im[..., ::-1].transpose(2, 0, 1)))[None].to(device).float() / 255
        non_max_suppression(model(x)[0], 0.25, 0.45, max_det=1000)


RULES = OptionRules(positive=("images", "image_size", "slice", "imgsz", "batches", "runs"), fractions=("overlap",),
                    files=("cfg", "weights"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_slicing",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", default=str(ROOT / "models" / "ffca-yolo-n.yaml"), help="model YAML (random init)")
    parser.add_argument("--weights", default="", help="checkpoint instead of a random-init --cfg model")
    parser.add_argument("--device", default="cpu", help="cpu or a CUDA index")
    parser.add_argument("--images", type=int, default=4, help="number of synthetic images")
    parser.add_argument("--image-size", type=int, default=1536, help="side of each synthetic image")
    parser.add_argument("--slice", type=int, default=640, help="tile size")
    parser.add_argument("--overlap", type=float, default=0.2, help="tile overlap")
    parser.add_argument("--imgsz", type=int, default=640, help="full-pass (and unsliced) inference size")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="tile batch sizes to compare")
    parser.add_argument("--no-full-pass", action="store_true", help="tiles only")
    parser.add_argument("--runs", type=int, default=3, help="timed passes per figure")
    args = parse_checked(parser, RULES, argv)

    device = select_device(args.device)
    model = load_model(args, device)
    stride = int(model.stride.max())
    images = large_images(args.images, args.image_size)
    n_tiles = sum(len(tile_grid(*im.shape[:2], args.slice, args.overlap)) for im in images)
    print(f"{args.images} images of {args.image_size} px, {n_tiles // args.images} tiles of {args.slice} px each "
          f"(overlap {args.overlap}), device {device}")
    with torch.no_grad():
        seconds = median_seconds(lambda: unsliced_pass(model, images, args.imgsz, stride, device), args.runs)
        print(f"unsliced --imgsz {args.imgsz}: {args.images / seconds:8.2f} images/s")
        for batch in args.batches:
            predictor = sliced_predictor(lambda x: model(x), args.slice, args.overlap, args.no_full_pass, "nms",
                                         batch, 0.25, 0.45, 1000, args.imgsz, stride, device)
            seconds = median_seconds(lambda: [predictor(im) for im in images], args.runs)
            print(f"sliced, tile batch {batch:3d}: {n_tiles / seconds:8.2f} tiles/s {args.images / seconds:8.2f} "
                  "images/s")


if __name__ == "__main__":
    main()
