"""CPU time per image of one forward pass at each number of images per pass: what sets the CPU's fixed pass.

    python -m benchmarks.speed.bench_pass_size                                     # yolov5n and ffca-yolo-n
    python -m benchmarks.speed.bench_pass_size --cfg models/yolov5n.yaml --imgsz 352 640 --rounds 15

Batch-invariant evaluation runs every forward pass at one fixed number of images on the CPU
(utils/batch_invariance.py); this measures which number costs least per image. Each ``--cfg`` is a random-init
(seed 0) 4-class checkpoint loaded as val.py and detect.py load it (fused, channels-last). For each
``--imgsz`` (square inputs, random pixels) and each ``--sizes`` value the model runs ``max(sizes)`` images,
``size`` at a time, after one warm-up pass; the sizes alternate for ``--rounds`` rounds, so a change in machine
load falls on all of them. Printed: the median process CPU seconds per image (one thread by default: the
process's own CPU time moves far less with other jobs than its wall time) and the ratio to ``--sizes``'s first
value. A benchmark, not a test.
"""

import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.cli import parse_checked, parser_for
from benchmarks.speed.bench_batch_invariance import write_checkpoint
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CFGS = [str(ROOT / "models" / "yolov5n.yaml"), str(ROOT / "models" / "ffca-yolo-n.yaml")]


def cpu_seconds_per_image(model, images: torch.Tensor, size: int) -> float:
    """Process CPU seconds per image of running ``images`` (n, 3, h, w) through ``model``, ``size`` at a time."""
    passes = images.split(size)
    model(passes[0])  # warm-up: the kernels for this input shape are chosen and packed here
    start = time.process_time()
    for chunk in passes:
        model(chunk)
    return (time.process_time() - start) / len(images)


def pass_size_rows(cfg: str, args, folder: Path) -> list:
    """One table row per ``--imgsz`` for ``cfg``: the median CPU ms per image at each pass size and its ratio."""
    from models.backends import load_backend

    weights = write_checkpoint(Path(cfg), folder / f"{Path(cfg).stem}.pt")
    model = load_backend(weights, device=torch.device("cpu"), fuse=True)
    rows = []
    for imgsz in args.imgsz:
        images = torch.rand(max(args.sizes), 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
        seconds = {size: [] for size in args.sizes}
        for _ in range(args.rounds):
            for size in args.sizes:
                seconds[size].append(cpu_seconds_per_image(model, images, size))
        medians = [statistics.median(seconds[size]) for size in args.sizes]
        cells = " | ".join(f"{m * 1e3:.1f} ms ({m / medians[0]:.3f})" for m in medians)
        rows.append(f"| {Path(cfg).stem} | {imgsz} | {cells} |")
    return rows


RULES = OptionRules(positive=("imgsz", "sizes", "rounds", "threads"), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_pass_size", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", nargs="+", default=DEFAULT_CFGS, help="model YAMLs")
    parser.add_argument("--imgsz", type=int, nargs="+", default=[352, 640], help="square input sides")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="images per forward pass")
    parser.add_argument("--rounds", type=int, default=8, help="timed passes over the images per size")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    folder = Path(tempfile.mkdtemp(prefix="bench_pass_size_"))
    print(f"torch {torch.__version__}, CPU, {args.threads} thread(s), {max(args.sizes)} images per round, "
          f"{args.rounds} rounds; CPU ms per image at each pass size (ratio to {args.sizes[0]})")
    print("| model | px | " + " | ".join(f"{s} per pass" for s in args.sizes) + " |")
    print("|---|---|" + "---|" * len(args.sizes), flush=True)
    for cfg in args.cfg:
        print("\n".join(pass_size_rows(cfg, args, folder)), flush=True)


if __name__ == "__main__":
    main()
