"""Decoded training images, read on demand or cached (``--cache ram`` / ``--cache disk``).

A cached image is the one samples are built from (shrunk to ``img_size`` when larger, never
enlarged), in RAM and in the ``.npy`` files of ``--cache disk`` alike, so cached and uncached
training give bit-identical batches, and a 2000 x 1500 JPEG costs a 640-px array, not 9 MB.

A ``--cache disk`` entry is two ``.npy`` records in one file: the image (what ``np.load`` of the file
returns), then its key, the size and SHA-256 of the image file's bytes it was made from
(:func:`source_key`). Each run checks every entry against the image's bytes before using it, whatever
the timestamps say (``cp -p``, ``tar`` and ``rsync -a`` keep them), and rebuilds an entry made from other
bytes, by an older version, or that cannot be read. Nothing is unpickled. The RAM cache is filled from
the files at the start of every run, so it cannot hold another run's pixels.
"""

import contextlib
import hashlib
import math
import os
import resource
from multiprocessing.pool import ThreadPool
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from utils.errors import UserError
from utils.files import atomic_open
from utils.dataset.image_io import NUM_THREADS, jpeg_reduction, read_image
from utils.logging import LOGGER


def cache_mode(cache, prefix="") -> str | None:
    """The ``--cache`` value as 'ram', 'disk' or None; anything else is a UserError."""
    if cache in (False, None, "", "false", "False"):
        return None
    if cache is True or cache in ("ram", "true", "True"):
        return "ram"
    if cache == "disk":
        return "disk"
    raise UserError(f"{prefix}--cache {cache!r}: use 'ram' or 'disk' (or leave it off)")


PROC_MEMINFO = Path("/proc/meminfo")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PROC_SELF_STATUS = Path("/proc/self/status")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _meminfo_available() -> int:
    """Bytes the kernel could give new allocations (Linux MemAvailable, else free physical pages)."""
    with contextlib.suppress(OSError, ValueError):
        for line in PROC_MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_headroom() -> int | None:
    """Bytes left under the tightest cgroup v2 ``memory.max`` of this process's cgroup and its parents
    (``memory.max`` minus ``memory.current``); None when no limit is set ("max") or cgroup v2 is absent."""
    with contextlib.suppress(OSError):
        relative = next((line[3:] for line in PROC_SELF_CGROUP.read_text().splitlines() if line.startswith("0::")),
                        None)
        if relative is None:
            return None
        folder, headrooms = CGROUP_ROOT / relative.strip().lstrip("/"), []
        for level in (folder, *folder.parents):
            if not level.is_relative_to(CGROUP_ROOT):
                break
            limit = _read_int(level / "memory.max")
            if limit is not None:
                headrooms.append(limit - (_read_int(level / "memory.current") or 0))
        return min(headrooms, default=None)
    return None


def _read_int(path: Path) -> int | None:
    """The integer in a one-value cgroup file; None when it is missing, unreadable or "max" (no limit)."""
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _rlimit_headroom() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (soft limit minus this process's VmSize); None if unlimited.

    A process maps far more address space than it touches, so this is what the limit really leaves."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = 0
    with contextlib.suppress(OSError, ValueError):
        for line in PROC_SELF_STATUS.read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
    return soft - used


def _available_memory() -> tuple[int, str]:
    """(bytes this process can still allocate, what limits it): the least of MemAvailable, the cgroup v2
    ``memory.max`` headroom and the ``RLIMIT_AS`` headroom."""
    limits = {"MemAvailable": _meminfo_available(), "cgroup memory.max": _cgroup_headroom(),
              "RLIMIT_AS": _rlimit_headroom()}
    name, available = min(((k, v) for k, v in limits.items() if v is not None), key=lambda kv: kv[1])
    return max(available, 0), name


CACHE_FORMAT = "ffca-image-cache-1"  # first word of every key: a new entry layout rebuilds the old entries


def source_key(path) -> str:
    """The key of a ``--cache disk`` entry made from the image file ``path`` as it is now: the entry layout,
    the file's size and the SHA-256 of its bytes (reading and hashing cost a fraction of a decode)."""
    data = Path(path).read_bytes()
    return f"{CACHE_FORMAT} {len(data)} {hashlib.sha256(data).hexdigest()}"


def read_entry(path) -> tuple[np.ndarray, str]:
    """``(image, key)`` of a ``--cache disk`` file; the key is '' in a file written before keys existed.
    A file that is not two ``.npy`` records raises ValueError (or OSError); pickled data is refused."""
    with open(path, "rb") as f:
        im = np.lib.format.read_array(f, allow_pickle=False)
        if not f.peek(1):
            return im, ""
        key = np.lib.format.read_array(f, allow_pickle=False)
    if key.dtype.kind != "U" or key.ndim != 0:
        raise ValueError(f"{path}: the record after the image is not a cache key")
    return im, str(key)


def write_entry(path, im: np.ndarray, key: str) -> None:
    """Write ``im`` and its ``key`` as a ``--cache disk`` file, atomically (see :func:`read_entry`)."""
    with atomic_open(path, "wb") as f:
        np.save(f, im, allow_pickle=False)
        np.save(f, np.array(key), allow_pickle=False)


class ImageCache:
    """The images of a data set as upright BGR uint8 arrays, indexed like ``im_files``.

    ``shapes`` (N, 2) holds the upright ``(w, h)`` from the scan and ``orientations`` (N,) the EXIF
    orientations; ``augment`` selects the shrinking interpolation (linear for training, area otherwise).
    ``full_size`` keeps base images (and the RAM cache) at their original size, for training tiles.
    ``reduced_decode`` (``--reduced-decode``) lets libjpeg decode a JPEG at 1/2, 1/4 or 1/8 of its size when that
    still covers ``img_size``; the shrink does the rest. Faster, and its pixels differ slightly from a full decode.
    """

    def __init__(self, im_files, shapes, orientations, img_size, augment, mode=None, prefix="", full_size=False,
                 reduced_decode=False):
        self.im_files, self.shapes, self.orientations = im_files, shapes, orientations
        self.img_size, self.augment, self.prefix = img_size, augment, prefix
        self.full_size = full_size
        self.reduced_decode = reduced_decode and not full_size
        self.n = len(im_files)
        self.ims = [None] * self.n  # RAM cache of base images (see base_image)
        self.npy_files = [f"{Path(f).with_suffix('')}.{self._cache_tag()}.npy" for f in im_files]
        self.entry_keys = [None] * self.n  # key of each .npy checked against its image this run; None: not used
        self.disk = mode == "disk"
        self._read_around = False  # whether a checked .npy that later failed to load was already reported
        per_image = self._announce_size(mode) if mode in ("ram", "disk") else 0.0
        if mode == "ram" and self._ram_fits(per_image):
            self._cache_in_ram()
        if self.disk:
            self._cache_on_disk()

    def _cache_tag(self) -> str:
        """What a ``.npy`` file holds: the image at full size, or shrunk to ``img_size`` with which interpolation
        (a cache made for other settings is another file, never a wrong one)."""
        if self.full_size:
            return "full"
        return f"{self.img_size}-{'linear' if self.augment else 'area'}{'-reduced' if self.reduced_decode else ''}"

    def _decode(self, i):
        """Decode image file i upright as BGR uint8 -> ``(im, (h0, w0) its full size)``; ``im`` is smaller than
        that when ``reduced_decode`` let libjpeg shrink it."""
        w0, h0 = (int(v) for v in self.shapes[i])
        reduction = jpeg_reduction(self.im_files[i], max(h0, w0), self.img_size) if self.reduced_decode else 1
        im = read_image(self.im_files[i], int(self.orientations[i]), reduction)
        if im is None:
            raise UserError(f"{self.prefix}{self.im_files[i]}: image can no longer be read (changed since the scan?)")
        return im, (im.shape[:2] if reduction == 1 else (h0, w0))

    def resized_shape(self, h0, w0):
        """(h, w) of an h0 x w0 image scaled so its long side is ``img_size``."""
        r = self.img_size / max(h0, w0)
        return (math.ceil(h0 * r), math.ceil(w0 * r)) if r != 1 else (h0, w0)

    def base_image(self, i):
        """Image i as cached and warped from: shrunk to ``img_size`` when larger (not if ``full_size``), else as is.

        Enlarging is left to the consumer (the mosaic warp does it in its single interpolation), so
        small images cost no extra memory and cached and uncached samples are bit-identical.
        """
        if self.ims[i] is not None:
            return self.ims[i]
        if self.disk and self.entry_keys[i] is not None:
            with contextlib.suppress(OSError, ValueError):
                im, key = read_entry(self.npy_files[i])
                if key == self.entry_keys[i]:
                    return im  # written shrunk: shrinking again could change it
            self._report_read_around(i)
        return self._shrunk(*self._decode(i))

    def _report_read_around(self, i):
        """Warn once that a .npy checked at start-up no longer holds what it did (rewritten or damaged since)."""
        if not self._read_around:
            self._read_around = True
            LOGGER.warning(f"{self.prefix}--cache disk: {self.npy_files[i]} changed or became unreadable during "
                           "the run; its image is decoded instead (training is unchanged, only slower)")

    def _shrunk(self, im, full_hw):
        """The decoded ``im`` of an image ``full_hw`` (h0, w0) in size, shrunk so its long side is ``img_size``
        (unchanged when the image is smaller, or ``full_size``)."""
        if self.full_size:
            return im
        h0, w0 = full_hw
        h, w = self.resized_shape(h0, w0)
        if h < h0 or w < w0:
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR if self.augment else cv2.INTER_AREA)
        return im

    def load_image(self, i):
        """Image i resized so its long side is ``img_size`` -> ``(im (h, w, 3) BGR, (h0, w0), (h, w))``.

        The returned array may be the RAM cache itself: callers must not modify it in place.
        """
        w0, h0 = (int(v) for v in self.shapes[i])
        h, w = self.resized_shape(h0, w0)
        im = self.base_image(i)
        if im.shape[:2] != (h, w):
            im = cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR)
        return im, (h0, w0), (h, w)

    def mosaic_source(self, i):
        """Image i as the mosaic wants it: ``(base image, (h, w) after resizing)``; the warp does the rest."""
        w0, h0 = (int(v) for v in self.shapes[i])
        return self.base_image(i), self.resized_shape(h0, w0)

    def _cached_hw(self, i) -> tuple[int, int]:
        """(h, w) of image i as cached: ``img_size`` on the long side when larger (see :meth:`_shrunk`)."""
        w0, h0 = (int(v) for v in self.shapes[i])
        h, w = self.resized_shape(h0, w0)
        return (h, w) if not self.full_size and (h < h0 or w < w0) else (h0, w0)

    def _announce_size(self, mode: str) -> float:
        """Bytes per cached image (exact, from the scanned sizes) and the total, logged before filling."""
        per_image = float(np.mean([3 * math.prod(self._cached_hw(i)) for i in range(self.n)]))
        LOGGER.info(f"{self.prefix}--cache {mode}: about {per_image / 1e6:.2f} MB per image as cached "
                    f"({self._cache_tag()}), {per_image * self.n / 1e9:.3f} GB for {self.n} images")
        return per_image

    def _ram_fits(self, per_image: float) -> bool:
        """Refuse the RAM cache (with a warning) if ``per_image`` bytes for every image would not fit."""
        need, (available, limit) = per_image * self.n * 1.1, _available_memory()
        if need > available:
            LOGGER.warning(f"{self.prefix}--cache ram needs {need / 1e9:.1f} GB but only "
                           f"{available / 1e9:.1f} GB is available ({limit}); images not cached (try --cache disk)")
            return False
        return True

    def _cache_in_ram(self):
        with ThreadPool(NUM_THREADS) as pool:
            loaded = pool.imap(self.base_image, range(self.n))
            desc = f"{self.prefix}Caching images (RAM)"
            for i, im in enumerate(tqdm(loaded, total=self.n, desc=desc, leave=False)):
                self.ims[i] = im

    def _entry_state(self, i, key: str) -> str:
        """What image i's .npy holds against ``key``: 'valid', 'missing', 'stale' (other bytes, or written before
        keys existed) or 'damaged' (not two .npy records, or not a 3-channel uint8 image)."""
        try:
            im, stored = read_entry(self.npy_files[i])
        except FileNotFoundError:
            return "missing"
        except (OSError, ValueError):
            return "damaged"
        if stored != key:
            return "stale"
        return "valid" if im.dtype == np.uint8 and im.ndim == 3 and im.shape[2] == 3 else "damaged"

    def _source_key(self, i) -> str:
        try:
            return source_key(self.im_files[i])
        except OSError as e:
            raise UserError(f"{self.prefix}{self.im_files[i]}: image can no longer be read ({e.strerror or e}); "
                            "it changed since the scan: run again") from None

    def _check_or_write(self, i, written: list) -> str:
        """Keep image i's .npy if it was made from the image's present bytes, else write it (atomically, appending
        its path to ``written``); the entry is then used. Returns the state the entry was found in."""
        key = self._source_key(i)
        state = self._entry_state(i, key)
        if state != "valid":
            im = self._shrunk(*self._decode(i))
            if self._source_key(i) != key:  # the pixels must come from the bytes the key names
                raise UserError(f"{self.prefix}{self.im_files[i]}: the image changed while it was being cached; "
                                "run again once nothing writes to the data set")
            write_entry(self.npy_files[i], im, key)
            written.append(self.npy_files[i])
        self.entry_keys[i] = key
        return state

    def _cache_on_disk(self):
        """Check or write the .npy files; if the data set's folder cannot take them (read-only, full), delete the
        ones this run wrote, warn once and read the images themselves instead: training is slower, never different."""
        written, failures = [], []

        def check_or_write(i):
            if failures:  # the folder refused a write: writing more would fail too
                return None
            try:
                return self._check_or_write(i, written)
            except OSError as e:
                failures.append(e)
                return None

        with ThreadPool(NUM_THREADS) as pool:  # every task returns before the pool closes: no write outlives it
            states = list(tqdm(pool.imap(check_or_write, range(self.n)), total=self.n,
                               desc=f"{self.prefix}Caching images (disk)", leave=False))
        if failures:
            self._give_up_disk(failures[0], written)
        else:
            self._report_rebuilt(states)

    def _give_up_disk(self, error: OSError, written: list):
        """Use no .npy file, delete the ones this run wrote, and say why once."""
        self.disk, self.entry_keys = False, [None] * self.n
        for path in written:
            with contextlib.suppress(OSError):
                os.unlink(path)
        folder = Path(error.filename or self.npy_files[0]).parent
        LOGGER.warning(f"{self.prefix}--cache disk: cannot write .npy files in {folder} ({error.strerror or error}); "
                       "images are read without a cache (use --cache ram, or make the data set's folder writable)")

    def _report_rebuilt(self, states: list):
        """One line for the entries rebuilt because their image's bytes changed, one warning for damaged ones."""
        for state, say in (("stale", LOGGER.info), ("damaged", LOGGER.warning)):
            found = [self.npy_files[i] for i, s in enumerate(states) if s == state]
            if found:
                what = ("made from other image bytes (the image was replaced) or by an older version"
                        if state == "stale" else "unreadable (truncated or not a cache file)")
                say(f"{self.prefix}--cache disk: {len(found)} .npy file(s) {what}, rebuilt from the images "
                    f"(first: {found[0]})")
