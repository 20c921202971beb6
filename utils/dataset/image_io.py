"""Image files: supported formats, finding images and their label files, reading them upright.

Every reader returns (h, w, 3) uint8 BGR, whatever the file holds (grey, RGBA, 16-bit, palette),
with the EXIF orientation applied, so scanning, training and inference see the same pixels.
"""

import glob
import os
from multiprocessing.pool import ThreadPool
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from utils.errors import UserError
from utils.logging import LOGGER

IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm")
VID_FORMATS = ("asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv")
NUM_THREADS = min(8, max(1, os.cpu_count() or 1))  # threads for scanning and caching files
JPEG_SUFFIXES = ("jpg", "jpeg")
# libjpeg scales the inverse DCT by these factors (OpenCV's IMREAD_REDUCED_COLOR_2/4/8)
REDUCED_READ_FLAGS = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def map_in_threads(func, items, what: str):
    """``func(item)`` for each of ``items``, in order, computed in :data:`NUM_THREADS` threads; serially when the
    process cannot start a thread (a tight ``ulimit -v`` or ``ulimit -u``): the same results, only slower, and one
    line naming ``what`` runs serially. A generator: the pool ends when the caller stops reading."""
    try:
        pool = ThreadPool(NUM_THREADS)
    except RuntimeError as e:  # "can't start new thread": the pool has already ended the threads it started
        LOGGER.info(f"{what}: one file at a time ({e})")
        yield from map(func, items)
        return
    with pool:
        yield from pool.imap(func, items)


def img2label_paths(img_paths):
    """Image paths -> label paths: the last ``/images/`` becomes ``/labels/``, the suffix ``.txt``."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return [sb.join(str(x).rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for x in img_paths]


def file_suffix(path) -> str:
    """Lower-case suffix without the dot ('' when the file name has none)."""
    return str(path).rsplit(".", 1)[-1].lower() if "." in Path(str(path)).name else ""


def exif_orientation(path) -> int:
    """EXIF orientation tag (1..8) of an image file; 1 when absent or unreadable."""
    try:
        with Image.open(path) as im:
            value = im.getexif().get(0x0112, 1)
    except Exception:  # any unreadable header simply means "no rotation"
        return 1
    return value if value in range(1, 9) else 1


def apply_orientation(im, orientation: int):
    """Turn an image (h, w, c) stored with EXIF ``orientation`` upright (as PIL's exif_transpose does)."""
    if orientation == 2:
        return cv2.flip(im, 1)
    if orientation == 3:
        return cv2.rotate(im, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(im, 0)
    if orientation == 5:
        return cv2.transpose(im)
    if orientation == 6:
        return cv2.rotate(im, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.transpose(im), -1)
    if orientation == 8:
        return cv2.rotate(im, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return im


def _pil_to_bgr(im: Image.Image):
    """Any PIL image (grey, 16-bit, RGBA, palette) -> (h, w, 3) uint8 BGR, ignoring orientation."""
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):
        arr = np.asarray(im).astype(np.float64)
        arr = np.clip(arr / 256.0 if arr.max() > 255 else arr, 0, 255).astype(np.uint8)
        return cv2.cvtColor(arr, cv2.COLOR_GRAY2BGR)
    return cv2.cvtColor(np.asarray(im.convert("RGB")), cv2.COLOR_RGB2BGR)


def jpeg_reduction(path, long_side: int, target: int) -> int:
    """The largest of 1, 2, 4, 8 by which libjpeg may shrink ``path`` while decoding and leave the long side
    (``long_side`` px at full size) at least ``target`` px; 1 for files that are not JPEG."""
    if file_suffix(path) not in JPEG_SUFFIXES:
        return 1
    return max((f for f in REDUCED_READ_FLAGS if long_side // f >= target), default=1)


def read_image(path, orientation=None, reduction=1):
    """Read an image file upright as (h, w, 3) uint8 BGR, or None when it cannot be decoded.

    OpenCV decodes (grey, RGBA and 16-bit become 3-channel 8-bit); PIL is the fallback for files
    OpenCV rejects. EXIF orientation is applied here for every format, so ``orientation`` (from
    the scan) saves re-reading the header. ``reduction`` 2, 4 or 8 (JPEG only, see
    :func:`jpeg_reduction`) decodes at that fraction of the size inside libjpeg (DCT scaling), several
    times faster than a full decode; the PIL fallback always decodes at full size.
    """
    flags = REDUCED_READ_FLAGS[reduction] if reduction > 1 else cv2.IMREAD_COLOR
    im = cv2.imread(str(path), flags | cv2.IMREAD_IGNORE_ORIENTATION)
    if im is None:
        try:
            with Image.open(path) as pil:
                im = _pil_to_bgr(pil)
        except Exception:  # undecodable by both libraries: the caller reports it
            return None
    return apply_orientation(im, exif_orientation(path) if orientation is None else orientation)


def collect_image_files(path, prefix=""):
    """Image files from a folder (recursive), a .txt list (relative entries: to the list's folder),
    a glob, or a list of these; sorted. Raises UserError when a source is missing or holds no image."""
    files = []
    for p in path if isinstance(path, (list, tuple)) else [path]:
        p = Path(p)
        if p.is_dir():
            files += glob.glob(str(p / "**" / "*.*"), recursive=True)
        elif p.is_file() and p.suffix == ".txt":
            lines = [x.strip() for x in p.read_text(errors="replace").splitlines() if x.strip()]
            files += [x if os.path.isabs(x) else str((p.parent / x).resolve()) for x in lines]
        elif "*" in str(p):
            files += glob.glob(str(p), recursive=True)
        else:
            raise UserError(f"{prefix}{p} does not exist; give a folder of images, a .txt list or a glob")
    im_files = sorted(x for x in files if file_suffix(x) in IMG_FORMATS)
    if not im_files:
        raise UserError(f"{prefix}no images found in {path}; supported formats: {', '.join(IMG_FORMATS)}")
    return im_files


def bgr_to_chw_rgb(img):
    """(h, w, 3) BGR -> contiguous (3, h, w) RGB; cv2.split beats a strided numpy transpose copy."""
    b, g, r = cv2.split(img)
    out = np.empty((3, *img.shape[:2]), dtype=img.dtype)
    out[0], out[1], out[2] = r, g, b
    return out

