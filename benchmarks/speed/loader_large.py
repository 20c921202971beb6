"""The augmenting loader on the large images small-object data sets ship (VisDrone 2000 x 1500, DOTA up to
4000 x 4000, VEDAI 1024 x 1024): this project's loader, with and without ``--reduced-decode``, against upstream
YOLOv5's, beside the decode limit each is built on. ``--imgsz 640``, mosaic on.

    pip install --no-deps --target /tmp/yolov5pkg yolov5==7.0.14 psutil seaborn "setuptools<81" ultralytics  # once
    python -m benchmarks.speed.loader_large --upstream /tmp/yolov5pkg
    python -m benchmarks.speed.loader_large --upstream /tmp/yolov5pkg --sets jpeg-2000x1500 --repeats 5

Images are tiles of the ``photos`` data kind (scenes cut from scikit-image's bundled photographs, with their
objects and labels), so every part of a large image holds photo detail, not upscaled blur or flat colour, which
would decode unrealistically fast. JPEGs are written at quality 90.

Per set and per loader setting (one core: ``--workers 0`` with the process pinned to one CPU; and two loader
workers on two CPUs) every loader runs in a fresh process (benchmarks/speed/vs_upstream.py's workers),
upstream, ours, ours with ``--reduced-decode`` and ours with ``--cache disk`` (filled while the loader is built,
so its figure is every epoch after the first) in turn, ``--repeats`` times; the table gives medians.
Each is timed after its first batch (one per worker), so worker start-up is left out.
The decode limit is the images/s a mosaic loader would reach if it did nothing but decode (four images per
sample), from the median one-thread decode time per image: a full ``cv2.imread``, or the reduced decode and
the shrink to ``--imgsz`` that ``--reduced-decode`` does. Upstream's loader decodes at full size.
The last lines extrapolate one core's figure to a 16-core GPU server (linear in cores; a measurement with
16 workers replaces it when the GPU proof runs on one). A benchmark, not a test: run it on an idle machine.
"""

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from benchmarks.cli import parse_checked, parser_for
from benchmarks.speed.vs_upstream import find_upstream, run_worker
from utils.dataset.image_cache import ImageCache
from utils.dataset.image_io import jpeg_reduction, read_image
from utils.dataset.synthetic.photos import make_photo_image
from utils.env_vars import read
from utils.errors import exit_on_user_error
from utils.options import OptionRules

SETS = {"jpeg-2000x1500": (2000, 1500, "jpg"), "jpeg-4000x3000": (4000, 3000, "jpg"),
        "png-1024x1024": (1024, 1024, "png")}
TILE = 500  # px of each photos-kind scene a large image is tiled from
SERVER_CORES = 16
RULES = OptionRules(positive=("images", "imgsz", "batch_size", "repeats", "passes"))


def write_large_set(root: Path, width: int, height: int, suffix: str, n: int, seed: int = 0) -> Path:
    """``n`` images of ``width`` x ``height`` tiled from photos-kind scenes, with their labels, in YOLO layout
    (``root/images/train``, ``root/labels/train``); returns ``root``."""
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        im, rows = np.zeros((height, width, 3), np.uint8), []
        for y0 in range(0, height, TILE):
            for x0 in range(0, width, TILE):
                tile, boxes = make_photo_image(rng, size=TILE)
                h, w = min(TILE, height - y0), min(TILE, width - x0)
                im[y0:y0 + h, x0:x0 + w] = tile[:h, :w]
                rows += [(c, (x0 + x * TILE) / width, (y0 + y * TILE) / height, bw * TILE / width, bh * TILE / height)
                         for c, x, y, bw, bh in boxes if (x + bw / 2) * TILE <= w and (y + bh / 2) * TILE <= h]
        cv2.imwrite(str(images / f"im{i}.{suffix}"), im, [cv2.IMWRITE_JPEG_QUALITY, 90])
        (labels / f"im{i}.txt").write_text("".join(f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n"
                                                   for c, x, y, w, h in rows))
    return root


def copy_set(src: Path, dst: Path) -> Path:
    """A second copy of a set for the other side (hard-linked images, copied labels): label caches never meet."""
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("*.cache"))
    for label in (dst / "labels").rglob("*.txt"):
        label.unlink()
        shutil.copy(src / label.relative_to(dst), label)
    return dst


def decode_ms(files: list, long_side: int, imgsz: int, reduced: bool) -> float:
    """Median one-thread ms to decode one image: at full size, or (``reduced``) at the scale ``--reduced-decode``
    picks for a ``long_side`` px image trained at ``imgsz`` (1 where it picks none: PNG, small images)."""
    times = []
    for f in files:
        reduction = jpeg_reduction(f, long_side, imgsz) if reduced else 1
        start = time.perf_counter()
        im = read_image(f, 1, reduction)
        times.append((time.perf_counter() - start) * 1000)
        if im is None:
            raise RuntimeError(f"{f}: the benchmark's own image did not decode")
    return statistics.median(times)


def pixel_differences(files: list, width: int, height: int, imgsz: int) -> tuple[float, float]:
    """Mean absolute difference per pixel value (0-255) of the training image as ``--reduced-decode`` makes it and
    as a full decode makes it (both shrunk to ``imgsz`` as training does), and, for scale, of the full decode
    shrunk with area and with linear interpolation (what YOLOv5 does for validation and for training)."""
    shapes, orientations = np.array([[width, height]] * len(files)), np.ones(len(files), dtype=int)
    full, reduced, area = (ImageCache(files, shapes, orientations, imgsz, augment=augment, reduced_decode=red)
                           for augment, red in ((True, False), (True, True), (False, False)))
    diff = lambda a, b: float(np.mean([np.abs(a.base_image(i).astype(np.int16) - b.base_image(i)).mean()  # noqa
                                       for i in range(len(files))]))
    return diff(reduced, full), diff(area, full)


def loader_rates(cfg: dict, repeats: int) -> dict:
    """Median images/s of upstream's loader, ours, and ours with ``--reduced-decode``, each in fresh processes,
    taken in turn ``repeats`` times."""
    runs = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, options in VARIANTS.items():
            side = "upstream" if name == "upstream" else "ours"
            runs[name].append(run_worker(side, "loader", dict(cfg, loader_options=options))["images_per_s"])
    return {name: statistics.median(rates) for name, rates in runs.items()}


SETTINGS = (("1 core", 0, [0]), ("2 workers, 2 cores", 2, None))  # (name, loader workers, CPUs pinned)
# loader options per measured variant; the disk cache is filled when the loader is built, before timing starts
VARIANTS = {"upstream": {}, "ours": {}, "ours --reduced-decode": {"reduced_decode": True},
            "ours --cache disk": {"cache": "disk"}}


def measure_set(name: str, args, scratch: Path, upstream) -> list:
    """The table rows of one image set: per loader setting, the decode limits and the three loaders."""
    width, height, suffix = SETS[name]
    ours = write_large_set(scratch / f"{name}-ours", width, height, suffix, args.images)
    roots = {"ours": str(ours), "upstream": str(copy_set(ours, scratch / f"{name}-upstream"))}
    files = sorted(str(f) for f in (ours / "images" / "train").iterdir())
    cv2.setNumThreads(1)
    limits = {reduced: 1000 / (4 * decode_ms(files, max(width, height), args.imgsz, reduced))
              for reduced in (False, True)}
    reduced_vs_full, area_vs_linear = pixel_differences(files, width, height, args.imgsz)
    print(f"{name}: --reduced-decode changes the training image by {reduced_vs_full:.2f} per pixel value on average "
          f"(area instead of linear shrinking of the full decode: {area_vs_linear:.2f})", flush=True)
    rows = []
    for setting, workers, cpus in SETTINGS:
        cores = 1 if cpus else min(2, os.cpu_count() or 1)
        cfg = {"imgsz": args.imgsz, "batch": args.batch_size, "workers": workers, "threads": 1, "cpus": cpus,
               "loader_passes": args.passes, "loader_warmup_batches": max(workers, 1), "roots": roots, "scratch": str(scratch), "upstream": list(upstream)}
        rates = loader_rates(cfg, args.repeats)
        rows.append({"set": name, "setting": setting, "limit": limits[False] * cores,
                     "limit_reduced": limits[True] * cores, **rates})
        print(f"{name}, {setting}: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()), flush=True)
    return rows


def table(rows: list) -> str:
    lines = ["| images | loader | decode limit, full img/s | decode limit, reduced img/s | upstream img/s | "
             "ours img/s | ours --reduced-decode img/s | ours --cache disk img/s | ours / upstream | "
             "reduced / upstream | cache disk / upstream | reduced / its limit |", "|" + " --- |" * 12]
    for r in rows:
        up, ours, red, disk = (r[name] for name in VARIANTS)
        lines.append(f"| {r['set']} | {r['setting']} | {r['limit']:.1f} | {r['limit_reduced']:.1f} | {up:.1f} | "
                     f"{ours:.1f} | {red:.1f} | {disk:.1f} | {ours / up:.2f}x | {red / up:.2f}x | {disk / up:.2f}x | "
                     f"{red / r['limit_reduced']:.2f} |")
    return "\n".join(lines)


def server_lines(rows: list) -> str:
    """One core's images/s times ``SERVER_CORES``, per set: what a 16-core GPU server's loader could deliver."""
    return "\n".join(f"{r['set']}: one core {r['ours --reduced-decode']:.1f} img/s with --reduced-decode "
                     f"({r['ours']:.1f} without) -> about {SERVER_CORES * r['ours --reduced-decode']:.0f} img/s "
                     f"on {SERVER_CORES} cores (linear extrapolation, not measured)"
                     for r in rows if r["setting"] == SETTINGS[0][0])


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.loader_large", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", default=None,
                   help="upstream YOLOv5 (pip --target folder or checkout); default $YOLOV5_UPSTREAM")
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    p.add_argument("--images", type=int, default=32, help="images per set")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch-size", type=int, default=8, help="at most images / 2, so two workers both build batches")
    p.add_argument("--passes", type=int, default=2, help="passes over the set per loader process")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per loader and setting")
    args = parse_checked(p, RULES, argv)
    upstream = find_upstream(args.upstream or read("YOLOV5_UPSTREAM"))
    if upstream is None:
        print(f"upstream YOLOv5 not found ({args.upstream or 'no --upstream given'}); skipping. Install it apart "
              "from the project (the pip line in this module's docstring) and pass --upstream /tmp/yolov5pkg.")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="loader_large_"))
    try:
        rows = [row for name in args.sets for row in measure_set(name, args, scratch, upstream)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n--imgsz {args.imgsz}, mosaic on (hyp.scratch-low), batch {args.batch_size}, {args.images} images per "
          f"set, {args.passes} passes per process, median of {args.repeats} processes\n")
    print(table(rows))
    print(server_lines(rows))
    return 0


if __name__ == "__main__":
    main()
