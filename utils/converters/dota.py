"""DOTA (v1.0 / v1.5 / v2.0) -> YOLO axis-aligned boxes.

Source: ``--src`` with ``train/``, ``val/`` (and optionally ``test/``) folders, each holding ``images/``
and a label folder whose name starts with ``labelTxt`` (``labelTxt``, ``labelTxt-v1.0/labelTxt``, ...).
A label row is ``x1 y1 x2 y2 x3 y3 x4 y4 category difficult``; ``imagesource:`` and ``gsd:`` header
lines are skipped. Each oriented quadrilateral becomes the smallest axis-aligned box around its four
corners, clipped to the image. Objects marked difficult are kept unless ``--drop-difficult`` (DOTA's
own evaluation ignores them). DOTA images are large (up to about 4000 px): see
``python -m utils.dataset.dataset_stats`` for whether to slice them.
"""

from pathlib import Path

from utils.converters.sources import image_size, list_images, numbers, require_dir
from utils.converters.writer import DatasetWriter
from utils.errors import UserError
from utils.logging import LOGGER

NAMES_V1 = ["plane", "baseball-diamond", "bridge", "ground-track-field", "small-vehicle", "large-vehicle", "ship",
            "tennis-court", "basketball-court", "storage-tank", "soccer-ball-field", "roundabout", "harbor",
            "swimming-pool", "helicopter"]
NAMES = {"1.0": NAMES_V1, "1.5": NAMES_V1 + ["container-crane"],
         "2.0": NAMES_V1 + ["container-crane", "airport", "helipad"]}


def add_arguments(parser) -> None:
    """Options of ``convert.py dota``."""
    parser.add_argument("--version", choices=sorted(NAMES), default="1.0", help="DOTA version (class list)")
    parser.add_argument("--drop-difficult", action="store_true", help="leave out objects marked difficult")


def label_folder(split_dir: Path):
    """The first ``labelTxt*`` folder (searched two levels deep) that holds .txt files, or None."""
    for candidate in sorted(split_dir.glob("labelTxt*")) + sorted(split_dir.glob("labelTxt*/*")):
        if candidate.is_dir() and any(candidate.glob("*.txt")):
            return candidate
    return None


def parse_row(tokens, classes, opt):
    """``(class_index, box)`` of one label row, ``('drop', reason)``, or a ValueError for a malformed row."""
    if len(tokens) < 9:
        raise ValueError(f"{len(tokens)} fields, expected 'x1 y1 ... x4 y4 category difficult'")
    xy = numbers(tokens[:8])
    category = tokens[8]
    if category not in classes:
        raise ValueError(f"category {category!r} is not a DOTA v{opt.version} class (--version?)")
    difficult = numbers(tokens[9:10], int) or [0]
    if difficult[0] not in (0, 1):
        raise ValueError(f"difficult flag {tokens[9]!r} is not 0 or 1")
    if difficult[0] and opt.drop_difficult:
        return "drop", "difficult (--drop-difficult)"
    xs, ys = xy[0::2], xy[1::2]
    return classes[category], (min(xs), min(ys), max(xs), max(ys))


def label_rows(label_file: Path, size, classes, opt, writer) -> list:
    """YOLO rows of one DOTA label file."""
    rows = []
    for n, line in enumerate(label_file.read_text(errors="replace").splitlines(), 1):
        tokens = line.split()
        if not tokens or line.startswith(("imagesource", "gsd")):
            continue
        try:
            cls, box = parse_row(tokens, classes, opt)
        except ValueError as e:
            writer.bad_row(f"{label_file}:{n}", str(e))
            continue
        if cls == "drop":
            writer.drop(box)
            continue
        writer.add_box(rows, cls, box, *size)
    return rows


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out``."""
    src = require_dir(opt.src)
    names = NAMES[opt.version]
    classes = {name: i for i, name in enumerate(names)}
    options = {"version": opt.version, "drop_difficult": opt.drop_difficult}
    with DatasetWriter(opt.out, "DOTA", options, link=opt.link) as writer:
        for split in ("train", "val", "test"):
            split_dir = src / split
            labels = label_folder(split_dir) if (split_dir / "images").is_dir() else None
            if labels is None:
                if split_dir.is_dir():
                    LOGGER.info(f"{split_dir}: no images/ with a labelTxt* folder, split skipped")
                continue
            images = list_images(split_dir / "images")
            writer.orphan_files(labels, {image.stem for image in images})
            for image in images:
                size = image_size(image)
                if size is None:
                    writer.skip_image(str(image), "not a readable image")
                    continue
                label_file = labels / f"{image.stem}.txt"
                rows = label_rows(label_file, size, classes, opt, writer) if label_file.is_file() else []
                writer.add(split, image, image.name, rows)
        if not writer.images:
            raise UserError(f"--src {src}: no train/images with a train/labelTxt* folder found")
        writer.publish(opt.name or "DOTA", names)
