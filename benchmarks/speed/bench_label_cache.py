"""What keying the label cache by content costs: hashing every image and label file against scanning them.

    python -m benchmarks.speed.bench_label_cache                    # 400 JPEGs of 1280 x 720, 3 runs
    python -m benchmarks.speed.bench_label_cache --images 2000 --width 1920 --height 1080

Generates ``--images`` noisy JPEGs (the worst case for hashing: they compress little) with one label each in a
temporary folder, then prints the median over ``--runs`` of the time to compute the cache key (the SHA-256 of
every file, what each run pays before it may reuse the cache) and of the full scan (what the cache saves), and
their ratio. The files are read from the page cache after the first run. A benchmark, not a test.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from benchmarks.cli import parse_checked, parser_for
from utils.dataset import label_cache
from utils.errors import exit_on_user_error
from utils.options import OptionRules

RULES = OptionRules(positive=("images", "width", "height", "runs"))


def write_images(folder: Path, n: int, width: int, height: int) -> tuple[list, list]:
    """``n`` noisy JPEGs under images/ and one label each under labels/ -> (image paths, label paths)."""
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir(parents=True)
    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(n):
        image, label = folder / "images" / f"{i}.jpg", folder / "labels" / f"{i}.txt"
        cv2.imwrite(str(image), rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        label.write_text("0 0.5 0.5 0.1 0.1\n")
        images.append(str(image))
        labels.append(str(label))
    return images, labels


def median_seconds(func, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@exit_on_user_error
def main(argv=None) -> int:
    parser = parser_for("benchmarks.speed.bench_label_cache", __doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400, help="generated images")
    parser.add_argument("--width", type=int, default=1280, help="image width (px)")
    parser.add_argument("--height", type=int, default=720, help="image height (px)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the median is printed")
    opt = parse_checked(parser, RULES, argv)
    with tempfile.TemporaryDirectory() as tmp:
        images, labels = write_images(Path(tmp), opt.images, opt.width, opt.height)
        megabytes = sum(Path(p).stat().st_size for p in images) / 1e6
        key = median_seconds(lambda: label_cache.label_cache_key(images, labels), opt.runs)
        scan = median_seconds(lambda: label_cache._scan(images, labels, ""), opt.runs)
    print(f"{opt.images} images of {opt.width} x {opt.height}, {megabytes:.0f} MB")
    print(f"cache key (content hash): {key * 1e3:.0f} ms   full scan: {scan * 1e3:.0f} ms   "
          f"key / scan: {key / scan:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
