"""Whole processes against upstream YOLOv5, each side's own command line: launch to the first training batch
(cold and warm, with where the seconds go), a 3-epoch training run end to end, and val.py end to end.

    git clone https://github.com/ultralytics/yolov5 /tmp/yolov5src                  # upstream, never vendored
    pip install --no-deps --target /tmp/yolov5pkg ultralytics psutil seaborn "setuptools<81"   # what it imports
    python -m benchmarks.speed.vs_upstream_process --upstream /tmp/yolov5src --site /tmp/yolov5pkg

Both sides train yolov5n from scratch on the same generated shapes data (a copy per side, so their label
caches never meet), ``--imgsz 256 --batch-size 16 --workers 2 --device cpu --epochs 3``, every other flag at
its default (plots on, each side's default determinism: our ``scoped``, upstream's ``init_seeds(deterministic=True)``).
Upstream's plots need Arial.ttf, which it would download; it gets matplotlib's DejaVuSans under that name in a
scratch ``YOLOV5_CONFIG_DIR`` instead (nothing is written to the user's folders). Validation runs
``val.py --weights W --data D --imgsz 256 --batch-size 32 --device cpu`` on one set of weights: our 3-epoch
``best.pt``, loaded into upstream's Model class for upstream's side.

Start-up is measured from launch to the first batch the training loader yields (the child replaces the loader
iterator's ``__next__`` and exits there). ``cold``: fresh data copies (no label cache) and, for us, an empty
audit cache; ``warm``: the same command again. The phases are the time spent inside each side's own
``create_dataloader`` (label scan and caches), ``check_anchors``, ``Model``, ``smart_optimizer``, ``plot_labels``
where train.py calls it (upstream plots labels elsewhere) and (ours) ``start_up_audit``, and the imports of
``train.py``; the rest is everything else up to the first batch (loader workers starting included). Every measurement is a fresh process; sides alternate ``--pairs`` times and the
tables give medians. A benchmark, not a test: run it on an idle machine.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cli import parse_checked, parser_for
from benchmarks.peers import offline_config_folder
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules
from utils.training.checkpoints import stored_weights

ROOT = Path(__file__).resolve().parents[2]
RULES = OptionRules(positive=("pairs", "train_images", "val_images", "epochs"))
PHASES = {"create_dataloader": "data loaders (label scan, caches)", "check_anchors": "AutoAnchor",
          "Model": "model build", "start_up_audit": "determinism audit",
          "smart_optimizer": "optimizer (its first use imports torch._dynamo)", "plot_labels": "labels.jpg"}
NAMES = ["circle", "square", "triangle", "cross"]

# Runs a side's train.py (cwd = that side's tree) until its training loader yields a batch; prints JSON
# {"imports": s, "first_batch": s, phase: s...}, seconds since the parent's launch time.
FIRST_BATCH_CHILD = """
import importlib, json, os, sys, time
launched = float(os.environ["BENCH_LAUNCHED_AT"])
sys.path.insert(0, os.getcwd())
sys.argv = ["train.py", *json.loads(os.environ["BENCH_ARGV"])]
train = importlib.import_module("train")
report = {"imports": time.time() - launched}
def timed(name, fn):
    def run(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            report[name] = report.get(name, 0.0) + time.time() - start
    return run
for name in json.loads(os.environ["BENCH_PHASES"]):
    if hasattr(train, name):
        setattr(train, name, timed(name, getattr(train, name)))
import torch.utils.data.dataloader as loader_module
next_batch = loader_module._BaseDataLoaderIter.__next__
def first_batch(self):
    batch = next_batch(self)
    report["first_batch"] = time.time() - launched
    print("BENCH " + json.dumps(report), flush=True)
    os._exit(0)
loader_module._BaseDataLoaderIter.__next__ = first_batch
train.main(train.parse_opt())
"""

# In upstream's tree: our weights (a state dict) into upstream's Model, saved the way upstream's val.py loads.
UPSTREAM_WEIGHTS_CHILD = """
import sys, torch
sys.path.insert(0, ".")
from models.yolo import Model
state, cfg, nc, names, out = torch.load(sys.argv[1], weights_only=True), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
model = Model(cfg, nc=nc)
model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
model.names, model.nc = dict(enumerate(names.split(","))), nc
torch.save({"model": model.half(), "epoch": -1}, out)
"""


class Sides:
    """Where each side's scripts live and the environment each runs in."""

    def __init__(self, upstream: Path, site: Path | None, scratch: Path):
        self.trees = {"ours": ROOT, "upstream": upstream}
        config_dir = offline_config_folder(scratch / "yolov5-config")
        path = os.pathsep.join(str(p) for p in (upstream, site) if p)
        self.env = {"ours": {**os.environ, "FFCA_AUDIT_CACHE": str(scratch / "audit-cache")},
                    "upstream": {**os.environ, "PYTHONPATH": path, "YOLOV5_CONFIG_DIR": str(config_dir)}}

    def run(self, side, argv, env=None, timeout=1800) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *argv], cwd=self.trees[side], env={**self.env[side], **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise UserError(f"{side} {' '.join(argv[:2])} exited {done.returncode}: "
                            f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return done


def make_data(scratch: Path, name: str, n_train: int, n_val: int) -> Path:
    """Generated shapes data in its own folder and its YAML; returns the YAML."""
    from utils.dataset.synthetic.shapes import make_shapes

    root = make_shapes(scratch / name, n_train, n_val, seed=0)
    yaml_file = scratch / f"{name}.yaml"
    yaml_file.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return yaml_file


def train_argv(sides, side, data, project, name, epochs):
    cfg = sides.trees[side] / "models" / "yolov5n.yaml"
    return ["--data", str(data), "--cfg", str(cfg), "--weights", "", "--epochs", str(epochs), "--imgsz", "256",
            "--batch-size", "16", "--workers", "2", "--device", "cpu", "--project", str(project), "--name", name]


def first_batch(sides, side, argv, env=None) -> dict:
    """Seconds from launch to imports done, to the first training batch, and inside each phase."""
    extra = {"BENCH_ARGV": json.dumps(argv), "BENCH_PHASES": json.dumps(list(PHASES)), **(env or {}),
             "BENCH_LAUNCHED_AT": repr(time.time())}
    out = sides.run(side, ["-c", FIRST_BATCH_CHILD], env=extra)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")]
    if not lines:
        raise UserError(f"{side} train.py never reached a training batch: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len("BENCH "):])


def wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def start_up_rows(sides, args, scratch) -> dict:
    """{(side, 'cold' | 'warm'): [report per pair]} of launch-to-first-batch runs."""
    rows = {}
    for pair in range(args.pairs):
        for side in ("ours", "upstream"):
            data = make_data(scratch, f"startup-{side}-{pair}", args.train_images, args.val_images)
            argv = train_argv(sides, side, data, scratch / "startup-runs", f"{side}-{pair}", args.epochs)
            cold_cache = {"FFCA_AUDIT_CACHE": str(scratch / f"audit-cold-{pair}")}
            for variant in ("cold", "warm"):
                report = first_batch(sides, side, argv, cold_cache)
                rows.setdefault((side, variant), []).append(report)
                print(f"start-up {side} {variant}: {report['first_batch']:.1f} s", flush=True)
    return rows


def train_and_val_rows(sides, args, scratch) -> dict:
    """{'train' | 'val': {side: [wall s per pair]}}: whole training runs, then val.py on our first run's best.pt."""
    data = {side: make_data(scratch, f"full-{side}", args.train_images, args.val_images) for side in sides.trees}
    walls = {"train": {"ours": [], "upstream": []}, "val": {"ours": [], "upstream": []}}
    for pair in range(args.pairs):
        for side in ("ours", "upstream"):
            argv = ["train.py", *train_argv(sides, side, data[side], scratch / "runs", f"{side}-{pair}", args.epochs)]
            walls["train"][side].append(wall(lambda: sides.run(side, argv)))
            print(f"train {side}: {walls['train'][side][-1]:.1f} s", flush=True)
    weights = val_weights(sides, scratch)
    for pair in range(args.pairs):
        for side in ("ours", "upstream"):
            argv = ["val.py", "--weights", str(weights[side]), "--data", str(data[side]), "--imgsz", "256",
                    "--batch-size", "32", "--device", "cpu", "--project", str(scratch / "val"), "--name", side]
            walls["val"][side].append(wall(lambda: sides.run(side, argv)))
            print(f"val {side}: {walls['val'][side][-1]:.1f} s", flush=True)
    return walls


def val_weights(sides, scratch) -> dict:
    """Our first training run's best.pt, and the same weights saved for upstream's val.py."""
    import torch

    ours = scratch / "runs" / "ours-0" / "weights" / "best.pt"
    ckpt = torch.load(ours, map_location="cpu", weights_only=True)
    state = scratch / "state.pt"
    torch.save(stored_weights(ckpt), state)
    upstream = scratch / "upstream-best.pt"
    sides.run("upstream", ["-c", UPSTREAM_WEIGHTS_CHILD, str(state), "models/yolov5n.yaml", str(len(NAMES)),
                           ",".join(NAMES), str(upstream)])
    return {"ours": ours, "upstream": upstream}


def rest(report: dict) -> float:
    """Start-up seconds outside the imports and the timed phases: options, run folder, loader workers' first batch."""
    return report["first_batch"] - report["imports"] - sum(report.get(key, 0.0) for key in PHASES)


def median(values) -> float:
    return statistics.median(values)


def report(start_up, walls, args) -> str:
    lines = [f"yolov5n, shapes data ({args.train_images} train / {args.val_images} val), 256 px, batch 16, "
             f"2 workers, CPU, {os.cpu_count()} cores, median of {args.pairs} pairs", "",
             "| launch to first batch | ours s | upstream s | ours / upstream |", "| --- | --- | --- | --- |"]
    for variant in ("cold", "warm"):
        ours, up = (median(r["first_batch"] for r in start_up[(s, variant)]) for s in ("ours", "upstream"))
        lines.append(f"| {variant} | {ours:.2f} | {up:.2f} | {ours / up:.2f}x |")
    lines += ["", "| where the seconds go (warm) | ours s | upstream s |", "| --- | --- | --- |"]
    for key, label in [("imports", "imports of train.py"), *PHASES.items(), ("rest", "everything else")]:
        cells = [median(r.get(key, 0.0) if key != "rest" else rest(r) for r in start_up[(s, "warm")])
                 for s in ("ours", "upstream")]
        lines.append(f"| {label} | {cells[0]:.2f} | {cells[1]:.2f} |")
    lines += ["", "| whole process | ours s | upstream s | ours / upstream time | speed-up |",
              "| --- | --- | --- | --- | --- |"]
    for task, label in [("train", f"train.py, {args.epochs} epochs"), ("val", "val.py")]:
        ours, up = median(walls[task]["ours"]), median(walls[task]["upstream"])
        lines.append(f"| {label} | {ours:.1f} | {up:.1f} | {ours / up:.2f}x | {up / ours:.2f}x |")
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.vs_upstream_process", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="an upstream YOLOv5 checkout (git clone) folder")
    p.add_argument("--site", help="folder with the packages upstream imports (pip install --target)")
    p.add_argument("--pairs", type=int, default=3, help="alternating (ours, upstream) runs per measurement")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-images", type=int, default=128)
    p.add_argument("--val-images", type=int, default=64)
    args = parse_checked(p, RULES, argv)
    upstream = Path(args.upstream).resolve()
    if not (upstream / "train.py").is_file() or not (upstream / "models" / "yolo.py").is_file():
        raise UserError(f"--upstream {args.upstream}: not a YOLOv5 checkout (no train.py and models/yolo.py); "
                        "git clone https://github.com/ultralytics/yolov5 there")
    scratch = Path(tempfile.mkdtemp(prefix="vs_upstream_process_"))
    try:
        sides = Sides(upstream, Path(args.site).resolve() if args.site else None, scratch)
        start_up = start_up_rows(sides, args, scratch)
        walls = train_and_val_rows(sides, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n" + report(start_up, walls, args))
    return 0


if __name__ == "__main__":
    main()
