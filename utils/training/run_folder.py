"""A training run's folder: created once every check has passed, and held by one training process.

Two processes writing the same run folder interleave their rows in ``results.csv`` and overwrite each
other's ``last.pt``; neither run can then be trusted or resumed exactly. That happens easily: a bare
``train.py --resume`` picks the newest ``last.pt``, which is the run still training in the other
terminal, and ``--exist-ok`` reuses a folder whatever is writing in it.

The main process of a run holds an exclusive ``flock`` on ``<run>/.train.lock`` from the moment it
creates the folder until ``train`` returns. The kernel drops the lock when the process dies, SIGKILL
included, so an interrupted run never leaves a stale lock behind. A forked child (a data loader worker)
would share the lock and keep it past the training's death, so children close their copy at fork. The
file keeps the holder's pid for the message. Platforms without ``fcntl`` (Windows) train without the check.
"""

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

from utils.determinism.env import environment_report
from utils.errors import UserError
from utils.files import ensure_writable_dir, increment_path, unwritable, yaml_save
from utils.logging import LOGGER
from utils.training.run_state import plain_opt

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_NAME = ".train.lock"
_HELD = set()  # descriptors of the locks this process holds; a forked child closes its copies


def _close_held_in_child() -> None:
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def _try_lock(fd: int) -> bool | None:
    """True: locked now; False: another process holds it; None: this file system cannot lock (an NFS mount
    without a lock daemon, some FUSE mounts)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _pid_in(fd: int) -> int:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else 0  # 0: the holder has not written its pid yet


def holder_pid(folder) -> int | None:
    """The pid of the process training in run folder ``folder`` (0 when not yet known), or None when no
    process holds it."""
    lock = Path(folder) / LOCK_NAME
    if fcntl is None or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # unreadable: the folder's permissions decide, as they did before this check
        return None
    try:
        locked = _try_lock(fd)
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return _pid_in(fd) if locked is False else None
    finally:
        os.close(fd)


def in_use(folder, pid: int) -> str:
    return f"{folder} is in use: {f'process {pid}' if pid else 'another process'} is training in it"


WAIT_OR_STOP = "wait for that run to end, or stop it (Ctrl-C or SIGTERM saves a resumable last.pt)"


def check_run_folder_free(folder, where: str) -> None:
    """One UserError line, naming ``where`` (the flag), when another process is training in ``folder``."""
    pid = holder_pid(folder)
    if pid is not None:
        raise UserError(f"{where}: {in_use(folder, pid)}; {WAIT_OR_STOP}")


@contextmanager
def hold_run_folder(folder, where: str):
    """Hold run folder ``folder`` (which must exist) for this process until the block ends; one UserError
    line, naming ``where`` (the flag), when another process holds it."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise unwritable(where, folder, e) from None
    try:
        locked = _try_lock(fd)
        if locked is False:
            raise UserError(f"{where}: {in_use(folder, _pid_in(fd))}; {WAIT_OR_STOP}")
        if locked is None:
            LOGGER.warning(f"{folder}: this file system cannot lock files, so nothing stops a second training "
                           "from writing in this run folder; start one run per folder")
            yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _HELD.add(fd)
        try:
            yield
        finally:
            _HELD.discard(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def latest_checkpoint(search_dir: Path) -> Path:
    """The most recently written last.pt under ``search_dir`` (a bare ``--resume``), unless a process is still
    training that run: then one UserError line naming it and the newest run that could be resumed instead."""
    candidates = sorted(search_dir.glob("**/last.pt"), key=os.path.getmtime)
    if not candidates:
        raise UserError(f"--resume: no last.pt found under {search_dir}; pass the checkpoint path explicitly")
    newest = candidates[-1]
    pid = holder_pid(newest.parent.parent)
    if pid is None:
        return newest
    idle = [c for c in candidates[:-1] if holder_pid(c.parent.parent) is None]
    advice = f"to resume another run, name it, e.g. --resume {idle[-1]}" if idle else WAIT_OR_STOP
    raise UserError(f"--resume: the newest last.pt is {newest}, but {in_use(newest.parent.parent, pid)}; {advice}")


def claim_new_folder(chosen: Path, base: Path) -> Path:
    """Make run folder ``chosen``, the name ``increment_path`` picked from ``base`` at start-up, and return it. When
    another run made it in between (several runs launched at once pick the same name), the next free name after
    ``base``. Where nothing can be made, ``chosen`` unmade: the folder's write check then says why in one line."""
    folder = chosen
    for _ in range(100):
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            folder = increment_path(base)
        except OSError:
            break
    return folder


@contextmanager
def created_run_folder(save_dir: Path, where: str, hyp: dict, opt: dict):
    """Run folder ``save_dir`` with hyp.yaml, opt.yaml (``opt`` as plain data) and environment.yaml, what reruns
    or explains the run, held by this process until the block ends. An unwritable folder, or one another process
    trains in, is one UserError line naming ``where`` (the flag) before anything in it changes."""
    ensure_writable_dir(save_dir / "weights", where)
    with hold_run_folder(save_dir, where):
        yaml_save(save_dir / "hyp.yaml", hyp)
        yaml_save(save_dir / "opt.yaml", opt)
        yaml_save(save_dir / "environment.yaml", environment_report())
        yield


def claim_run_folder(opt) -> Path:
    """Training options ``opt``'s run folder: a new run's made now, under the name chosen at start-up or, if a run
    started beside this one took that since, the next free one (``opt.save_dir`` follows). A resume, ``--exist-ok``
    and an evolve generation keep their folder."""
    if not (opt.resume or opt.exist_ok or opt.evolve):
        opt.save_dir = str(claim_new_folder(Path(opt.save_dir), Path(opt.project) / opt.name))
    return Path(opt.save_dir)


def held_run_folder(opt, hyp: dict, is_main: bool):
    """``opt.save_dir`` created and held by the main process for a ``with`` block (:func:`created_run_folder`);
    the other ranks write nothing there."""
    if not is_main:
        return nullcontext()
    where = f"--resume {opt.resume}" if opt.resume else f"--project {opt.project} --name {opt.name}"
    return created_run_folder(Path(opt.save_dir), where, hyp, plain_opt(opt))
