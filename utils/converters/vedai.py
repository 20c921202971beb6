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
otherwise a name-hash split with ``--val-fraction``. ``--folds N`` writes every fold instead of one
(the papers' protocol: train and validate each fold, report mean and spread): each image once under
``images/all`` and one data YAML per fold listing its train and val images (VEDAI's ten fold files,
or without them N folds by a hash of the names, each image in the val list of exactly one fold).
"""

from pathlib import Path

from utils.converters.sources import check_fraction, hash_fold, hash_split, image_size, numbers, require_dir
from utils.converters.writer import POOL, DatasetWriter
from utils.errors import UserError
from utils.logging import LOGGER

CODES = {1: "car", 2: "truck", 11: "pickup", 4: "tractor", 5: "camping car", 23: "boat", 9: "van", 10: "other",
         7: "motorcycle", 8: "bus", 31: "plane"}
FFCA_CODES = (1, 2, 11, 4, 5, 23, 9, 10)
VEDAI_FOLDS = 10  # foldNN.txt / foldNNtest.txt for NN = 01..10


def add_arguments(parser) -> None:
    """Options of ``convert.py vedai``."""
    parser.add_argument("--size", choices=("512", "1024"), default="512", help="tile size to convert")
    parser.add_argument("--modality", choices=("co", "ir"), default="co", help="colour (co) or infrared (ir)")
    parser.add_argument("--classes", choices=("ffca", "all"), default="ffca", help="class list (see docs)")
    parser.add_argument("--fold", type=int, default=None, help="convert one VEDAI fold, 1-10 (default 1), when "
                                                                "fold files are present")
    parser.add_argument("--folds", type=int, default=None, help="convert every fold: one data YAML per fold "
                                                                "(10 with VEDAI's fold files; see docs/datasets.md)")
    parser.add_argument("--val-fraction", type=float, default=None, help="share for val without fold files "
                                                                         "(default 0.1)")


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


def fold_files(src: Path, fold: int):
    """``(foldNN.txt, foldNNtest.txt)`` of one fold found under ``src``, or None when either is missing."""
    train, test = sorted(src.rglob(f"fold{fold:02d}.txt")), sorted(src.rglob(f"fold{fold:02d}test.txt"))
    return (train[0], test[0]) if train and test else None


def read_fold(files) -> dict:
    """``{image_number: split}`` from a fold's train and test lists; a number in both goes to val (warned)."""
    train, test = ({token.zfill(8) for token in path.read_text().split()} for path in files)
    if train & test:
        LOGGER.warning(f"{files[0]}: {len(train & test)} images are also in {files[1].name}; they go to val only")
    return {**dict.fromkeys(train, "train"), **dict.fromkeys(test, "val")}


def fold_splits(src: Path, fold: int):
    """``{image_number: split}`` from ``foldNN.txt`` (train) and ``foldNNtest.txt`` (val), or None."""
    if not 1 <= fold <= VEDAI_FOLDS:
        raise UserError(f"--fold {fold}: VEDAI has folds 1-{VEDAI_FOLDS}")
    files = fold_files(src, fold)
    return read_fold(files) if files else None


def all_folds(src: Path, n_folds: int, image_numbers: list) -> list:
    """``[{"train": [numbers], "val": [numbers]}, ...]``, one per fold, over ``image_numbers``: VEDAI's
    fold files when all ten are under ``src``, else ``n_folds`` folds by a hash of the numbers."""
    found = {k: fold_files(src, k) for k in range(1, VEDAI_FOLDS + 1)}
    missing = [k for k, files in found.items() if files is None]
    if not missing:
        if n_folds != VEDAI_FOLDS:
            raise UserError(f"--folds {n_folds}: --src {src} has VEDAI's {VEDAI_FOLDS} fold files; "
                            f"use --folds {VEDAI_FOLDS}")
        return [fold_lists(read_fold(found[k]), image_numbers) for k in range(1, VEDAI_FOLDS + 1)]
    if len(missing) < VEDAI_FOLDS:
        raise UserError(f"--src {src}: fold files of folds {missing} (foldNN.txt and foldNNtest.txt) are missing; "
                        f"restore them, or remove every fold file to split by a hash of the names")
    LOGGER.info(f"--src {src}: no VEDAI fold files; {n_folds} folds by a hash of the image names")
    return [fold_lists({n: "val" if hash_fold(n, n_folds) == k else "train" for n in image_numbers}, image_numbers)
            for k in range(1, n_folds + 1)]


def fold_lists(splits: dict, image_numbers: list) -> dict:
    """``{"train": [...], "val": [...]}``: the numbers of ``image_numbers`` by their split (unlisted: left out)."""
    return {split: [n for n in image_numbers if splits.get(n) == split] for split in ("train", "val")}


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


def check_split_options(opt) -> None:
    """``--folds`` excludes ``--fold`` and ``--val-fraction``; fill in their defaults otherwise."""
    if opt.folds is not None:
        for flag, value in (("--fold", opt.fold), ("--val-fraction", opt.val_fraction)):
            if value is not None:
                raise UserError(f"{flag} {value}: does not apply with --folds {opt.folds}, which writes every fold "
                                f"(leave {flag} out, or drop --folds to convert one split)")
        if opt.folds < 2:
            raise UserError(f"--folds {opt.folds}: give 2 or more folds (VEDAI's own fold files make 10)")
        return
    opt.fold = 1 if opt.fold is None else opt.fold
    opt.val_fraction = check_fraction(0.1 if opt.val_fraction is None else opt.val_fraction)


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out`` (one split, or every fold with ``--folds``)."""
    src = require_dir(opt.src)
    check_split_options(opt)
    tiles = sorted(src.rglob(f"Vehicules{opt.size}"))
    if not tiles:
        raise UserError(f"--src {src}: no Vehicules{opt.size}/ folder found (--size 512 or 1024?)")
    codes = FFCA_CODES if opt.classes == "ffca" else tuple(CODES)
    split_options = {"folds": opt.folds} if opt.folds is not None else {"fold": opt.fold,
                                                                         "val_fraction": opt.val_fraction}
    options = {"size": opt.size, "modality": opt.modality, "classes": opt.classes, **split_options}
    with DatasetWriter(opt.out, "VEDAI", options, link=opt.link) as writer:
        rows = read_rows(src, opt.size)
        images = sorted(tiles[0].glob(f"*_{opt.modality}.png"))
        numbers_with_image = {image.stem.rsplit("_", 1)[0] for image in images}
        for number in sorted(set(rows) - numbers_with_image):
            writer.no_image(rows[number][0][0], len(rows[number]))
        code_to_class, names = {code: i for i, code in enumerate(codes)}, [CODES[c] for c in codes]
        if opt.folds is None:
            write_one_split(opt, src, images, rows, code_to_class, writer)
            writer.publish(opt.name or "VEDAI", names)
        else:
            writer.publish_folds(opt.name or "VEDAI", names, write_folds(opt, src, images, rows, code_to_class, writer))


def readable_images(images, writer):
    """``(image, number, (width, height))`` of each readable image; unreadable ones are reported and skipped."""
    for image in images:
        size = image_size(image)
        if size is None:
            writer.skip_image(str(image), "not a readable image")
            continue
        yield image, image.stem.rsplit("_", 1)[0], size


def write_one_split(opt, src, images, rows, code_to_class, writer) -> None:
    """Images to ``train``/``val``: by fold ``--fold``'s files, else by a hash with ``--val-fraction``."""
    splits = fold_splits(src, opt.fold)
    if splits is None:
        LOGGER.info(f"--src {src}: no fold{opt.fold:02d}.txt / fold{opt.fold:02d}test.txt; "
                    f"{opt.val_fraction:.0%} of the images go to val by a hash of their names")
    for image, number, size in readable_images(images, writer):
        split = splits.get(number) if splits is not None else hash_split(number, opt.val_fraction)
        if split is not None:
            writer.add(split, image, f"{number}.png", image_rows(rows.get(number, []), code_to_class, size, writer))


def write_folds(opt, src, images, rows, code_to_class, writer) -> list:
    """Every image of some fold once to ``all``; returns the folds as lists of written file names."""
    readable = list(readable_images(images, writer))
    folds = all_folds(src, opt.folds, [number for _, number, _ in readable])
    listed = {n for fold in folds for split in fold.values() for n in split}
    for image, number, size in readable:
        if number in listed:
            writer.add(POOL, image, f"{number}.png", image_rows(rows.get(number, []), code_to_class, size, writer))
    return [{split: [f"{n}.png" for n in fold[split]] for split in fold} for fold in folds]
