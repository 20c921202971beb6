"""What batch-invariant validation costs: ``val.run`` timed in this tree and in another checkout (the baseline).

    python -m benchmarks.speed.bench_batch_invariance --baseline ../yolo-before      # both sets, 1 thread
    python -m benchmarks.speed.bench_batch_invariance --baseline ../yolo-before --images 16 --rounds 2

Two generated held-out sets of ``--images`` noise images with boxes: ``square`` (all 640 x 640) and ``mixed``
(aspect ratios from 1:3 to 3:1, 240 to 800 px). One random-init ``--cfg`` checkpoint (seed 0) is validated at
``--imgsz`` with val.py's defaults (conf 0.001, IoU 0.6, batch ``--batch-size``, no plots, no workers). Each
tree runs in its own process (cwd = that tree, so each imports its own val.py) with ``--threads`` threads; one
warm-up pass, then ``--passes`` timed passes. The two trees alternate for ``--rounds`` rounds, so a change in
machine load falls on both. Printed: the median wall and CPU seconds per pass of each tree and their ratios
(this / baseline). On a shared machine read the CPU-time ratio: the process's own CPU time (one thread, no
loader workers) moves far less with other jobs than its wall time. A benchmark, not a test.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

from benchmarks.cli import parse_checked, parser_for, request_stop_with_parent
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["a", "b", "c", "d"]
MIXED_SIDES = [(240, 720), (720, 240), (480, 640), (640, 480), (360, 800), (800, 360), (512, 512), (600, 300),
               (300, 600), (450, 700)]  # (h, w) cycled over the mixed set

# Runs in the tree under test (cwd): one warm-up pass, then timed passes; prints one JSON line of
# [wall, CPU] seconds per pass.
CHILD = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import val
data, weights, imgsz, batch, passes, out = sys.argv[1:]
seconds = []
for i in range(int(passes) + 1):
    wall, cpu = time.perf_counter(), time.process_time()
    val.run(data, weights=weights, batch_size=int(batch), imgsz=int(imgsz), device="cpu", workers=0, plots=False,
            half=False, project=out, name="val", exist_ok=True)
    seconds.append([time.perf_counter() - wall, time.process_time() - cpu])
print("SECONDS " + json.dumps(seconds[1:]))
"""


def write_set(root: Path, sides: list) -> Path:
    """Noise images of the (h, w) ``sides`` with one box each under ``root``; returns the data YAML."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i, (h, w) in enumerate(sides):
        im = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        cv2.rectangle(im, (w // 3, h // 3), (w // 2, h // 2), (255, 255, 255), -1)
        cv2.imwrite(str(images / f"{i}.jpg"), im)
        (labels / f"{i}.txt").write_text(f"{i % len(NAMES)} 0.4167 0.4167 0.1667 0.1667\n")
    yaml_file = root / "data.yaml"
    yaml_file.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return yaml_file


def write_checkpoint(cfg: Path, path: Path) -> Path:
    """A random-init (seed 0) 4-class model of ``cfg`` saved as a project checkpoint (both trees read it)."""
    from models.yolo import Model
    from utils.training.checkpoints import save_checkpoint

    torch.manual_seed(0)
    model = Model(cfg, nc=len(NAMES))
    save_checkpoint({"model_cfg": model.yaml, "nc": len(NAMES), "names": NAMES, "model": model.state_dict(),
                     "ema": None, "epoch": -1}, path)
    return path


def time_tree(tree: Path, data: Path, weights: Path, args, out: Path) -> list:
    """[wall, CPU] seconds of each timed val.run pass in ``tree``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(data), str(weights), str(args.imgsz),
                           str(args.batch_size), str(args.passes), str(out)], cwd=tree, env=env, capture_output=True,
                          text=True, preexec_fn=request_stop_with_parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SECONDS ")]
    if done.returncode or not lines:
        raise UserError(f"val.run in {tree} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(lines[-1].removeprefix("SECONDS "))


RULES = OptionRules(positive=("imgsz", "batch_size", "images", "passes", "rounds", "threads"), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_batch_invariance", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="another checkout of the project to compare with")
    parser.add_argument("--cfg", default=str(ROOT / "models" / "yolov5n.yaml"))
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32, help="val batch size (val.py's default)")
    parser.add_argument("--images", type=int, default=32, help="images per set")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per tree, alternating with the other")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_checked(parser, RULES, argv)
    baseline = Path(args.baseline).resolve()
    if not (baseline / "val.py").is_file():
        raise UserError(f"--baseline {args.baseline}: no val.py there; give the root of another checkout")

    work = Path(tempfile.mkdtemp(prefix="bench_batch_invariance_"))
    weights = write_checkpoint(Path(args.cfg), work / "model.pt")
    sets = {"square": write_set(work / "square", [(640, 640)] * args.images),
            "mixed": write_set(work / "mixed", [MIXED_SIDES[i % len(MIXED_SIDES)] for i in range(args.images)])}
    print(f"torch {torch.__version__}, CPU, {args.threads} thread(s), {Path(args.cfg).stem} at {args.imgsz}, "
          f"{args.images} images, batch {args.batch_size}, {args.rounds} rounds x {args.passes} passes")
    print(f"{'set':8s} {'wall: this':>11s} {'baseline':>9s} {'ratio':>6s} | {'CPU: this':>10s} {'baseline':>9s} "
          f"{'ratio':>6s}")
    for name, data in sets.items():
        times = {"this": [], "baseline": []}
        for _ in range(args.rounds):
            for side, tree in (("this", ROOT), ("baseline", baseline)):
                times[side] += time_tree(tree, data, weights, args, work / side)
        (wall, cpu), (base_wall, base_cpu) = (np.median(np.array(times[side]), 0) for side in ("this", "baseline"))
        print(f"{name:8s} {wall:11.3f} {base_wall:9.3f} {wall / base_wall:6.3f} | {cpu:10.3f} {base_cpu:9.3f} "
              f"{cpu / base_cpu:6.3f}", flush=True)


if __name__ == "__main__":
    main()
