"""Cut a YOLO data set of large images into overlapping tiles: a new YOLO data set ready for train.py.

    python data/scripts/slice_dataset.py --data D.yaml --size 640 --overlap 0.2 --out DIR

Tiles follow the grid of sliced inference (utils/slicing.py: the last row and column are shifted
inside the image, never padded). A box is kept when at least ``--min-visibility`` of its area lies
inside the tile, clipped to the tile; otherwise it is dropped. Tiles without boxes (background) are
kept up to ``--background-ratio`` times the number of tiles with boxes, chosen by ``--seed``.

Every tile is written atomically (temporary file, then rename) label first, image last, so an
interrupted run leaves no half-written tile; running the same command again resumes where it
stopped, and first deletes the temporary files (``.NAME.XXXXXXXX.tmp``) that a killed run leaves.
``DIR/data.yaml`` is written last. A different command on the same ``DIR`` is refused.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from utils.dataset.data_config import check_dataset  # noqa: E402
from utils.dataset.image_io import collect_image_files, img2label_paths, read_image  # noqa: E402
from utils.dataset.label_cache import verify_image_label  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.files import atomic_open, atomic_write_bytes, remove_orphaned_temp_files, yaml_save  # noqa: E402
from utils.logging import LOGGER  # noqa: E402
from utils.slicing import tile_grid  # noqa: E402

WRITABLE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
SETTINGS_FILE = "slicing.json"


def tile_labels(boxes, tile, min_visibility):
    """Labels of one tile: ``boxes`` (n, 5) [cls, x1, y1, x2, y2] in image pixels -> (k, 5) [cls, x, y, w, h]
    normalised to ``tile`` (x1, y1, x2, y2), keeping boxes with >= ``min_visibility`` of their area inside."""
    tx1, ty1, tx2, ty2 = (float(v) for v in tile)
    clipped = np.column_stack((boxes[:, 0], boxes[:, 1].clip(tx1, tx2), boxes[:, 2].clip(ty1, ty2),
                               boxes[:, 3].clip(tx1, tx2), boxes[:, 4].clip(ty1, ty2)))
    area = (boxes[:, 3] - boxes[:, 1]) * (boxes[:, 4] - boxes[:, 2])
    inside = (clipped[:, 3] - clipped[:, 1]) * (clipped[:, 4] - clipped[:, 2])
    keep = (area > 0) & (inside >= min_visibility * area - 1e-9)
    c = clipped[keep]
    tw, th = tx2 - tx1, ty2 - ty1
    return np.column_stack((c[:, 0], ((c[:, 1] + c[:, 3]) / 2 - tx1) / tw, ((c[:, 2] + c[:, 4]) / 2 - ty1) / th,
                            (c[:, 3] - c[:, 1]) / tw, (c[:, 4] - c[:, 2]) / th))


def plan_image(im_file, size, overlap, min_visibility):
    """[(tile (4,), labels (k, 5))] for every tile of one image; a corrupt image or label file is a UserError."""
    result = verify_image_label(im_file, img2label_paths([im_file])[0])
    if result.labels is None:
        raise UserError(f"{result.messages[0] if result.messages else im_file}; fix or remove it, then rerun")
    w, h = result.shape
    lb = result.labels.astype(np.float64)
    boxes = np.column_stack((lb[:, 0], (lb[:, 1] - lb[:, 3] / 2) * w, (lb[:, 2] - lb[:, 4] / 2) * h,
                             (lb[:, 1] + lb[:, 3] / 2) * w, (lb[:, 2] + lb[:, 4] / 2) * h))
    return [(tile, tile_labels(boxes, tile, min_visibility)) for tile in tile_grid(h, w, size, overlap)]


def plan_split(im_files, args):
    """{image file: [(tile, labels)]} of the tiles to write: all with labels, background up to the ratio."""
    plans = {f: plan_image(f, args.size, args.overlap, args.min_visibility) for f in im_files}
    background = [(f, i) for f in im_files for i, (_, lb) in enumerate(plans[f]) if not len(lb)]
    n_objects = sum(len(p) for p in plans.values()) - len(background)
    n_keep = min(len(background), int(args.background_ratio * n_objects))
    rng = np.random.default_rng(args.seed)
    kept = {background[i] for i in rng.choice(len(background), n_keep, replace=False)} if n_keep else set()
    return {f: [t for i, t in enumerate(plans[f]) if len(t[1]) or (f, i) in kept] for f in im_files}


def tile_name(im_file, tile):
    """File stem of a tile: ``<image stem>__<x1>_<y1>``."""
    return f"{Path(im_file).stem}__{int(tile[0])}_{int(tile[1])}"


def _encode(im, suffix):
    params = [cv2.IMWRITE_JPEG_QUALITY, 95] if suffix in (".jpg", ".jpeg") else []
    ok, buf = cv2.imencode(suffix, im, params)
    if not ok:
        raise UserError(f"cannot encode a tile as '{suffix}'")
    return buf.tobytes()


def write_image_tiles(im_file, tiles, images_dir, labels_dir):
    """Write the missing tiles of one image (label, then image, both atomic); returns how many were written."""
    suffix = Path(im_file).suffix.lower()
    suffix = suffix if suffix in WRITABLE_SUFFIXES else ".png"
    todo = [(t, lb) for t, lb in tiles if not (images_dir / f"{tile_name(im_file, t)}{suffix}").exists()]
    if not todo:
        return 0
    im = read_image(im_file)
    if im is None:
        raise UserError(f"{im_file}: cannot decode this image; fix or remove it, then rerun")
    for (x1, y1, x2, y2), lb in todo:
        stem = tile_name(im_file, (x1, y1))
        rows = "".join(f"{int(c)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in lb)
        atomic_write_bytes(labels_dir / f"{stem}.txt", rows.encode())
        with atomic_open(images_dir / f"{stem}{suffix}") as f:
            f.write(_encode(im[y1:y2, x1:x2], suffix))
    return len(todo)


def _check_unique_stems(im_files, split):
    stems = [Path(f).stem for f in im_files]
    if len(set(stems)) != len(stems):
        duplicate = next(s for s in stems if stems.count(s) > 1)
        raise UserError(f"split '{split}': several images are named '{duplicate}'; tile names come from image "
                        "names, so rename them to be unique")


def slice_split(data, split, out, args):
    """Tile one split into ``out``/images/<split> and ``out``/labels/<split>; returns (tiles, written)."""
    im_files = collect_image_files(data[split], prefix=f"{split}: ")
    _check_unique_stems(im_files, split)
    plans = plan_split(im_files, args)
    images_dir, labels_dir = out / "images" / split, out / "labels" / split
    images_dir.mkdir(parents=True, exist_ok=True)
    labels_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(images_dir, WRITABLE_SUFFIXES)
    remove_stale_temporaries(labels_dir, ".txt")
    with tqdm(im_files, desc=f"Slicing {split}", bar_format="{l_bar}{bar:10}{r_bar}") as bar:  # closed on errors
        written = sum(write_image_tiles(f, plans[f], images_dir, labels_dir) for f in bar)  # too: ERROR on its line
    return sum(len(p) for p in plans.values()), written


def remove_stale_temporaries(folder, target_suffixes) -> None:
    """Delete the ``.NAME.XXXXXXXX.tmp`` files of atomic writes (of NAMEs ending in ``target_suffixes``) that a
    killed earlier run left in ``folder``; the rerun writes those tiles again."""
    removed = remove_orphaned_temp_files(folder, target_suffixes)
    if removed:
        LOGGER.info(f"Removed {len(removed)} temporary file(s) left in {folder} by an interrupted run")


def check_settings(out, settings):
    """Record the command's settings in ``out``; refuse to mix tiles made by different settings."""
    path = out / SETTINGS_FILE
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != settings:
            changed = sorted(k for k in settings if previous.get(k) != settings[k])
            raise UserError(f"--out {out}: made earlier with different settings ({', '.join(changed)}); "
                            "rerun with the same options to resume, or choose a new --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    if any(p.name != SETTINGS_FILE for p in out.iterdir()):
        raise UserError(f"--out {out}: folder exists and is not a sliced data set; choose a new or empty folder")
    atomic_write_bytes(path, json.dumps(settings, indent=1).encode())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="data set YAML of the full-size images")
    parser.add_argument("--size", type=int, default=640, help="tile size in pixels")
    parser.add_argument("--overlap", type=float, default=0.2, help="overlap of neighbouring tiles (0-0.9)")
    parser.add_argument("--out", type=Path, required=True, help="output folder for the tiled data set")
    parser.add_argument("--min-visibility", type=float, default=0.6,
                        help="keep a box when at least this fraction of its area is inside the tile")
    parser.add_argument("--background-ratio", type=float, default=0.1,
                        help="background tiles kept per tile with boxes (0 = none)")
    parser.add_argument("--splits", nargs="+", default=["train", "val"], choices=("train", "val", "test"),
                        help="splits to tile; the others keep pointing at the full-size images")
    parser.add_argument("--seed", type=int, default=0, help="seed for choosing background tiles")
    args = parser.parse_args(argv)
    if args.size < 32:
        raise UserError(f"--size {args.size}: tiles must be at least 32 pixels")
    if not 0 <= args.overlap <= 0.9:
        raise UserError(f"--overlap {args.overlap}: must be between 0.0 and 0.9")
    if not 0 < args.min_visibility <= 1:
        raise UserError(f"--min-visibility {args.min_visibility}: must be in (0, 1]")
    if not (math.isfinite(args.background_ratio) and args.background_ratio >= 0):
        raise UserError(f"--background-ratio {args.background_ratio}: must be a finite number, 0 or more")
    return args


def slice_dataset(args):
    """Tile the chosen splits and write ``out``/data.yaml; returns its path."""
    data = check_dataset(args.data)
    out = args.out.resolve()
    settings = {"data": str(Path(args.data).resolve()), **{k: getattr(args, k) for k in (
        "size", "overlap", "min_visibility", "background_ratio", "splits", "seed")}}
    if out.is_dir():
        remove_stale_temporaries(out, (SETTINGS_FILE, "data.yaml"))
    check_settings(out, settings)
    new_data = {"path": str(out), "names": dict(enumerate(data["names"]))}
    for split in ("train", "val", "test"):
        if split in args.splits and data.get(split):
            tiles, written = slice_split(data, split, out, args)
            LOGGER.info(f"{split}: {tiles} tiles ({written} written now, {tiles - written} already there)")
            new_data[split] = f"images/{split}"
        elif data.get(split):
            new_data[split] = data[split]
    yaml_save(out / "data.yaml", new_data)
    LOGGER.info(f"Wrote {out / 'data.yaml'}: train with  python train.py --data {out / 'data.yaml'}")
    return out / "data.yaml"


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    try:
        slice_dataset(args)
    except OSError as e:  # every tile is written atomically: what is in --out is complete, and a rerun resumes
        raise UserError(f"--out {args.out}: slicing stopped: {e.strerror or e} ({e.filename}); the tiles already "
                        "in --out are complete; free disk space or fix the folder, then rerun the same command "
                        "to resume") from None


if __name__ == "__main__":
    main()
