"""VisDrone2019-DET -> YOLO.

Source: ``VisDrone2019-DET-{train,val,test-dev}/{images,annotations}`` (give their parent, or one of them
as ``--src``). Each annotation row is ``x,y,w,h,score,category,truncation,occlusion`` in pixels.

Rows are treated as the official evaluation (VisDrone DET toolkit) treats them:

- category 0 rows are *ignored regions*: never objects. ``--blackout-ignored`` paints them black in the
  written image, so the model is not taught that what is inside them is background;
- objects with half or more of their area inside ignored regions are dropped (the toolkit removes them);
- category 11 (*others*) is never evaluated and is dropped;
- rows with score 0 are ignored by the evaluation (neither found nor missed) and are dropped.

The ten remaining categories become classes 0-9 in the official order.
"""

import cv2
import numpy as np

from utils.converters.sources import image_size, list_images, numbers, require_dir, split_from_name
from utils.converters.writer import DatasetWriter, yolo_row
from utils.errors import UserError

NAMES = ["pedestrian", "people", "bicycle", "car", "van", "truck", "tricycle", "awning-tricycle", "bus", "motor"]
IGNORED, OTHERS = 0, 11
IGNORED_SHARE = 0.5  # the toolkit drops an object when this share of its area lies in ignored regions


def add_arguments(parser) -> None:
    """Options of ``convert.py visdrone``."""
    parser.add_argument("--blackout-ignored", action="store_true",
                        help="paint the ignored regions (category 0) black in the written images")


def split_folders(src):
    """``[(split, folder)]`` of VisDrone split folders (each with images/ and annotations/) under ``src``."""
    candidates = [src] if (src / "annotations").is_dir() else sorted(p for p in src.iterdir() if p.is_dir())
    found = []
    for folder in candidates:
        if not ((folder / "images").is_dir() and (folder / "annotations").is_dir()):
            continue
        split = split_from_name(folder.name)
        if split is None:
            raise UserError(f"--src {folder}: cannot tell the split from the folder name; name it like "
                            f"VisDrone2019-DET-train / -val / -test-dev")
        if split in (s for s, _ in found):
            raise UserError(f"--src {src}: two folders for split '{split}'; keep one")
        found.append((split, folder))
    if not found:
        raise UserError(f"--src {src}: no VisDrone folder with images/ and annotations/ found")
    return found


def parse_rows(path, writer):
    """``(objects, ignored)``: lists of ``(category, score, x, y, w, h)`` from one annotation file."""
    objects, ignored = [], []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        tokens = [t.strip() for t in line.strip().rstrip(",").split(",")]
        if tokens == [""]:
            continue
        try:
            if len(tokens) < 6:
                raise ValueError(f"{len(tokens)} fields, expected 8 (x,y,w,h,score,category,truncation,occlusion)")
            x, y, w, h, score, category = numbers(tokens[:6], int)
            if not 0 <= category <= OTHERS:
                raise ValueError(f"category {category} is not 0-11")
        except ValueError as e:
            writer.bad_row(f"{path}:{n}", str(e))
            continue
        (ignored if category == IGNORED else objects).append((category, score, x, y, w, h))
    return objects, ignored


def ignored_mask(ignored, width: int, height: int) -> np.ndarray:
    """``(height, width)`` bool mask of the ignored regions."""
    mask = np.zeros((height, width), dtype=bool)
    for _, _, x, y, w, h in ignored:
        mask[max(y, 0):max(y + h, 0), max(x, 0):max(x + w, 0)] = True
    return mask


def object_rows(objects, mask, width, height, writer) -> list:
    """YOLO rows of the objects that the evaluation counts; every other object is counted as dropped."""
    rows = []
    for category, score, x, y, w, h in objects:
        if category == OTHERS:
            writer.drop("others (category 11, not evaluated)")
            continue
        if score == 0:
            writer.drop("score 0 (ignored by the evaluation)")
            continue
        inside = mask[max(y, 0):max(y + h, 0), max(x, 0):max(x + w, 0)]
        if inside.size and inside.sum() >= IGNORED_SHARE * w * h:
            writer.drop("inside an ignored region")
            continue
        row = yolo_row(category - 1, (x, y, x + w, y + h), width, height)
        if row is None:
            writer.drop("zero size or outside the image")
            continue
        rows.append(row)
    return rows


def convert_image(image, label_file, split, writer, blackout: bool) -> None:
    """Convert one image and its annotation file (a missing file makes a background image)."""
    size = image_size(image)
    if size is None:
        writer.skip_image(str(image), "not a readable image")
        return
    width, height = size
    objects, ignored = parse_rows(label_file, writer) if label_file.is_file() else ([], [])
    mask = ignored_mask(ignored, width, height)
    rows = object_rows(objects, mask, width, height, writer)
    writer.drop("ignored region (category 0, never an object)", len(ignored))
    edited = None
    if blackout and mask.any():  # decode only the images that change
        edited = cv2.imread(str(image), cv2.IMREAD_UNCHANGED)
        if edited is None or edited.shape[:2] != (height, width):
            raise UserError(f"{image}: cannot decode the image to black out its ignored regions")
        edited[mask] = 0
    writer.add(split, image, image.name, rows, edited)


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out``."""
    src = require_dir(opt.src)
    folders = split_folders(src)
    options = {"blackout_ignored": opt.blackout_ignored}
    with DatasetWriter(opt.out, "VisDrone", options, link=opt.link) as writer:
        for split, folder in folders:
            images = list_images(folder / "images")
            for image in images:
                convert_image(image, folder / "annotations" / f"{image.stem}.txt", split, writer,
                              opt.blackout_ignored)
            writer.orphan_files(folder / "annotations", {image.stem for image in images})
        writer.publish(opt.name or "VisDrone", NAMES)
