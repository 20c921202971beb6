"""Files and folders: YAML I/O, run-folder numbering, atomic writes."""

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import yaml

from utils.errors import UserError


def plain_data(obj):
    """Recursively turn Paths, tuples, str subclasses and numpy values into plain Python types.

    Anything else (numbers, None, tensors) is returned unchanged, so the result suits both
    ``yaml.safe_dump`` and ``torch.load(..., weights_only=True)``.
    """
    if isinstance(obj, dict):
        return {plain_data(k): plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_data(v) for v in obj]
    if isinstance(obj, (Path, str)):
        return str(obj)
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()
    return obj


def yaml_load(path) -> dict:
    """Load a YAML file safely (``yaml.safe_load``); a missing or unparsable file is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        with open(path, errors="ignore") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        detail = str(e).replace("\n", " ")
        raise UserError(f"{path}: not valid YAML ({detail})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def yaml_save(path, data: dict) -> None:
    """Write ``data`` as YAML atomically (plain types only; Paths become strings)."""
    atomic_write_bytes(path, yaml.safe_dump(plain_data(data), sort_keys=False).encode())


def increment_path(path, exist_ok: bool = False, sep: str = "", mkdir: bool = False) -> Path:
    """runs/train/exp -> runs/train/exp2, exp3, ... unless ``exist_ok`` (YOLOv5's numbering)."""
    path = Path(path)
    if path.exists() and not exist_ok:
        stem, suffix = (path.with_suffix(""), path.suffix) if path.is_file() else (path, "")
        for n in range(2, 100000):
            candidate = Path(f"{stem}{sep}{n}{suffix}")
            if not candidate.exists():
                path = candidate
                break
    if mkdir:
        path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb"):
    """Open a temporary file beside ``path``; on success flush, fsync and rename it over ``path``.

    A crash, power loss or full disk while writing leaves the previous ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)
