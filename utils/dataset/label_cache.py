"""Label scan and cache: one verdict per image/label pair, post-cache label checks, and the atomic
``.npz`` cache of the scan (plain arrays, never unpickled) keyed by ``cache_hash``.

The scan's rules are in docs/data.md. The cache holds the per-file verdicts, which depend only on
the files; the class-id check (needs ``nc``) and the zero-size-box check run on every load, after
the cache, so neither changes ``cache_hash`` and both apply to caches written before they existed.
"""

import hashlib
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from utils.errors import UserError
from utils.files import atomic_write_bytes
from utils.dataset.image_io import IMG_FORMATS, collect_image_files, img2label_paths, map_in_threads
from utils.logging import LOGGER

LABEL_TOLERANCE = 0.01  # coordinates in (1, 1 + tolerance] are clipped to 1; beyond that the file is skipped
MIN_IMAGE_SIDE = 10  # pixels; smaller images are treated as corrupt, as in YOLOv5
CACHE_VERSION = "ffca-labels-3"  # part of cache_hash: changing it changes the hash recorded in determinism.json
# What a cached scan's verdicts assume, checked on load and not part of cache_hash: a cache made under other
# rules is rescanned, while the hash of the same files stays what determinism.json recorded.
SCAN_RULES = "polygon-rows-as-boxes"


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
    polygon = is_polygon_row(len(parts))
    if len(parts) != 5 and not polygon:
        return (f"expected 5 columns 'class x y w h' or a polygon 'class x1 y1 x2 y2 x3 y3 ...', "
                f"got {len(parts)}"), None
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
    return None, polygon_box(values) if polygon else values


def is_polygon_row(n_values: int) -> bool:
    """Whether a label row of ``n_values`` numbers is one of YOLOv5's segment rows, ``class x1 y1 ... x3 y3 ...``."""
    return n_values >= 7 and n_values % 2 == 1


def polygon_box(values: list) -> list:
    """``[class, x1, y1, x2, y2, ...]`` -> ``[class, x, y, w, h]`` of the polygon's enclosing box, as YOLOv5
    trains detection on segment labels."""
    xs, ys = values[1::2], values[2::2]
    return [values[0], (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2, max(xs) - min(xs), max(ys) - min(ys)]


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
            messages.append(f"{lb_file}:{n}: coordinate {max(values[1:])!r} slightly > 1 clipped to 1")
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


def _drop_zero_size(labels, lines, lb_file):
    """Rows of one image without the zero-width or zero-height boxes no prediction can match.

    ``labels`` (n, 5) ``[cls, x, y, w, h]``, ``lines`` (n,) -> ``(labels, lines, one message per dropped row)``.
    """
    zero = (labels[:, 3] == 0) | (labels[:, 4] == 0)
    messages = [f"{lb_file}:{line}: zero-size box (w={w:g}, h={h:g}) dropped; a box needs a width and a height"
                for (_, _, _, w, h), line in zip(labels[zero].tolist(), lines[zero].tolist())]
    return labels[~zero], lines[~zero], messages


# ---------------------------------------------------------------- label cache (no pickle, atomic)

def file_identity(path) -> str:
    """``path|size|SHA-256 of its bytes``, or ``path|missing``: what a file contributes to ``cache_hash``. Its
    content, not its timestamps, which ``cp -p``, ``tar`` and ``rsync -a`` keep when they replace a file."""
    try:
        with open(path, "rb") as f:
            size, digest = os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return f"{path}|missing\n"
    return f"{path}|{size}|{digest}\n"


def label_cache_key(im_files, label_files, prefix="") -> str:
    """SHA-256 over the path, size and SHA-256 of the bytes of every image and label, plus the scan rules."""
    h = hashlib.sha256(f"{CACHE_VERSION}|{LABEL_TOLERANCE}|{MIN_IMAGE_SIDE}".encode())
    for identity in map_in_threads(file_identity, [*im_files, *label_files], f"{prefix}Hashing the files"):
        h.update(identity.encode())
    return h.hexdigest()


def _cache_arrays(key, results, counts) -> dict:
    """The scan as plain arrays, the cache's content: usable images, their labels (flat, with offsets),
    upright shapes (N, 2) (w, h), EXIF orientations, every message, and the five verdict counts."""
    usable = [r for r in results if r.labels is not None]
    lengths = [len(r.labels) for r in usable]
    no_labels = np.zeros((0, 5), np.float32)
    return dict(
        version=np.array(CACHE_VERSION), key=np.array(key), scan_rules=np.array(SCAN_RULES),
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
        LOGGER.warning(f"{prefix}cache folder {Path(path).parent} is not writeable, labels not cached ({e})")


def load_label_cache(path, key):
    """The cached scan as a dict, or None when the file is missing, stale, truncated or malformed."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if (str(z["version"]) != CACHE_VERSION or str(z["key"]) != key or "scan_rules" not in z.files
                    or str(z["scan_rules"]) != SCAN_RULES):
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
    jobs = map_in_threads(lambda a: verify_image_label(*a), zip(im_files, label_files), desc)
    for r in tqdm(jobs, desc=desc, total=len(im_files), bar_format="{l_bar}{bar:10}{r_bar}", leave=False):
        counts[r.status] += 1
        counts["duplicate"] += int(r.duplicate)
        results.append(r)
    return results, counts


# ---------------------------------------------------------------- loading a split

@dataclass
class LabelSet:
    """The usable images of a split, in file order, with what the data set needs about each."""

    im_files: list
    labels: list  # per image (n, 5) float32 [cls, x, y, w, h], normalised; the caller may modify them
    shapes: np.ndarray  # (N, 2) int64 upright (w, h)
    orientations: np.ndarray  # (N,) int EXIF orientation
    cache_hash: str


def _cached_scan(im_files, label_files, prefix):
    """The scan of every pair: from ``<labels folder>.cache`` when its key is current, else scanned and
    cached -> ``(cache arrays, cache path)``."""
    cache_path = Path(label_files[0]).parent.with_suffix(".cache")
    key = label_cache_key(im_files, label_files, prefix)
    cache = load_label_cache(cache_path, key)
    if cache is None:
        if cache_path.exists():
            LOGGER.info(f"{prefix}Label cache {cache_path} is stale or unreadable, rescanning")
        cache = _cache_arrays(key, *_scan(im_files, label_files, prefix))
        save_label_cache(cache_path, cache, prefix)
    return cache, cache_path


def _rows_per_image(cache):
    """The cache's flat label rows split per image -> (labels (n, 5) copies, line numbers (n,))."""
    offsets = cache["offsets"]
    spans = list(zip(offsets[:-1], offsets[1:]))
    return [cache["labels"][a:b].copy() for a, b in spans], [cache["lines"][a:b] for a, b in spans]


def _summary(counts, n_scanned, n_kept) -> str:
    """The split's one-line count; images skipped for their class ids count as corrupt."""
    found, missing, empty, corrupt, duplicate = (int(c) for c in counts)
    found, corrupt = found - (n_scanned - n_kept), corrupt + (n_scanned - n_kept)
    return (f"{found} found, {missing} missing, {empty} empty, {corrupt} corrupt, {duplicate} duplicate "
            f"-> {n_kept} usable images")


def load_labels(path, nc=None, prefix="") -> LabelSet:
    """Scan (or load the cache of) every image/label pair under ``path``; keep the usable images
    (class ids below ``nc`` when given) without their zero-size boxes. Warns per file and line;
    a split with no usable image is a UserError."""
    im_files = collect_image_files(path, prefix)
    cache, cache_path = _cached_scan(im_files, img2label_paths(im_files), prefix)
    labels, lines = _rows_per_image(cache)
    usable_files = [str(f) for f in cache["im_files"]]
    label_files = img2label_paths(usable_files)
    class_problems = _class_problems(labels, lines, label_files, nc)
    keep = [i for i, problem in enumerate(class_problems) if problem is None]
    zero_size = []
    for i in keep:
        labels[i], lines[i], messages = _drop_zero_size(labels[i], lines[i], label_files[i])
        zero_size += messages
    for msg in [*cache["messages"], *filter(None, class_problems), *zero_size]:
        LOGGER.warning(f"{prefix}{msg}")
    summary = _summary(cache["counts"], len(usable_files), len(keep))
    LOGGER.info(f"{prefix}{cache_path.with_suffix('')}: {summary}")
    if not keep:
        raise UserError(f"{prefix}{path}: no usable images ({summary}); fix the files named in the warnings "
                        f"(see docs/data.md)")
    return LabelSet(im_files=[usable_files[i] for i in keep], labels=[labels[i] for i in keep],
                    shapes=cache["shapes"][keep].astype(np.int64),
                    orientations=cache["orientations"][keep].astype(int), cache_hash=str(cache["key"]))
