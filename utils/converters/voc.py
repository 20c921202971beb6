"""Pascal VOC XML (VOC2007/2012 and sets exported in its format, e.g. by labelImg) -> YOLO.

Source: ``--src`` with ``Annotations/*.xml`` and ``JPEGImages/`` (images may also sit next to the XML
files). Splits come from ``ImageSets/Main/{train,val,test}.txt`` when present, otherwise about
``--val-fraction`` of the images go to val, chosen by a hash of the file name (the same every run).
Class names are ``--names`` in that order, or else every name found in the XML files, sorted (for VOC
itself this is the official 20-class order). VOC corners are 1-based inclusive pixels:
``xmin..xmax`` becomes ``[xmin - 1, xmax)``. Objects marked difficult are kept unless
``--drop-difficult``.
"""

import xml.etree.ElementTree as ET
from pathlib import Path

from utils.converters.sources import check_fraction, hash_split, image_size, numbers, require_dir
from utils.converters.writer import DatasetWriter
from utils.errors import UserError
from utils.logging import LOGGER


def add_arguments(parser) -> None:
    """Options of ``convert.py voc``."""
    parser.add_argument("--names", type=str, default="", help="comma-separated class names (default: all found)")
    parser.add_argument("--drop-difficult", action="store_true", help="leave out objects marked difficult")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of images for val when there is no ImageSets/Main")


def read_xml(path: Path, writer):
    """``(filename, (width, height) or None, [(n, name, difficult, bndbox element or None)])`` or None."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        writer.skip_image(f"{path}:{e.position[0]}", f"not valid XML ({e})")
        return None
    objects = [(n, (o.findtext("name") or "").strip(), (o.findtext("difficult") or "0").strip() == "1",
                o.find("bndbox")) for n, o in enumerate(root.findall("object"), 1)]
    try:
        size = tuple(int(float(root.findtext(f"size/{k}"))) for k in ("width", "height"))
    except (TypeError, ValueError):
        size = None
    return (root.findtext("filename") or "").strip(), size if size and min(size) > 0 else None, objects


def box_of(bndbox) -> tuple:
    """``(x1, y1, x2, y2)`` 0-based from a VOC ``bndbox`` element; ValueError when incomplete."""
    if bndbox is None:
        raise ValueError("object has no <bndbox>")
    texts = [bndbox.findtext(k) for k in ("xmin", "ymin", "xmax", "ymax")]
    if None in texts:
        raise ValueError("<bndbox> lacks one of xmin, ymin, xmax, ymax")
    xmin, ymin, xmax, ymax = numbers([t.strip() for t in texts])
    return xmin - 1, ymin - 1, xmax, ymax


def splits_of(src: Path, stems: list, val_fraction: float) -> dict:
    """``{stem: split}`` from ImageSets/Main, or by name hash when that folder is missing."""
    sets = src / "ImageSets" / "Main"
    listed = {}
    for split in ("train", "val", "test"):
        if (sets / f"{split}.txt").is_file():
            for line in (sets / f"{split}.txt").read_text().splitlines():
                if line.split():
                    listed.setdefault(line.split()[0], split)
    if listed:
        return listed
    LOGGER.info(f"{sets}: not found; {val_fraction:.0%} of the images go to val by a hash of their names")
    return {stem: hash_split(stem, val_fraction) for stem in stems}


def find_image(src: Path, xml_path: Path, filename: str):
    """The image an XML file describes: ``JPEGImages/<filename>``, beside the XML, or by the XML's stem."""
    folders = [src / "JPEGImages", xml_path.parent]
    names = [filename] if filename else []
    names += [f"{xml_path.stem}{s}" for s in (".jpg", ".jpeg", ".png", ".bmp", ".tif")]
    return next((f / n for n in names for f in folders if (f / n).is_file()), None)


def object_rows(xml_path, objects, classes, size, opt, writer) -> list:
    """YOLO rows of the objects of one XML file."""
    rows = []
    for n, name, difficult, bndbox in objects:
        where = f"{xml_path}:object {n}"
        if not name:
            writer.bad_row(where, "object has no <name>")
            continue
        if name not in classes:
            writer.drop("class not in --names")
            continue
        try:
            box = box_of(bndbox)
        except ValueError as e:
            writer.bad_row(where, str(e))
            continue
        if difficult and opt.drop_difficult:
            writer.drop("difficult (--drop-difficult)")
            continue
        writer.add_box(rows, classes[name], box, *size)
    return rows


def convert(opt) -> None:
    """Convert ``opt.src`` into ``opt.out``."""
    src = require_dir(opt.src)
    folder = src / "Annotations" if (src / "Annotations").is_dir() else src
    xml_files = sorted(folder.glob("*.xml"))
    if not xml_files:
        raise UserError(f"--src {src}: no VOC XML files in {folder}")
    options = {"names": opt.names, "drop_difficult": opt.drop_difficult,
               "val_fraction": check_fraction(opt.val_fraction)}
    with DatasetWriter(opt.out, "VOC", options, link=opt.link) as writer:
        parsed = [(p, read_xml(p, writer)) for p in xml_files]
        parsed = [(p, x) for p, x in parsed if x is not None]
        names = [n.strip() for n in opt.names.split(",") if n.strip()] or sorted(
            {name for _, x in parsed for _, name, _, _ in x[2] if name})
        if not names:
            raise UserError(f"--src {src}: no object names found; give --names")
        classes = {name: i for i, name in enumerate(names)}
        split_of = splits_of(src, [p.stem for p, _ in parsed], opt.val_fraction)
        for xml_path, (filename, size, objects) in parsed:
            image = find_image(src, xml_path, filename)
            size = size or (image_size(image) if image else None)
            if image is None or size is None or xml_path.stem not in split_of:
                reason = "image not found" if image is None else "no size" if size is None else "not in ImageSets"
                writer.skip_image(str(xml_path), reason)
                continue
            rows = object_rows(xml_path, objects, classes, size, opt, writer)
            writer.add(split_of[xml_path.stem], image, image.name, rows)
        writer.publish(opt.name or "VOC", names)
