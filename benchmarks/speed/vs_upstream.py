"""This project against upstream YOLOv5 in one run: training, validation, detection and loader images/s.

    pip install --no-deps --target /tmp/yolov5pkg yolov5==7.0.14 psutil seaborn "setuptools<81" ultralytics
                                                                      # once; never a project requirement
    python -m benchmarks.speed.vs_upstream --upstream /tmp/yolov5pkg       # or an upstream checkout's folder
    python -m benchmarks.speed.vs_upstream --upstream /tmp/yolov5pkg --pairs 5 --train-images 128 --val-images 64

Both sides run yolov5n on the same generated shapes data (data/scripts/make_shapes.py, a copy per
side so their label caches never meet), the same image size, batch, workers and thread count.
Training: each side's own Model, ComputeLoss, SGD ``smart_optimizer``, ModelEMA and augmenting
loader, an optimizer step every ``--accumulate`` batches on both. Validation and detection: each
side's own ``val.run`` / ``detect.run`` end to end, on one set of weights (ours, random init seed 0,
or ``--weights``, a state dict or project checkpoint) loaded into both networks, fused; the table
also shows both mAP50-95 values. They differ by design while detections and matches agree: ours is
pycocotools' AP (the precision envelope read at 101 recall points, 0 past the highest recall
reached), upstream's ``compute_ap`` draws a line from the last point to (recall 1, precision 0)
and integrates it with the trapezoid rule, which reads higher when recall stays low and gives a
perfect detector 0.995. Loader: one pass over the augmenting loader.
Every measurement is a fresh process; the sides alternate (ours, upstream) ``--pairs`` times and
the table gives the median of the per-pair ratios and each process's peak RSS (workers counted
apart). A benchmark, not a test: run it on an idle machine. Exits 0 with a message when no
upstream copy is found.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("train", "val", "detect", "loader")
HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "box": 0.05, "cls": 0.5,
       "cls_pw": 1.0, "obj": 1.0, "obj_pw": 1.0, "iou_t": 0.2, "anchor_t": 4.0, "fl_gamma": 0.0,
       "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.5,
       "shear": 0.0, "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0,
       "copy_paste": 0.0, "label_smoothing": 0.0}  # hyp.scratch-low's values, given to both sides


def find_upstream(path):
    """``(folder to put on the worker's PYTHONPATH, module prefix)`` of an upstream copy, or None.

    A PyPI install folder holds ``yolov5/models/yolo.py`` (modules ``yolov5.*``); a checkout holds
    ``models/yolo.py`` at its root (top-level ``models``/``utils``, which is why upstream only
    ever runs in its own process).
    """
    if path is None:
        return None
    path = Path(path)
    if (path / "yolov5" / "models" / "yolo.py").is_file():
        return str(path), "yolov5."
    if (path / "models" / "yolo.py").is_file() and (path / "val.py").is_file():
        return str(path), ""
    return None


# ----------------------------------------------------------------------------- the two sides
class Side:
    """One implementation's entry points, imported inside its own worker process.

    The worker's PYTHONPATH (:func:`worker_env`) decides which tree ``models``/``utils`` come from.
    """

    def __init__(self, name, upstream=None):
        import importlib

        self.name = name
        if name == "ours":
            prefix, self.cfg = "", str(ROOT / "models" / "yolov5n.yaml")
        else:
            folder, prefix = upstream
            self.cfg = str(Path(folder) / prefix.rstrip(".").replace(".", "/") / "models" / "yolov5n.yaml")
        mod = lambda m: importlib.import_module(prefix + m)  # noqa: E731
        yolo, torch_utils = mod("models.yolo"), mod("utils.torch_utils")
        self.Model, self.ModelEMA, self.smart_optimizer = yolo.Model, torch_utils.ModelEMA, torch_utils.smart_optimizer
        self.ComputeLoss = mod("utils.loss").ComputeLoss
        self.create_dataloader = mod("utils.dataloaders").create_dataloader
        self.val, self.detect = mod("val"), mod("detect")
        if name != "ours":
            import numpy

            if not hasattr(numpy, "trapz"):  # upstream 7.0 integrates AP with np.trapz, gone in numpy 2.4
                numpy.trapz = numpy.trapezoid
            for module in (mod("models.common"), mod("utils.downloads")):
                if hasattr(module, "attempt_download_from_hub"):  # the PyPI build asks the Hugging Face hub first
                    module.attempt_download_from_hub = lambda *args, **kwargs: None

    def inference_model(self, model):
        """The fused model as this side's val.py/detect.py would run it from a weights file."""
        if self.name != "ours":
            return model
        from models.backends import PyTorchBackend

        return PyTorchBackend(model)

    def model(self, nc, weights=None):
        """yolov5n with ``nc`` classes, seed-0 init or the given state dict (strict)."""
        import torch

        torch.manual_seed(0)
        model = self.Model(self.cfg, nc=nc)
        if weights is not None:
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
        return model

    def loader(self, path, imgsz, batch, workers, augment, **options):
        """The side's own ``create_dataloader``; ``options`` are extra arguments only this project's takes."""
        kwargs = dict(hyp=dict(HYP), augment=True, shuffle=True, seed=0) if augment else dict(pad=0.5, rect=True)
        return self.create_dataloader(path, imgsz, batch, 32, workers=workers, **kwargs, **options)[0]


def peak_rss_mb():
    """(this process, its largest finished child) peak resident set size in MiB (Linux KiB units)."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def task_train(side, cfg):
    """Images/s over ``cfg['train_batches']`` training steps after two warm-up steps (data included)."""
    import torch

    model = side.model(cfg["nc"])
    model.hyp, model.nc, model.names = dict(HYP), cfg["nc"], cfg["names"]
    model.train()
    layout = torch.channels_last if side.name == "ours" else torch.contiguous_format  # as each train.py runs
    model.to(memory_format=layout)
    compute_loss = side.ComputeLoss(model, dict(HYP)) if side.name == "ours" else side.ComputeLoss(model)
    optimizer = side.smart_optimizer(model, "SGD", HYP["lr0"], HYP["momentum"], HYP["weight_decay"])
    ema = side.ModelEMA(model)
    loader = side.loader(cfg["train"], cfg["imgsz"], cfg["batch"], cfg["workers"], augment=True)
    steps, seen, start = 0, 0, None
    while steps < cfg["train_batches"] + 2:
        for imgs, targets, _, _ in loader:
            if steps == 2:
                start, seen = time.perf_counter(), 0
            loss, _ = compute_loss(model((imgs.float() / 255).contiguous(memory_format=layout)), targets)
            loss.backward()
            steps, seen = steps + 1, seen + len(imgs)
            if steps % cfg["accumulate"] == 0:
                optimizer.step()
                optimizer.zero_grad()
                ema.update(model)
            if steps == cfg["train_batches"] + 2:
                break
    return {"images_per_s": seen / (time.perf_counter() - start)}


def task_val(side, cfg):
    """Images/s of one ``val.run`` on the fused shared weights (loader creation included)."""
    model = side.model(cfg["nc"], cfg["weights"]).eval()
    model.names = dict(enumerate(cfg["names"])) if side.name != "ours" else list(cfg["names"])
    model = side.inference_model(model.fuse())
    data = {"nc": cfg["nc"], "names": cfg["names"], "val": cfg["val"], "train": cfg["train"], "path": cfg["root"]}
    start = time.perf_counter()
    if side.name == "ours":
        results = side.val.run(data, model=model, batch_size=cfg["batch"], imgsz=cfg["imgsz"], workers=cfg["workers"],
                               plots=False).metrics
    else:
        loader = side.loader(cfg["val"], cfg["imgsz"], cfg["batch"], cfg["workers"], augment=False)
        results = side.val.run(data, model=model, dataloader=loader, batch_size=cfg["batch"], imgsz=cfg["imgsz"],
                               plots=False)[0]
    elapsed = time.perf_counter() - start
    return {"images_per_s": cfg["n_val"] / elapsed, "map50": float(results[2]), "map": float(results[3])}


def task_detect(side, cfg):
    """Images/s of one ``detect.run`` over the validation images, nothing saved."""
    import torch

    model = side.model(cfg["nc"], cfg["weights"]).eval()
    kwargs = dict(source=cfg["val"], imgsz=(cfg["imgsz"], cfg["imgsz"]), nosave=True, device="cpu",
                  project=cfg["scratch"], name=side.name)
    if side.name == "ours":
        model.names = list(cfg["names"])
        start = time.perf_counter()
        side.detect.run(weights=None, model=model.fuse(), **kwargs)
    else:
        # upstream loads whole pickled models; this file is the one written just above
        model.names = dict(enumerate(cfg["names"]))
        weights = Path(cfg["scratch"]) / "upstream.pt"
        torch.save({"model": model, "epoch": -1}, weights)
        os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
        start = time.perf_counter()
        side.detect.run(weights=weights, **kwargs)
    return {"images_per_s": cfg["n_val"] / (time.perf_counter() - start)}


def task_loader(side, cfg):
    """Images/s of ``cfg['loader_passes']`` (default 1) passes over the augmenting training loader (mosaic on),
    timed from the end of batch ``cfg['loader_warmup_batches']`` (default 0: from the start, worker start-up
    included); ``cfg['loader_options']`` go to this project's loader only."""
    options = cfg.get("loader_options", {}) if side.name == "ours" else {}
    loader = side.loader(cfg["train"], cfg["imgsz"], cfg["batch"], cfg["workers"], augment=True, **options)
    warmup, batches, seen = cfg.get("loader_warmup_batches", 0), 0, 0
    start = time.perf_counter()
    for _ in range(cfg.get("loader_passes", 1)):
        for imgs, *_ in loader:
            batches, seen = batches + 1, seen + len(imgs)
            if batches == warmup:
                start, seen = time.perf_counter(), 0
    return {"images_per_s": seen / (time.perf_counter() - start)}


def worker(side_name, task, cfg):
    """Run one measurement in this process and print it as one JSON line."""
    import torch

    torch.set_num_threads(cfg["threads"])
    if cfg.get("cpus"):  # pinned: a one-core figure must not borrow a second core (loader workers inherit it)
        os.sched_setaffinity(0, cfg["cpus"])
    side = Side(side_name, cfg.get("upstream"))
    root = cfg["roots"][side_name]
    cfg = dict(cfg, root=root, train=str(Path(root) / "images" / "train"), val=str(Path(root) / "images" / "val"))
    result = {"train": task_train, "val": task_val, "detect": task_detect, "loader": task_loader}[task](side, cfg)
    result["rss_mb"], result["child_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- orchestration
def prepare(args, scratch):
    """Generate the data (one copy per side) and the shared weights; return the worker config."""
    import torch

    from utils.dataset.synthetic.shapes import NAMES, make_shapes
    from models.yolo import Model
    from utils.training.checkpoints import stored_weights

    roots = {}
    for side in ("ours", "upstream"):
        roots[side] = str(make_shapes(scratch / f"shapes_{side}", args.train_images, args.val_images, seed=0))
    weights = scratch / "weights.pt"
    if args.weights:
        state = torch.load(args.weights, map_location="cpu", weights_only=True)
        state = stored_weights(state) if "model_cfg" in state else state
    else:
        torch.manual_seed(0)
        state = Model(ROOT / "models" / "yolov5n.yaml", nc=len(NAMES)).state_dict()
    torch.save({k: v for k, v in state.items()}, weights)
    return {"nc": len(NAMES), "names": list(NAMES), "imgsz": args.imgsz, "batch": args.batch_size,
            "workers": args.workers, "threads": args.threads, "accumulate": args.accumulate,
            "train_batches": args.train_batches, "n_val": args.val_images, "weights": str(weights),
            "roots": roots, "scratch": str(scratch)}


def worker_env(side, cfg):
    """The worker's environment: the side's tree first on PYTHONPATH, so ``models``/``utils`` come from it."""
    from utils.env_vars import recorded  # not at the top: an upstream worker's ``utils`` is upstream's own

    folder = cfg["upstream"][0] if side == "upstream" else str(ROOT)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [folder, recorded("PYTHONPATH")]))}


def run_worker(side, task, cfg):
    """One measurement in a fresh interpreter; the worker's result dict.

    The worker starts from this file's path, not with ``-m``: an upstream checkout has its own top-level
    ``benchmarks.py``, and this project's tree must not be importable on the upstream side.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, task, "--config", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cfg["scratch"], env=worker_env(side, cfg))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"ERROR: {side} {task} worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT "):])


def table(results):
    """The results table: per task, the median images/s of each side, the median pair ratio and peak RSS."""
    rows = ["| task | ours img/s | upstream img/s | ours / upstream (median of pairs) | ours RSS MiB | "
            "upstream RSS MiB | ours mAP50-95 | upstream mAP50-95 |", "|" + " --- |" * 8]
    for task, pairs in results.items():
        ours, up = [p[0] for p in pairs], [p[1] for p in pairs]
        ratio = statistics.median(o["images_per_s"] / u["images_per_s"] for o, u in pairs)
        cell = lambda runs, key: f"{statistics.median(r[key] for r in runs):.4f}" if key in runs[0] else "-"  # noqa: E731
        rows.append(f"| {task} | {statistics.median(r['images_per_s'] for r in ours):.1f} | "
                    f"{statistics.median(r['images_per_s'] for r in up):.1f} | {ratio:.2f}x | "
                    f"{max(r['rss_mb'] for r in ours):.0f} | {max(r['rss_mb'] for r in up):.0f} | "
                    f"{cell(ours, 'map')} | {cell(up, 'map')} |")
    return "\n".join(rows)


# utils.options.OptionRules fields; plain data, as nothing of this project may be imported at the top (see run_worker)
RULE_FIELDS = dict(positive=("pairs", "imgsz", "batch_size", "threads", "accumulate", "train_images",
                             "train_batches", "val_images"), non_negative=("workers",), files=("weights",))


def parse_args(argv=None):
    """The flags; checked (one ERROR line for a bad one) except in a worker, which cannot import this project."""
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        return build_parser(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args(argv)
    from benchmarks.cli import parse_checked, parser_for
    from utils.options import OptionRules

    parser = parser_for("benchmarks.speed.vs_upstream", description=__doc__.splitlines()[0])
    return parse_checked(build_parser(parser), OptionRules(**RULE_FIELDS), argv)


def build_parser(parser):
    parser.add_argument("--upstream", default=None,
                        help="PyPI install folder (pip --target) or upstream checkout; default $YOLOV5_UPSTREAM")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--pairs", type=int, default=3, help="alternating (ours, upstream) runs per task")
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(1, min(os.cpu_count() or 1, 8)))
    parser.add_argument("--accumulate", type=int, default=1, help="optimizer step every N batches, both sides")
    parser.add_argument("--train-images", type=int, default=128)
    parser.add_argument("--train-batches", type=int, default=16, help="timed training steps after 2 warm-up steps")
    parser.add_argument("--val-images", type=int, default=64)
    parser.add_argument("--weights", help="our state dict or checkpoint for val/detect (default: random init)")
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "TASK"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        args = parse_args(argv)
        worker(*args.worker, json.loads(args.config))
        return 0
    from utils.errors import exit_on_user_error  # not at the top: an upstream worker's ``utils`` is upstream's own

    return exit_on_user_error(compare)(argv)


def compare(argv):
    """Both sides, task by task, in alternating pairs; prints the table."""
    from utils.env_vars import read  # not at the top: an upstream worker's ``utils`` is upstream's own

    args = parse_args(argv)
    upstream = find_upstream(args.upstream or read("YOLOV5_UPSTREAM"))
    if upstream is None:
        print(f"upstream YOLOv5 not found ({args.upstream or 'no --upstream given'}); skipping. Install it apart "
              "from the project with `pip install --no-deps --target /tmp/yolov5pkg yolov5==7.0.14` and pass "
              "--upstream /tmp/yolov5pkg, or pass an upstream checkout folder.")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="vs_upstream_"))
    try:
        cfg = dict(prepare(args, scratch), upstream=list(upstream))
        results = {}
        for task in args.tasks:
            results[task] = [(run_worker("ours", task, cfg), run_worker("upstream", task, cfg))
                             for _ in range(args.pairs)]
            print(f"{task}: " + ", ".join(f"{o['images_per_s']:.1f}/{u['images_per_s']:.1f}"
                                          for o, u in results[task]), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nyolov5n, {args.imgsz} px, batch {args.batch_size}, {args.workers} workers, {args.threads} threads, "
          f"{args.train_images} train / {args.val_images} val images, {args.pairs} pairs\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
