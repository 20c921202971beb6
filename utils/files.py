"""Files and folders: YAML I/O, run-folder numbering, atomic writes."""

import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from utils.errors import UserError


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
    clean = {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}
    atomic_write_bytes(path, yaml.safe_dump(clean, sort_keys=False).encode())


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
