"""COCO-format instances JSON (AI-TOD, COCO, and any set exported in that format) -> YOLO.

Source: ``--src`` with ``annotations/*.json`` (or the JSON files directly in it); the split is read from
each file name (``instances_val2017.json``, ``aitod_train_v1.json``; ``trainval`` files are skipped as
they repeat train + val). Image files are looked up by ``file_name`` under ``images/SPLIT``,
``SPLIT/images`` (AI-TOD's layout), ``SPLIT``,
``images``, the JSON name without ``instances_`` (``val2017``) and ``--src`` itself.

- category ids need not be 0..n-1: categories are sorted by id and numbered from 0; the map is written
  as ``category_map.yaml`` next to the data YAML;
- crowd boxes (``iscrowd: 1``) mark groups that COCO's evaluation ignores; they are dropped unless
  ``--keep-crowd``;
- images without annotations are kept as background images (empty label file).
"""

import json
from collections import defaultdict
from pathlib import Path

from utils.converters.sources import image_size, numbers, require_dir, split_from_name
from utils.converters.writer import DatasetWriter, yolo_row
from utils.errors import UserError
from utils.logging import LOGGER


def add_arguments(parser) -> None:
    """Options of ``convert.py coco`` / ``convert.py aitod``."""
    parser.add_argument("--keep-crowd", action="store_true", help="keep iscrowd=1 boxes as objects")


def annotation_files(src: Path) -> list:
    """``[(split, json_path)]`` sorted by split; trainval files skipped."""
    folder = src / "annotations" if (src / "annotations").is_dir() else src
    found = {}
    for path in sorted(folder.glob("*.json")):
        split = split_from_name(path.stem)
        if split is None:
            LOGGER.info(f"{path}: not a train/val/test file name, skipped")
            continue
        if split in found:
            raise UserError(f"{path}: a second annotation file for split '{split}' ({found[split].name}); "
                            f"keep one in {folder}")
        found[split] = path
    if not found:
        raise UserError(f"--src {src}: no COCO instances JSON named like *train*.json / *val*.json found in {folder}")
    return sorted(found.items(), key=lambda kv: ("train", "val", "test").index(kv[0]))


def load_json(path: Path) -> dict:
    """The parsed JSON with ``images``, ``annotations`` and ``categories`` lists, or a UserError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        raise UserError(f"{path}: not a COCO instances file (needs 'images' and 'categories' lists)")
    data.setdefault("annotations", [])
    return data


def category_map(files: list) -> tuple:
    """``({coco_id: class_index}, [names])`` over all files; ids sorted, numbered from 0."""
    names = {}
    for _, path, data in files:
        for cat in data["categories"]:
            cid, name = cat.get("id"), str(cat.get("name"))
            if not isinstance(cid, int):
                raise UserError(f"{path}: category {cat!r} has no integer 'id'")
            if names.setdefault(cid, name) != name:
                raise UserError(f"{path}: category id {cid} is named {name!r} here but {names[cid]!r} in "
                                f"another file; the files must share one category list")
    ids = sorted(names)
    return {cid: i for i, cid in enumerate(ids)}, [names[cid] for cid in ids]


def image_folders(src: Path, split: str, json_path: Path) -> list:
    """Folders in which an image's ``file_name`` is looked up, in order."""
    stem = json_path.stem.removeprefix("instances_")
    return [src / "images" / split, src / split / "images", src / split, src / "images", src / stem, src]


def is_id(value) -> bool:
    """Whether ``value`` can be a COCO id (an int or a string, never a list or null)."""
    return isinstance(value, (int, str))


def group_annotations(data: dict, path: Path, writer) -> dict:
    """``{image_id: [annotation, ...]}``; annotations that point at no image are reported and skipped."""
    image_ids = {im.get("id") for im in data["images"] if isinstance(im, dict) and is_id(im.get("id"))}
    grouped = defaultdict(list)
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not is_id(ann.get("image_id")) or ann["image_id"] not in image_ids:
            writer.bad_row(f"{path}:annotations[{n}]", "image_id matches no entry of 'images'")
            continue
        grouped[ann["image_id"]].append((n, ann))
    return grouped


def annotation_row(n, ann, path, ids, size, keep_crowd, writer):
    """One YOLO row from a COCO annotation, or None (dropped and counted)."""
    where = f"{path}:annotations[{n}]"
    if not is_id(ann.get("category_id")) or ann["category_id"] not in ids:
        writer.bad_row(where, f"category_id {ann.get('category_id')!r} is not in 'categories'")
        return None
    bbox = ann.get("bbox")
    try:
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise ValueError(f"bbox {bbox!r} is not [x, y, width, height]")
        x, y, w, h = numbers(bbox)
    except ValueError as e:
        writer.bad_row(where, str(e))
        return None
    if ann.get("iscrowd") and not keep_crowd:
        writer.drop("crowd box (iscrowd=1)")
        return None
    row = yolo_row(ids[ann["category_id"]], (x, y, x + w, y + h), *size)
    if row is None:
        writer.drop("zero size or outside the image")
    return row


def convert_split(src, split, path, data, ids, opt, writer) -> None:
    """Write every image of one annotation file with its rows."""
    grouped = group_annotations(data, path, writer)
    folders = image_folders(src, split, path)
    entries = []
    for n, im in enumerate(data["images"]):
        if isinstance(im, dict) and is_id(im.get("id")):
            entries.append((n, im))
        else:
            writer.skip_image(f"{path}:images[{n}]", f"entry {im!r} is not an object with an 'id'")
    for n, im in sorted(entries, key=lambda item: str(item[1].get("file_name"))):
        file_name = str(im.get("file_name", ""))
        image = next((f / file_name for f in folders if file_name and (f / file_name).is_file()), None)
        size = image_size(image) if image is not None else None
        if size is None:
            writer.skip_image(f"{path}:images[{n}]", f"image file {file_name!r} missing or unreadable "
                                                     f"(looked under {folders[0]} and {len(folders) - 1} more)")
            writer.drop("image skipped", len(grouped.get(im.get("id"), [])))
            continue
        rows = [annotation_row(k, ann, path, ids, size, opt.keep_crowd, writer) for k, ann in grouped.get(im["id"], [])]
        writer.add(split, image, Path(file_name).name, [r for r in rows if r is not None])


AITOD_MAX_DET = 1500  # detections per image the AI-TOD evaluation keeps (maxDets of its COCO tooling)


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out``."""
    src = require_dir(opt.src)
    files = [(split, path, load_json(path)) for split, path in annotation_files(src)]
    ids, names = category_map(files)
    fmt = "AI-TOD" if opt.format == "aitod" else "COCO"
    with DatasetWriter(opt.out, fmt, {"keep_crowd": opt.keep_crowd}, link=opt.link) as writer:
        for split, path, data in files:
            convert_split(src, split, path, data, ids, opt, writer)
        mapping = {"note": "class index in this data set -> category id and name in the source JSON",
                   "classes": {i: {"category_id": cid, "name": names[i]} for cid, i in ids.items()}}
        writer.publish(opt.name or fmt, names, {"category_map.yaml": mapping},
                       {"max_det": AITOD_MAX_DET} if fmt == "AI-TOD" else None)
