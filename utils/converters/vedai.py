"""VEDAI (Vehicle Detection in Aerial Imagery) -> YOLO.

Source: ``--src`` holding the tiles ``Vehicules512/`` or ``Vehicules1024/`` (``NNNNNNNN_co.png`` colour,
``NNNNNNNN_ir.png`` infrared; ``--size``, ``--modality``) and the annotations, either one text file per
image (``NNNNNNNN.txt``) or one file for all images (``annotation512.txt`` / ``annotation1024.txt``, whose
rows start with the image number), anywhere under ``--src``. A row is
``x_center y_center orientation class is_contained is_occluded x1 x2 x3 x4 y1 y2 y3 y4`` in pixels of the
tile; the box is the axis-aligned hull of the four corners.

Classes: ``--classes ffca`` (default) keeps the eight classes of the FFCA-YOLO / SuperYOLO VEDAI
protocol (VEDAI codes 1 car, 2 truck, 11 pickup, 4 tractor, 5 camping car, 23 boat, 9 van, 10 other)
and drops the rare motorcycles, buses and planes; ``--classes all`` keeps every code in the list below.
Splits: ``foldNN.txt`` / ``foldNNtest.txt`` (VEDAI's ten folds, ``--fold``) when found under ``--src``,
otherwise a name-hash split with ``--val-fraction``.
"""

from pathlib import Path

from utils.converters.sources import check_fraction, hash_split, image_size, numbers, require_dir
from utils.converters.writer import DatasetWriter
from utils.errors import UserError
from utils.logging import LOGGER

CODES = {1: "car", 2: "truck", 11: "pickup", 4: "tractor", 5: "camping car", 23: "boat", 9: "van", 10: "other",
         7: "motorcycle", 8: "bus", 31: "plane"}
FFCA_CODES = (1, 2, 11, 4, 5, 23, 9, 10)


def add_arguments(parser) -> None:
    """Options of ``convert.py vedai``."""
    parser.add_argument("--size", choices=("512", "1024"), default="512", help="tile size to convert")
    parser.add_argument("--modality", choices=("co", "ir"), default="co", help="colour (co) or infrared (ir)")
    parser.add_argument("--classes", choices=("ffca", "all"), default="ffca", help="class list (see docs)")
    parser.add_argument("--fold", type=int, default=1, help="VEDAI fold 1-10 when fold files are present")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="share for val without fold files")


def read_rows(src: Path, size: str) -> dict:
    """``{image_number: [(file:line, tokens), ...]}`` from per-image files or the combined file."""
    combined = sorted(src.rglob(f"annotation{size}.txt"))
    rows = {}
    if combined:
        for n, line in enumerate(combined[0].read_text(errors="replace").splitlines(), 1):
            tokens = line.split()
            if tokens:
                rows.setdefault(tokens[0].zfill(8), []).append((f"{combined[0]}:{n}", tokens[1:]))
        return rows
    for path in sorted(src.rglob("[0-9]" * 8 + ".txt")):
        rows[path.stem] = [(f"{path}:{n}", line.split())
                           for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.split()]
    if not rows:
        raise UserError(f"--src {src}: no VEDAI annotations (annotation{size}.txt or NNNNNNNN.txt files) found")
    return rows


def parse_row(tokens) -> tuple:
    """``(code, (x1, y1, x2, y2))`` of one annotation row; ValueError when malformed."""
    if len(tokens) < 14:
        raise ValueError(f"{len(tokens)} fields, expected 14 (xc yc orientation class contained occluded "
                         f"x1 x2 x3 x4 y1 y2 y3 y4)")
    values = numbers(tokens[:14])
    code = values[3]
    if code != int(code):
        raise ValueError(f"class {tokens[3]!r} is not an integer code")
    xs, ys = values[6:10], values[10:14]
    return int(code), (min(xs), min(ys), max(xs), max(ys))


def fold_splits(src: Path, fold: int):
    """``{image_number: split}`` from ``foldNN.txt`` (train) and ``foldNNtest.txt`` (val), or None."""
    if not 1 <= fold <= 10:
        raise UserError(f"--fold {fold}: VEDAI has folds 1-10")
    train, test = sorted(src.rglob(f"fold{fold:02d}.txt")), sorted(src.rglob(f"fold{fold:02d}test.txt"))
    if not (train and test):
        return None
    splits = {}
    for path, split in ((train[0], "train"), (test[0], "val")):
        for line in path.read_text().split():
            splits[line.strip().zfill(8)] = split
    return splits


def image_rows(entries, code_to_class, size, writer) -> list:
    """YOLO rows of one image's annotation rows."""
    out = []
    for where, tokens in entries:
        try:
            code, box = parse_row(tokens)
        except ValueError as e:
            writer.bad_row(where, str(e))
            continue
        if code not in code_to_class:
            LOGGER.warning(f"{where}: class code {code} is not in the --classes list; row dropped")
            writer.drop(f"class code {code} not in --classes list")
            continue
        writer.add_box(out, code_to_class[code], box, *size)
    return out


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out``."""
    src = require_dir(opt.src)
    tiles = sorted(src.rglob(f"Vehicules{opt.size}"))
    if not tiles:
        raise UserError(f"--src {src}: no Vehicules{opt.size}/ folder found (--size 512 or 1024?)")
    codes = FFCA_CODES if opt.classes == "ffca" else tuple(CODES)
    code_to_class = {code: i for i, code in enumerate(codes)}
    options = {"size": opt.size, "modality": opt.modality, "classes": opt.classes, "fold": opt.fold,
               "val_fraction": check_fraction(opt.val_fraction)}
    with DatasetWriter(opt.out, "VEDAI", options, link=opt.link) as writer:
        rows = read_rows(src, opt.size)
        splits = fold_splits(src, opt.fold)
        if splits is None:
            LOGGER.info(f"--src {src}: no fold{opt.fold:02d}.txt / fold{opt.fold:02d}test.txt; "
                        f"{opt.val_fraction:.0%} of the images go to val by a hash of their names")
        images = sorted(tiles[0].glob(f"*_{opt.modality}.png"))
        numbers_with_image = {image.stem.rsplit("_", 1)[0] for image in images}
        for number in sorted(set(rows) - numbers_with_image):
            writer.no_image(rows[number][0][0], len(rows[number]))
        for image in images:
            number = image.stem.rsplit("_", 1)[0]
            split = splits.get(number) if splits is not None else hash_split(number, opt.val_fraction)
            size = image_size(image)
            if split is None or size is None:
                if size is None:
                    writer.skip_image(str(image), "not a readable image")
                continue
            writer.add(split, image, f"{number}.png", image_rows(rows.get(number, []), code_to_class, size, writer))
        writer.publish(opt.name or "VEDAI", [CODES[c] for c in codes])
