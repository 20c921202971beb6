"""What ``--cache disk`` costs and saves on large JPEGs: ms and MB per image, with and without the cache, and what
its start-up check of every entry against its image's bytes costs.

    python -m benchmarks.speed.bench_cache                       # 16 JPEGs of 2000 x 1500, --imgsz 640
    python -m benchmarks.speed.bench_cache --width 4000 --height 3000 --n 8

The JPEGs are scenes cut from the photos bundled with scikit-image (the ``photos`` data kind, quality 90),
not flat synthetic colour, which would decode unrealistically fast. Every figure is the median over
``--repeats`` passes over all images, one thread, of the per-image time of ``ImageCache.base_image`` (the
array every training sample is built from): uncached it decodes and shrinks, with ``--cache disk`` it
loads the shrunk ``.npy`` (image and key). Decoding alone is printed beside them as the floor of the uncached
path. The check is what every run does once per image before it uses the cache: read the image file and hash
it (``source_key``), and read the entry. The MB column is the array per image: the full-size decode (what a
full-size ``.npy`` would hold) and the shrunk ``.npy`` file. Files come from the page cache, as in a warm
second epoch.
"""

import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from benchmarks.cli import parse_checked, parser_for
from utils.dataset.image_cache import ImageCache, read_entry, source_key
from utils.dataset.synthetic.photos import make_photo_image
from utils.errors import exit_on_user_error
from utils.options import OptionRules

RULES = OptionRules(positive=("n", "width", "height", "imgsz", "repeats"))


def write_jpegs(folder: Path, n: int, width: int, height: int) -> list:
    """``n`` photo-content JPEGs of ``width`` x ``height`` (quality 90) in ``folder``."""
    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        scene = make_photo_image(rng, size=max(width, height))[0][:height, :width]
        files.append(folder / f"scene{i}.jpg")
        cv2.imwrite(str(files[-1]), scene, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return files


def ms_per_image(step, n: int, repeats: int) -> float:
    """Median over ``repeats`` passes of the mean ms of ``step(i)`` for i in range(n)."""
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            step(i)
        passes.append((time.perf_counter() - start) * 1000 / n)
    return statistics.median(passes)


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.bench_cache", description=__doc__)
    p.add_argument("--n", type=int, default=16, help="JPEGs to generate")
    p.add_argument("--width", type=int, default=2000)
    p.add_argument("--height", type=int, default=1500)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--repeats", type=int, default=3)
    args = parse_checked(p, RULES, argv)
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        files = [str(f) for f in write_jpegs(Path(tmp), args.n, args.width, args.height)]
        shapes, orientations = np.array([[args.width, args.height]] * args.n), np.ones(args.n, dtype=int)
        plain = ImageCache(files, shapes, orientations, args.imgsz, augment=True)
        disk = ImageCache(files, shapes, orientations, args.imgsz, augment=True, mode="disk")
        decode = ms_per_image(lambda i: cv2.imread(files[i]), args.n, args.repeats)
        uncached = ms_per_image(plain.base_image, args.n, args.repeats)
        cached = ms_per_image(disk.base_image, args.n, args.repeats)
        key = ms_per_image(lambda i: source_key(files[i]), args.n, args.repeats)
        entry = ms_per_image(lambda i: read_entry(disk.npy_files[i]), args.n, args.repeats)
        npy_mb = statistics.median(Path(f).stat().st_size for f in disk.npy_files) / 1e6
    jpeg_mb = args.width * args.height * 3 / 1e6
    print(f"{args.n} JPEGs of {args.width} x {args.height}, --imgsz {args.imgsz}, one thread, "
          f"median of {args.repeats} passes")
    print(f"{'per image':<44}{'ms':>8}{'MB':>10}")
    print(f"{'decode only (cv2.imread)':<44}{decode:>8.2f}{jpeg_mb:>10.2f}")
    print(f"{'no cache: decode and shrink':<44}{uncached:>8.2f}{'':>10}")
    print(f"{'--cache disk: load the shrunk .npy':<44}{cached:>8.2f}{npy_mb:>10.2f}")
    print(f"{'check, once per run: hash the image file':<44}{key:>8.2f}")
    print(f"{'check, once per run: read the .npy entry':<44}{entry:>8.2f}")
    print(f"--cache disk is {uncached / cached:.1f}x faster per image than no cache, and its .npy is "
          f"{jpeg_mb / npy_mb:.1f}x smaller than a full-size one would be")
    print(f"the check costs {(key + entry) / uncached:.1%} of one uncached read per image and run; an epoch that "
          f"reads every image once through the cache, with the check added, is "
          f"{uncached / (cached + key + entry):.1f}x faster than no cache")


if __name__ == "__main__":
    main()
