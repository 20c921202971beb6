"""Reading the user's source folders: image sizes, split names, deterministic splits, numbers in rows."""

import hashlib
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from utils.errors import UserError

IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


def image_size(path: Path):
    """``(width, height)`` read from the image header, or None when the file is missing or not an image."""
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # only the header is read (DOTA v2 is huge)
    try:
        with Image.open(path) as im:
            return im.size
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def list_images(folder: Path) -> list:
    """Image files directly in ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def split_from_name(name: str):
    """``train``/``val``/``test`` from a folder or file name (``VisDrone2019-DET-val`` -> ``val``), else None.

    ``trainval`` names are not a split of their own (they duplicate train + val) and give None.
    """
    lower = name.lower()
    if "trainval" in lower:
        return None
    for split in ("test", "val", "train"):
        if split in lower:
            return split
    return None


def hash_split(stem: str, val_fraction: float) -> str:
    """``'val'`` for about ``val_fraction`` of names, chosen by a hash of the name (stable across runs)."""
    digest = int(hashlib.sha256(stem.encode()).hexdigest()[:8], 16)
    return "val" if digest / 0xFFFFFFFF < val_fraction else "train"


def hash_fold(stem: str, n_folds: int) -> int:
    """The fold (1..``n_folds``) whose val split holds ``stem``, by the same hash as :func:`hash_split`."""
    return int(hashlib.sha256(stem.encode()).hexdigest()[:8], 16) % n_folds + 1


def check_fraction(value: float, flag: str = "--val-fraction") -> float:
    """A fraction in [0, 1) or a UserError naming the flag."""
    if not 0.0 <= value < 1.0:
        raise UserError(f"{flag} {value}: must be at least 0 and below 1")
    return value


def numbers(tokens, kind=float) -> list:
    """Parse ``tokens`` as finite numbers of type ``kind``; a ValueError names the bad token."""
    out = []
    for token in tokens:
        try:
            value = kind(token)
        except (TypeError, ValueError):
            raise ValueError(f"{token!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{token!r} is not a finite number")
        out.append(value)
    return out


def require_dir(path: Path, flag: str = "--src") -> Path:
    """``path`` resolved, or a UserError when it is not an existing folder."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise UserError(f"{flag} {path}: folder not found")
    return path
