"""Files and folders: YAML I/O, run-folder numbering, atomic writes, writable-folder checks.

Atomic writes go to a temporary file beside the target (``.NAME.XXXX.tmp``), are fsynced and
then renamed over the target, so the target is always either the old or the new complete file.
Writes in progress are registered, so a process that must exit at once (a second Ctrl-C) can
abandon them cleanly with :func:`abandon_pending_writes` instead of leaving temporary files.
A folder written in full beside its target is put in place with :func:`replace_folder`.
"""

import contextlib
import errno
import os
import re
import shutil
import tempfile
import threading
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


# A rename and its bookkeeping happen together or not at all; re-entrant because a signal handler
# running on the main thread may abandon writes while that thread is inside a commit.
_COMMIT_LOCK = threading.RLock()
_PENDING = {}  # temporary path -> target path of atomic writes in progress (this process)
_ABANDONED = threading.Event()  # set once the process gave up its writes; later renames refuse
TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]+\.tmp$")  # tempfile.mkstemp names used below


def current_umask() -> int:
    """The process's umask, read without changing it (Linux ``/proc``); elsewhere via ``os.umask``."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path, mode: str = "wb", on_commit=None):
    """Open a temporary file beside ``path``; on success flush, fsync and rename it over ``path``.

    A crash, power loss or full disk while writing leaves the previous ``path`` untouched. The
    file gets the permissions ``open()`` would give it (0666 less the umask), not mkstemp's 0600.
    ``on_commit()`` runs right after the rename, under the same lock as
    :func:`abandon_pending_writes`, so bookkeeping of what is on disk never lags the disk.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    _PENDING[tmp] = path
    try:
        with os.fdopen(fd, mode) as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        with _COMMIT_LOCK:
            if _ABANDONED.is_set():
                raise OSError(errno.ECANCELED, f"write of {path} abandoned: the process is exiting")
            os.replace(tmp, path)
            _PENDING.pop(tmp, None)
            if on_commit is not None:
                on_commit()
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        _PENDING.pop(tmp, None)


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def abandon_pending_writes() -> list:
    """Give up every atomic write in progress: delete its temporary file; no rename happens after this.

    For a process about to exit at once (e.g. from a signal watchdog thread). Returns the target
    paths whose writes were abandoned; each still holds its previous complete content, or is absent.
    """
    with _COMMIT_LOCK:
        _ABANDONED.set()
        abandoned = []
        for tmp, target in list(_PENDING.items()):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            abandoned.append(target)
        _PENDING.clear()
    return abandoned


def replace_folder(src, dst) -> None:
    """Move the complete folder ``src`` to ``dst`` (same file system), replacing any ``dst``.

    A directory cannot be renamed over a non-empty one, so an existing ``dst`` is first renamed to
    ``.NAME.old`` beside it and deleted only once ``src`` is in place; if that move fails, it is
    moved back. ``dst`` is therefore never a mix of old and new files.
    """
    src, dst = Path(src), Path(dst)
    old = dst.with_name(f".{dst.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    had_old = dst.exists()
    if had_old:
        os.replace(dst, old)
    try:
        os.replace(src, dst)
    except OSError:
        if had_old:
            os.replace(old, dst)
        raise
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    elif had_old:
        old.unlink(missing_ok=True)


def remove_orphaned_temp_files(folder, target_suffix: str | tuple = ".pt") -> list:
    """Delete temporary files of atomic writes that an earlier process left (SIGKILL, power loss).

    Only ``.NAME.XXXX.tmp`` files whose NAME ends with ``target_suffix`` (or one of a tuple) and that this process is
    not writing are removed. Returns ``(path, size_in_bytes)`` pairs of what was removed.
    """
    removed = []
    ours = set(_PENDING)
    for candidate in Path(folder).glob(".*.tmp"):
        match = TEMP_NAME.match(candidate.name)
        if not match or not match["target"].endswith(target_suffix) or str(candidate) in ours:
            continue
        with contextlib.suppress(OSError):
            size = candidate.stat().st_size
            candidate.unlink()
            removed.append((candidate, size))
    return removed


def unwritable(what: str, folder, error: OSError) -> UserError:
    """The one line for a folder nothing can be written in: ``what`` names the option it came from."""
    return UserError(f"{what}: cannot write in {folder} ({error.strerror or type(error).__name__}); choose a writable "
                     "folder or fix its permissions")


def _probe_write(folder: Path, what: str) -> None:
    """Prove a file can be written in existing folder ``folder``, by writing one: permission bits alone mislead
    (root, read-only mounts, ACLs). Otherwise one UserError line naming ``what``."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise unwritable(what, folder, e) from None


def ensure_writable_dir(path, what: str) -> Path:
    """Create folder ``path`` and prove a file can be written in it; otherwise one UserError line.

    ``what`` names the option the folder came from (e.g. ``--project runs/train``).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(what, path, e) from None
    _probe_write(path, what)
    return path


def check_folder_can_be_made(path, what: str) -> None:
    """Check, without making it, that folder ``path`` could be made and written: its nearest existing folder
    takes a file. One UserError line naming ``what`` otherwise (a file on the way, a read-only place)."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        which = "" if existing == Path(path).absolute() else f"{existing} "
        raise UserError(f"{what}: {which}is a file, not a folder; give a folder (it is made if missing)")
    _probe_write(existing, what)
