"""Data sets, loaders and inference sources: YOLO-format scanning with per-file verdicts, a safe label
cache, augmentation wiring, and batches that are a pure function of ``(seed, epoch)``.

Determinism: the batch sampler (main process) yields keys ``(index, epoch, draw)``; every random
decision for a sample comes from a generator seeded by ``(seed, epoch, index, draw)``, so batches do
not depend on the number of workers and a resumed epoch sees exactly the batches it saw before.
"""

import contextlib
import glob
import hashlib
import io
import math
import os
from dataclasses import dataclass, field
from multiprocessing.pool import ThreadPool
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

from utils.augmentations import apply_hsv, hsv_lut, letterbox, mixup, mosaic, random_perspective
from utils.errors import UserError
from utils.files import atomic_write_bytes, yaml_load
from utils.logging import LOGGER
from utils.ops import xywhn2xyxy, xyxy2xywhn

IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm")
VID_FORMATS = ("asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv")
LABEL_TOLERANCE = 0.01  # coordinates in (1, 1 + tolerance] are clipped to 1; beyond that the file is skipped
MIN_IMAGE_SIDE = 10  # pixels; smaller images are treated as corrupt, as in YOLOv5
CACHE_VERSION = "ffca-labels-2"
NUM_THREADS = min(8, max(1, os.cpu_count() or 1))
PIN_MEMORY = os.getenv("PIN_MEMORY", "true").lower() == "true"
DEFAULT_HYP = Path(__file__).resolve().parents[1] / "data" / "hyps" / "hyp.scratch-low.yaml"
AUGMENT_KEYS = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective",
                "flipud", "fliplr", "mosaic", "mixup")
QUAD_STREAM = 1  # extra seed word separating the quad-collate decision from a sample's augmentation
SAMPLER_STREAM = 2**32 - 1  # seed word for the epoch order, distinct from any sample index


# ---------------------------------------------------------------- paths and image reading

def img2label_paths(img_paths):
    """Image paths -> label paths: the last ``/images/`` becomes ``/labels/``, the suffix ``.txt``."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return [sb.join(str(x).rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt" for x in img_paths]


def _suffix(path) -> str:
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


def read_image(path, orientation=None):
    """Read an image file upright as (h, w, 3) uint8 BGR, or None when it cannot be decoded.

    OpenCV decodes (grey, RGBA and 16-bit become 3-channel 8-bit); PIL is the fallback for files
    OpenCV rejects. EXIF orientation is applied here for every format, so ``orientation`` (from
    the scan) saves re-reading the header.
    """
    im = cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if im is None:
        try:
            with Image.open(path) as pil:
                im = _pil_to_bgr(pil)
        except Exception:  # undecodable by both libraries: the caller reports it
            return None
    return apply_orientation(im, exif_orientation(path) if orientation is None else orientation)


def _collect_image_files(path, prefix=""):
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
    im_files = sorted(x for x in files if _suffix(x) in IMG_FORMATS)
    if not im_files:
        raise UserError(f"{prefix}no images found in {path}; supported formats: {', '.join(IMG_FORMATS)}")
    return im_files


# ---------------------------------------------------------------- scanning: one verdict per file

@dataclass
class ScanResult:
    """Verdict for one image/label pair. ``labels`` is None when the image is skipped."""

    im_file: str
    labels: np.ndarray | None = None  # (n, 5) float32 [cls, x, y, w, h]
    lines: np.ndarray | None = None  # (n,) line number of each label row
    shape: tuple = (0, 0)  # upright (w, h)
    orientation: int = 1
    status: str = "found"  # found | missing | empty | corrupt
    duplicate: bool = False
    messages: list = field(default_factory=list)


def _check_image(im_file):
    """``(problem or None, (w, h) upright, orientation)``; decodes fully so truncation is caught."""
    try:
        if os.path.getsize(im_file) == 0:
            return "zero-byte file", (0, 0), 1
        with Image.open(im_file) as im:
            fmt = (im.format or "").lower()
            orientation = im.getexif().get(0x0112, 1)
            im.load()
            w, h = im.size
    except FileNotFoundError:
        return "file not found", (0, 0), 1
    except Image.UnidentifiedImageError:
        return "not an image file (unrecognised format)", (0, 0), 1
    except Exception as e:  # truncated data, decoder errors, decompression bombs
        return f"unreadable image ({type(e).__name__}: {e})", (0, 0), 1
    if fmt not in IMG_FORMATS:
        return f"unsupported image format '{fmt}'", (0, 0), 1
    orientation = orientation if orientation in range(1, 9) else 1
    if orientation in (5, 6, 7, 8):  # rotated by 90 degrees: width and height swap
        w, h = h, w
    if w < MIN_IMAGE_SIDE or h < MIN_IMAGE_SIDE:
        return f"image size {w}x{h} is below {MIN_IMAGE_SIDE} pixels", (w, h), orientation
    return None, (w, h), orientation


def _check_row(parts):
    """Problem with one label row (list of str) or None; returns ``(problem, values)``.

    Class ids are checked against ``nc`` later (:func:`_class_problems`), so the cache does not depend on it.
    """
    if len(parts) != 5:
        return f"expected 5 columns 'class x y w h', got {len(parts)}", None
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return f"non-numeric value in {' '.join(parts)!r}", None
    if not all(math.isfinite(v) for v in values):
        return f"NaN or infinite value in {' '.join(parts)!r}", None
    if min(values) < 0:
        return f"negative value in {' '.join(parts)!r}", None
    if values[0] != int(values[0]):
        return f"class id {parts[0]} is not an integer", None
    if max(values[1:]) > 1 + LABEL_TOLERANCE:
        return f"coordinate {max(values[1:]):g} > 1 (labels must be normalised to 0-1)", None
    return None, values


def _parse_labels(lb_file):
    """Parse a YOLO label file.

    Returns ``(labels (n, 5) float32 or None if corrupt, line numbers (n,), status, duplicate, messages)``.
    """
    none = np.zeros((0, 5), np.float32), np.zeros(0, np.int32)
    if not os.path.isfile(lb_file):
        return *none, "missing", False, []
    try:
        text = Path(lb_file).read_text(encoding="utf-8-sig")  # tolerate a byte-order mark
    except (OSError, UnicodeDecodeError) as e:
        return None, None, "corrupt", False, [f"{lb_file}: unreadable label file ({type(e).__name__}); image skipped"]
    rows, line_numbers, messages = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        problem, values = _check_row(parts)
        if problem:
            return None, None, "corrupt", False, [f"{lb_file}:{n}: {problem}; image skipped"]
        if max(values[1:]) > 1:
            messages.append(f"{lb_file}:{n}: coordinate {max(values[1:]):g} slightly > 1 clipped to 1")
            values[1:] = [min(v, 1.0) for v in values[1:]]
        rows.append(values)
        line_numbers.append(n)
    if not rows:
        return *none, "empty", False, []
    labels, lines = np.array(rows, dtype=np.float32), np.array(line_numbers, dtype=np.int32)
    _, first = np.unique(labels, axis=0, return_index=True)
    duplicate = len(first) < len(labels)
    if duplicate:
        keep = np.sort(first)
        dropped = sorted(set(range(len(labels))) - set(keep.tolist()))
        for i in dropped:
            messages.append(f"{lb_file}:{line_numbers[i]}: duplicate row removed")
        labels, lines = labels[keep], lines[keep]
    return labels, lines, "found", duplicate, messages


def verify_image_label(im_file, lb_file) -> ScanResult:
    """Scan one image and its label file and return the verdict (see docs/data.md for the rules)."""
    problem, shape, orientation = _check_image(im_file)
    if problem:
        return ScanResult(im_file, status="corrupt", messages=[f"{im_file}: {problem}; image skipped"])
    labels, lines, status, duplicate, messages = _parse_labels(lb_file)
    return ScanResult(im_file, labels, lines, shape, orientation, status, duplicate, messages)


def _class_problems(labels, lines, label_files, nc):
    """Per image: a 'class id >= nc' warning naming file and line, or None -> list of (str or None)."""
    problems = []
    for lb, ln, lb_file in zip(labels, lines, label_files):
        bad = np.flatnonzero(lb[:, 0] >= nc) if nc is not None else []
        problems.append(f"{lb_file}:{ln[bad[0]]}: class id {int(lb[bad[0], 0])} is not below nc={nc} "
                        f"(classes are 0..{nc - 1}); image skipped" if len(bad) else None)
    return problems


# ---------------------------------------------------------------- label cache (no pickle, atomic)

def label_cache_key(im_files, label_files) -> str:
    """SHA-256 over paths, sizes and modification times of every image and label, plus the scan rules."""
    h = hashlib.sha256(f"{CACHE_VERSION}|{LABEL_TOLERANCE}|{MIN_IMAGE_SIDE}".encode())
    for p in (*im_files, *label_files):
        try:
            st = os.stat(p)
            h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}|missing\n".encode())
    return h.hexdigest()


def _cache_arrays(key, results, counts) -> dict:
    """The scan as plain arrays, the cache's content: usable images, their labels (flat, with offsets),
    upright shapes (N, 2) (w, h), EXIF orientations, every message, and the five verdict counts."""
    usable = [r for r in results if r.labels is not None]
    lengths = [len(r.labels) for r in usable]
    no_labels = np.zeros((0, 5), np.float32)
    return dict(
        version=np.array(CACHE_VERSION), key=np.array(key),
        im_files=np.array([r.im_file for r in usable], dtype=str),
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        labels=np.concatenate([r.labels for r in usable] + [no_labels]).astype(np.float32),
        lines=np.concatenate([r.lines for r in usable] + [np.zeros(0, np.int32)]).astype(np.int32),
        shapes=np.array([r.shape for r in usable], dtype=np.int64).reshape(-1, 2),
        orientations=np.array([r.orientation for r in usable], dtype=np.uint8),
        messages=np.array([m for r in results for m in r.messages], dtype=str),
        counts=np.array([counts[k] for k in ("found", "missing", "empty", "corrupt", "duplicate")], np.int64),
    )


def save_label_cache(path, arrays, prefix=""):
    """Write cache ``arrays`` to ``path`` as a plain .npz (loads with allow_pickle=False), atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        LOGGER.warning(f"{prefix}WARNING cache folder {Path(path).parent} is not writeable, labels not cached ({e})")


def load_label_cache(path, key):
    """The cached scan as a dict, or None when the file is missing, stale, truncated or malformed."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["version"]) != CACHE_VERSION or str(z["key"]) != key:
                return None
            cache = {k: z[k] for k in z.files}
    except Exception:  # any unreadable cache is rebuilt, never trusted
        return None
    n = len(cache["im_files"])
    offsets = cache["offsets"]
    consistent = (len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == len(cache["labels"])
                  and bool(np.all(np.diff(offsets) >= 0)) and cache["shapes"].shape == (n, 2)
                  and len(cache["orientations"]) == n and cache["labels"].ndim == 2
                  and cache["labels"].shape[1] == 5 and len(cache["lines"]) == len(cache["labels"])
                  and len(cache["counts"]) == 5)
    return cache if consistent else None


def _scan(im_files, label_files, prefix):
    """Scan every pair in a thread pool with a progress bar -> (results, counts)."""
    counts = dict(found=0, missing=0, empty=0, corrupt=0, duplicate=0)
    results = []
    desc = f"{prefix}Scanning {Path(label_files[0]).parent}"
    with ThreadPool(NUM_THREADS) as pool:
        jobs = pool.imap(lambda a: verify_image_label(*a), zip(im_files, label_files))
        for r in tqdm(jobs, desc=desc, total=len(im_files), bar_format="{l_bar}{bar:10}{r_bar}", leave=False):
            counts[r.status] += 1
            counts["duplicate"] += int(r.duplicate)
            results.append(r)
    return results, counts


# ---------------------------------------------------------------- the data set

def _cache_mode(cache, prefix):
    if cache in (False, None, "", "false", "False"):
        return None
    if cache is True or cache in ("ram", "true", "True"):
        return "ram"
    if cache == "disk":
        return "disk"
    raise UserError(f"{prefix}--cache {cache!r}: use 'ram' or 'disk' (or leave it off)")


def _available_memory() -> int:
    """Bytes of memory available to new allocations (Linux MemAvailable, else free physical pages)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_hyp(hyp, prefix):
    """Augmentation hyperparameters: ``hyp`` (dict) or YOLOv5's scratch-low defaults; all keys required."""
    hyp = dict(hyp) if hyp is not None else yaml_load(DEFAULT_HYP)
    missing = [k for k in AUGMENT_KEYS if k not in hyp]
    if missing:
        raise UserError(f"{prefix}hyperparameters lack {', '.join(missing)}; start from data/hyps/hyp.scratch-low.yaml")
    return hyp


class LoadImagesAndLabels(Dataset):
    """YOLO-format images and labels with YOLOv5's augmentation; see the module docstring for determinism.

    ``dataset[key]`` with ``key`` an int or ``(index, epoch, draw)`` returns
    ``(image uint8 (3, h, w) RGB, labels (n, 6) [0, cls, x, y, w, h], path, shapes or None)``.
    """

    def __init__(self, path, img_size=640, batch_size=16, augment=False, hyp=None, rect=False,
                 image_weights=False, cache_images=False, single_cls=False, stride=32, pad=0.0, prefix="",
                 seed=0, nc=None):
        self.img_size = img_size
        self.augment = augment
        self.hyp = _check_hyp(hyp, prefix) if augment else hyp
        self.image_weights = image_weights
        self.rect = False if image_weights else rect
        self.mosaic = augment and not self.rect
        self.mosaic_border = (-img_size // 2, -img_size // 2)
        self.stride = stride
        self.seed = int(seed) % 2**63
        self.path = path
        self.prefix = prefix

        self._load_labels(path, nc, prefix)
        if single_cls:
            for lb in self.labels:
                lb[:, 0] = 0
        self.n = len(self.im_files)
        self.batch = np.floor(np.arange(self.n) / batch_size).astype(int)  # batch index of each image
        self.indices = np.arange(self.n)
        self.class_weights = None  # image_weights sampling; None -> inverse class frequency
        if self.rect:
            self._sort_for_rect(batch_size, img_size, stride, pad)

        self.ims = [None] * self.n  # RAM cache of base images (see _base_image)
        self.npy_files = [str(Path(f).with_suffix(".npy")) for f in self.im_files]
        mode = _cache_mode(cache_images, prefix)
        self.cache_disk = mode == "disk"
        if mode == "ram" and self._ram_fits(prefix):
            self._cache_in_ram(prefix)
        if self.cache_disk:
            self._cache_on_disk(prefix)

    # ---- labels

    def _load_labels(self, path, nc, prefix):
        """Scan (or load the cache of) every image/label pair; keep the usable ones (class ids below ``nc``)."""
        im_files = _collect_image_files(path, prefix)
        label_files = img2label_paths(im_files)
        cache_path = Path(label_files[0]).parent.with_suffix(".cache")
        key = label_cache_key(im_files, label_files)
        cache = load_label_cache(cache_path, key)
        if cache is None:
            if cache_path.exists():
                LOGGER.info(f"{prefix}Label cache {cache_path} is stale or unreadable, rescanning")
            cache = _cache_arrays(key, *_scan(im_files, label_files, prefix))
            save_label_cache(cache_path, cache, prefix)
        offsets = cache["offsets"]
        labels = [cache["labels"][offsets[i]:offsets[i + 1]].copy() for i in range(len(offsets) - 1)]
        lines = [cache["lines"][offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        usable_files = [str(f) for f in cache["im_files"]]
        class_problems = _class_problems(labels, lines, img2label_paths(usable_files), nc)
        for msg in [*cache["messages"], *filter(None, class_problems)]:
            LOGGER.warning(f"{prefix}WARNING {msg}")
        keep = [i for i, problem in enumerate(class_problems) if problem is None]
        found, missing, empty, corrupt, duplicate = (int(c) for c in cache["counts"])
        found, corrupt = found - (len(usable_files) - len(keep)), corrupt + (len(usable_files) - len(keep))
        summary = (f"{found} found, {missing} missing, {empty} empty, {corrupt} corrupt, {duplicate} duplicate "
                   f"-> {len(keep)} usable images")
        LOGGER.info(f"{prefix}{cache_path.with_suffix('')}: {summary}")
        if not keep:
            raise UserError(f"{prefix}{path}: no usable images ({summary}); fix the files named in the warnings "
                            f"(see docs/data.md)")
        self.cache_hash = key
        self.im_files = [usable_files[i] for i in keep]
        self.label_files = img2label_paths(self.im_files)
        self.labels = [labels[i] for i in keep]
        self.shapes = cache["shapes"][keep].astype(np.int64)
        self.orientations = cache["orientations"][keep].astype(int)

    def _sort_for_rect(self, batch_size, img_size, stride, pad):
        """Order images by aspect ratio and give each batch the smallest stride-multiple shape (h, w)."""
        ar = self.shapes[:, 1] / self.shapes[:, 0]  # h / w
        order = ar.argsort()
        self.im_files = [self.im_files[i] for i in order]
        self.label_files = [self.label_files[i] for i in order]
        self.labels = [self.labels[i] for i in order]
        self.shapes = self.shapes[order]
        self.orientations = self.orientations[order]
        ar = ar[order]
        nb = self.batch[-1] + 1
        shapes = []
        for i in range(nb):
            ari = ar[self.batch == i]
            lo, hi = ari.min(), ari.max()
            shapes.append([hi, 1] if hi < 1 else [1, 1 / lo] if lo > 1 else [1, 1])
        self.batch_shapes = np.ceil(np.array(shapes) * img_size / stride + pad).astype(int) * stride

    # ---- images

    def _decode(self, i):
        """Decode image file i upright as BGR uint8 (h0, w0, 3)."""
        im = read_image(self.im_files[i], int(self.orientations[i]))
        if im is None:
            raise UserError(f"{self.prefix}{self.im_files[i]}: image can no longer be read (changed since the scan?)")
        return im

    def _read(self, i):
        """Original image i, upright BGR uint8 (from the .npy disk cache when enabled)."""
        if self.cache_disk and os.path.isfile(self.npy_files[i]):
            return np.load(self.npy_files[i], allow_pickle=False)
        return self._decode(i)

    def _resized_shape(self, h0, w0):
        """(h, w) of an h0 x w0 image scaled so its long side is ``img_size``."""
        r = self.img_size / max(h0, w0)
        return (math.ceil(h0 * r), math.ceil(w0 * r)) if r != 1 else (h0, w0)

    def _base_image(self, i):
        """Image i as cached and warped from: shrunk to ``img_size`` when larger, else the original.

        Enlarging is left to the consumer (the mosaic warp does it in its single interpolation), so
        small images cost no extra memory and cached and uncached samples are bit-identical.
        """
        if self.ims[i] is not None:
            return self.ims[i]
        im = self._read(i)
        h0, w0 = im.shape[:2]
        h, w = self._resized_shape(h0, w0)
        if h < h0 or w < w0:
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR if self.augment else cv2.INTER_AREA)
        return im

    def load_image(self, i):
        """Image i resized so its long side is ``img_size`` -> ``(im (h, w, 3) BGR, (h0, w0), (h, w))``.

        The returned array may be the RAM cache itself: callers must not modify it in place.
        """
        w0, h0 = (int(v) for v in self.shapes[i])
        h, w = self._resized_shape(h0, w0)
        im = self._base_image(i)
        if im.shape[:2] != (h, w):
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
        return im, (h0, w0), (h, w)

    def _mosaic_source(self, i):
        """Image i as the mosaic wants it: ``(base image, (h, w) after resizing)``; the warp does the rest."""
        w0, h0 = (int(v) for v in self.shapes[i])
        return self._base_image(i), self._resized_shape(h0, w0)

    def _ram_fits(self, prefix) -> bool:
        """Estimate the RAM cache from a sample of images; refuse (with a warning) if it would not fit."""
        sample = np.linspace(0, self.n - 1, min(self.n, 30)).astype(int)
        per_image = np.mean([self._base_image(i).nbytes for i in sample])
        need, available = per_image * self.n * 1.1, _available_memory()
        if need > available:
            LOGGER.warning(f"{prefix}WARNING --cache ram needs {need / 1e9:.1f} GB but only {available / 1e9:.1f} GB "
                           f"is available; images not cached (try --cache disk)")
            return False
        return True

    def _cache_in_ram(self, prefix):
        with ThreadPool(NUM_THREADS) as pool:
            loaded = pool.imap(self._base_image, range(self.n))
            for i, im in enumerate(tqdm(loaded, total=self.n, desc=f"{prefix}Caching images (RAM)", leave=False)):
                self.ims[i] = im

    def _write_npy(self, i):
        """Save image i as .npy beside it unless an up-to-date one exists (atomically)."""
        npy = Path(self.npy_files[i])
        if npy.exists() and npy.stat().st_mtime_ns >= os.stat(self.im_files[i]).st_mtime_ns:
            return
        buf = io.BytesIO()
        np.save(buf, self._decode(i), allow_pickle=False)
        atomic_write_bytes(npy, buf.getvalue())

    def _cache_on_disk(self, prefix):
        with ThreadPool(NUM_THREADS) as pool:
            for _ in tqdm(pool.imap(self._write_npy, range(self.n)), total=self.n,
                          desc=f"{prefix}Caching images (disk)", leave=False):
                pass

    # ---- samples

    def __len__(self):
        return self.n

    def _rng(self, index, epoch, draw, stream=0):
        return np.random.default_rng([self.seed, epoch, index, draw, stream])

    def _pixel_labels(self, i, w, h, padw=0.0, padh=0.0):
        """Labels of image i as (n, 5) float64 ``[cls, x1, y1, x2, y2]`` in a w x h image shifted by padding."""
        lb = self.labels[i].astype(np.float64)
        lb[:, 1:] = xywhn2xyxy(lb[:, 1:], w, h, padw, padh)
        return lb

    def _load_mosaic(self, index, rng, lut):
        """Image ``index`` and three random partners as a perspective-warped img_size^2 mosaic -> (img, labels).

        ``lut`` is the sample's HSV table (or None), applied inside the mosaic where it is cheapest.
        """
        hyp = self.hyp
        images, sizes, labels = [], [], []
        for i in [index, *rng.integers(0, self.n, size=3).tolist()]:
            im, (h, w) = self._mosaic_source(i)
            images.append(im)
            sizes.append((h, w))
            labels.append(self._pixel_labels(i, w, h))
        return mosaic(images, sizes, labels, self.img_size, rng, degrees=hyp["degrees"], translate=hyp["translate"],
                      scale=hyp["scale"], shear=hyp["shear"], perspective=hyp["perspective"], lut=lut)

    def _load_letterboxed(self, index, rng):
        """Image ``index`` letterboxed to its batch shape (rect) or img_size; warped when augmenting."""
        raw, (h0, w0), (h, w) = self.load_image(index)
        shape = self.batch_shapes[self.batch[index]] if self.rect else self.img_size
        img, ratio, pad = letterbox(raw, shape, auto=False, scaleup=self.augment)
        shapes = (h0, w0), ((h / h0, w / w0), pad)
        labels = self._pixel_labels(index, ratio[0] * w, ratio[1] * h, pad[0], pad[1])
        if self.augment:
            hyp = self.hyp
            img, labels = random_perspective(img, labels, rng, degrees=hyp["degrees"], translate=hyp["translate"],
                                             scale=hyp["scale"], shear=hyp["shear"], perspective=hyp["perspective"])
            if img is raw:  # later steps write in place; never into the RAM cache
                img = raw.copy()
        return img, labels, shapes

    def _flip(self, img, labels, rng):
        """Vertical then horizontal flip with the hyp probabilities; ``labels`` (n, 5) normalised xywh."""
        if rng.random() < self.hyp["flipud"]:
            img = cv2.flip(img, 0)
            labels[:, 2] = 1 - labels[:, 2]
        if rng.random() < self.hyp["fliplr"]:
            img = cv2.flip(img, 1)
            labels[:, 1] = 1 - labels[:, 1]
        return img, labels

    def _parse_key(self, key):
        if isinstance(key, (tuple, list)):
            index, epoch, draw = (int(k) for k in key)
        else:
            index, epoch, draw = int(key), 0, 0
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} images")
        return index, epoch, draw

    def _augmented(self, index, rng):
        """Training sample: mosaic (+ mixup) or warped letterbox, HSV -> (img BGR, labels (n, 5) xyxy pixels)."""
        hyp = self.hyp
        use_mosaic = self.mosaic and rng.random() < hyp["mosaic"]
        lut = hsv_lut(rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
        if not use_mosaic:
            img, labels, _ = self._load_letterboxed(index, rng)
            if lut is not None:
                apply_hsv(img, lut, dst=img)
            return img, labels
        img, labels = self._load_mosaic(index, rng, lut)
        if rng.random() < hyp["mixup"]:
            img, labels = mixup(img, labels, *self._load_mosaic(int(rng.integers(0, self.n)), rng, lut), rng)
        return img, labels

    def __getitem__(self, key):
        index, epoch, draw = self._parse_key(key)
        if self.augment:
            rng = self._rng(index, epoch, draw)
            img, labels = self._augmented(index, rng)
            shapes = None
        else:
            img, labels, shapes = self._load_letterboxed(index, None)
        h, w = img.shape[:2]
        if len(labels):
            labels[:, 1:5] = xyxy2xywhn(labels[:, 1:5], w=w, h=h, clip=True, eps=1e-3)
        if self.augment:
            img, labels = self._flip(img, labels, rng)
        labels_out = torch.zeros((len(labels), 6))
        if len(labels):
            labels_out[:, 1:] = torch.from_numpy(labels)
        return torch.from_numpy(_bgr_to_chw_rgb(img)), labels_out, self.im_files[index], shapes

    def __getitems__(self, keys):
        """A batch of samples; also carries one quad-collate draw per sample so quad stays deterministic."""
        batch = _KeyedBatch(self[k] for k in keys)
        batch.quad_draws = [self._rng(*self._parse_key(k), stream=QUAD_STREAM).random() for k in keys]
        return batch

    # ---- collation

    @staticmethod
    def collate_fn(batch):
        """Samples -> ``(imgs (bs, 3, h, w) uint8, targets (n, 6), paths, shapes)``; targets get their image index."""
        im, label, path, shapes = zip(*batch)
        for i, lb in enumerate(label):
            lb[:, 0] = i
        return torch.stack(im, 0), torch.cat(label, 0), path, shapes

    @staticmethod
    def collate_fn4(batch):
        """Quad collate: each group of 4 samples becomes one 2x image, either sample 0 upscaled or a 2x2 tile."""
        im, label, path, shapes = zip(*batch)
        draws = getattr(batch, "quad_draws", None) or np.random.default_rng(0).random(len(im)).tolist()
        n = -(-len(shapes) // 4)  # a short last batch still gives a (smaller) group
        im4, label4 = [], []
        y_off = torch.tensor([[0.0, 0, 0, 1, 0, 0]])
        x_off = torch.tensor([[0.0, 0, 1, 0, 0, 0]])
        half = torch.tensor([[1, 1, 0.5, 0.5, 0.5, 0.5]])
        for g in range(n):
            i = g * 4
            if draws[i] < 0.5 or i + 4 > len(im):  # too few samples left to tile: upscale the first
                up = F.interpolate(im[i].unsqueeze(0).float(), scale_factor=2.0, mode="bilinear", align_corners=False)
                im4.append(up[0].round().clamp_(0, 255).to(im[i].dtype))
                label4.append(label[i])
            else:
                top = torch.cat((im[i], im[i + 1]), 1)
                bottom = torch.cat((im[i + 2], im[i + 3]), 1)
                im4.append(torch.cat((top, bottom), 2))
                label4.append(torch.cat((label[i], label[i + 1] + y_off, label[i + 2] + x_off,
                                         label[i + 3] + y_off + x_off), 0) * half)
        for i, lb in enumerate(label4):
            lb[:, 0] = i
        return torch.stack(im4, 0), torch.cat(label4, 0), path[:n], shapes[:n]


def _bgr_to_chw_rgb(img):
    """(h, w, 3) BGR -> contiguous (3, h, w) RGB; cv2.split beats a strided numpy transpose copy."""
    b, g, r = cv2.split(img)
    out = np.empty((3, *img.shape[:2]), dtype=img.dtype)
    out[0], out[1], out[2] = r, g, b
    return out


class _KeyedBatch(list):
    """A list of samples with per-sample ``quad_draws`` (plain attribute; lives only inside one worker)."""

    quad_draws = None


# ---------------------------------------------------------------- sampling and loading

def _image_weights(dataset) -> np.ndarray:
    """(N,) sampling weight per image: sum over its labels of the class weight (rare classes weigh more)."""
    classes = [lb[:, 0].astype(int) for lb in dataset.labels]
    nc = max((int(c.max()) + 1 for c in classes if len(c)), default=1)
    cw = dataset.class_weights
    if cw is None:
        freq = np.bincount(np.concatenate(classes) if classes else np.zeros(0, int), minlength=nc).astype(float)
        cw = 1.0 / np.maximum(freq, 1.0)
    cw = np.asarray(cw, dtype=float)
    per_image = np.array([cw[c].sum() if len(c) else cw.min() for c in classes]) + 1e-9
    return per_image / per_image.sum()


def _world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.getenv("WORLD_SIZE", 1))


class DeterministicBatchSampler(Sampler):
    """Batches of keys ``(index, epoch, draw)`` whose order is a pure function of ``(seed, epoch)``.

    With ``rank >= 0`` and a world size above 1 each rank gets an equal shard (padded by repeating
    the start of the order, as DistributedSampler does); rect batches are sharded whole so every
    batch keeps one shape. ``set_epoch(epoch, start_batch)`` skips the first batches of that epoch.
    """

    def __init__(self, dataset, batch_size, shuffle=False, seed=0, rank=-1, world_size=1):
        super().__init__()
        self.dataset = dataset
        self.n = len(dataset)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed) % 2**63
        self.rank = max(rank, 0) if world_size > 1 else 0
        self.world_size = world_size if rank >= 0 else 1
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch (any int >= 0) and the first batch to deliver (resume inside an epoch)."""
        if start_batch < 0 or start_batch > len(self):
            raise ValueError(f"start_batch {start_batch} outside 0..{len(self)}")
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def _order(self):
        """(N,) image indices and (N,) draw numbers (repeats of an index within the epoch) for the whole epoch."""
        rng = np.random.default_rng([self.seed, self.epoch, SAMPLER_STREAM])
        if getattr(self.dataset, "image_weights", False):
            order = rng.choice(self.n, self.n, p=_image_weights(self.dataset))
            draws = np.zeros(self.n, dtype=np.int64)
            seen = {}
            for j, i in enumerate(order.tolist()):
                draws[j] = seen.get(i, 0)
                seen[i] = draws[j] + 1
            return order, draws
        order = rng.permutation(self.n) if self.shuffle else np.arange(self.n)
        return order, np.zeros(self.n, dtype=np.int64)

    def _rect_sharded(self):
        return self.world_size > 1 and getattr(self.dataset, "rect", False)

    def batches(self):
        """All batches of keys this rank sees in the current epoch (before ``start_batch`` is applied)."""
        order, draws = self._order()
        keys = [(int(i), self.epoch, int(d)) for i, d in zip(order, draws)]
        bs = self.batch_size
        if self._rect_sharded():
            batches = [keys[i:i + bs] for i in range(0, len(keys), bs)]
            return _pad_to_multiple(batches, self.world_size)[self.rank::self.world_size]
        if self.world_size > 1:
            keys = _pad_to_multiple(keys, self.world_size)[self.rank::self.world_size]
        return [keys[i:i + bs] for i in range(0, len(keys), bs)]

    def __iter__(self):
        yield from self.batches()[self.start_batch:]

    def __len__(self):
        """Batches in a full epoch for this rank (a resumed epoch delivers ``len - start_batch``)."""
        if self._rect_sharded():
            return math.ceil(math.ceil(self.n / self.batch_size) / self.world_size)
        return math.ceil(math.ceil(self.n / self.world_size) / self.batch_size)


def _pad_to_multiple(items, k):
    """Repeat ``items`` from the start until its length is a multiple of ``k``."""
    total = math.ceil(len(items) / k) * k
    reps = math.ceil(total / len(items))
    return (items * reps)[:total]


class DeterministicDataLoader(DataLoader):
    """DataLoader whose batches depend only on ``(seed, epoch)``; call ``set_epoch`` before each epoch."""

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch; ``start_batch`` skips that many batches without loading them (mid-epoch resume)."""
        self.batch_sampler.set_epoch(epoch, start_batch)


def _worker_init(_worker_id):
    """Workers run one sample at a time; internal thread pools would only oversubscribe the cores."""
    cv2.setNumThreads(0)
    torch.set_num_threads(1)


@contextlib.contextmanager
def _rank_zero_first(rank):
    """Let rank 0 build caches while other ranks of an initialised process group wait."""
    active = rank >= 0 and dist.is_available() and dist.is_initialized()
    if active and rank != 0:
        dist.barrier()
    yield
    if active and rank == 0:
        dist.barrier()


def create_dataloader(path, imgsz, batch_size, stride, single_cls=False, hyp=None, augment=False, cache=False,
                      pad=0.0, rect=False, rank=-1, workers=8, image_weights=False, quad=False, prefix="",
                      shuffle=False, seed=0, nc=None):
    """Build ``(loader, dataset)`` (YOLOv5's signature plus ``nc``, which enables the class-id check).

    Batches: ``(imgs uint8 (bs, 3, h, w) RGB, targets (n, 6) [img_idx, cls, x, y, w, h], paths, shapes)``.
    """
    if rect and shuffle:
        LOGGER.warning(f"{prefix}WARNING --rect is incompatible with shuffle, setting shuffle=False")
        shuffle = False
    with _rank_zero_first(rank):
        dataset = LoadImagesAndLabels(path, imgsz, batch_size, augment=augment, hyp=hyp, rect=rect,
                                      image_weights=image_weights, cache_images=cache, single_cls=single_cls,
                                      stride=int(stride), pad=pad, prefix=prefix, seed=seed, nc=nc)
    batch_size = min(batch_size, len(dataset))
    nw = min(os.cpu_count() or 1, batch_size, workers)
    sampler = DeterministicBatchSampler(dataset, batch_size, shuffle=shuffle, seed=seed, rank=rank,
                                        world_size=_world_size())
    loader = DeterministicDataLoader(
        dataset, batch_sampler=sampler, num_workers=nw, pin_memory=PIN_MEMORY and torch.cuda.is_available(),
        collate_fn=LoadImagesAndLabels.collate_fn4 if quad else LoadImagesAndLabels.collate_fn,
        worker_init_fn=_worker_init, persistent_workers=nw > 0,
        generator=torch.Generator().manual_seed(int(seed) % 2**63))  # keeps the global torch RNG untouched
    return loader, dataset


# ---------------------------------------------------------------- inference sources

class LoadImages:
    """Iterate images and videos from a file, folder, glob or .txt list (for detect.py).

    Yields ``(path, im (3, h, w) RGB uint8 letterboxed, im0 (h0, w0, 3) BGR original, video capture or
    None, description)``; videos frame by frame, keeping every ``vid_stride``-th frame.
    """

    def __init__(self, path, img_size=640, stride=32, auto=True, vid_stride=1):
        files = []
        for p in path if isinstance(path, (list, tuple)) else [path]:
            p = Path(str(p)).expanduser()
            if "*" in str(p):
                files += sorted(glob.glob(str(p), recursive=True))
            elif p.is_dir():
                files += sorted(str(x) for x in p.glob("*.*"))
            elif p.is_file() and p.suffix == ".txt":
                lines = [x.strip() for x in p.read_text(errors="replace").splitlines() if x.strip()]
                files += [x if os.path.isabs(x) else str(p.parent / x) for x in lines]
            elif p.is_file():
                files.append(str(p))
            else:
                raise UserError(f"--source {p} does not exist")
        images = [x for x in files if _suffix(x) in IMG_FORMATS]
        videos = [x for x in files if _suffix(x) in VID_FORMATS]
        if not images and not videos:
            raise UserError(f"--source {path}: no supported files; images: {', '.join(IMG_FORMATS)}; "
                            f"videos: {', '.join(VID_FORMATS)}")
        self.img_size, self.stride, self.auto = img_size, stride, auto
        self.vid_stride = max(int(vid_stride), 1)
        self.files = images + videos
        self.nf = len(self.files)
        self.video_flag = [False] * len(images) + [True] * len(videos)
        self.mode = "image"
        self.cap, self.frame, self.frames = None, 0, 0
        self.count = 0

    def __iter__(self):
        self.count = 0
        return self

    def _new_video(self, path):
        self.frame = 0
        self.cap = cv2.VideoCapture(path)
        self.frames = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT) / self.vid_stride)

    def _next_frame(self, path):
        """The next kept frame of the current video or None when it ends."""
        if self.cap is None:
            self._new_video(path)
        for _ in range(self.vid_stride - 1):
            self.cap.grab()
        ok, frame = self.cap.read()
        if not ok:
            if self.frame == 0:
                LOGGER.warning(f"WARNING {path}: cannot read video, skipped")
            self.cap.release()
            self.cap = None
            return None
        self.frame += 1
        return frame

    def __next__(self):
        while self.count < self.nf:
            path = self.files[self.count]
            if self.video_flag[self.count]:
                self.mode = "video"
                im0 = self._next_frame(path)
                if im0 is None:
                    self.count += 1
                    continue
                s = f"video {self.count + 1}/{self.nf} ({self.frame}/{self.frames}) {path}: "
                cap = self.cap
            else:
                self.mode = "image"
                self.count += 1
                im0 = read_image(path)
                if im0 is None:
                    LOGGER.warning(f"WARNING {path}: cannot read image, skipped")
                    continue
                s = f"image {self.count}/{self.nf} {path}: "
                cap = None
            im = _bgr_to_chw_rgb(letterbox(im0, self.img_size, stride=self.stride, auto=self.auto)[0])
            return path, im, im0, cap, s
        raise StopIteration

    def __len__(self):
        return self.nf
