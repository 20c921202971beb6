"""Ctrl-C, SIGTERM and SIGUSR1 outside the training loop: one line and exit code 128 + the signal, no traceback.

The training loop stops gracefully by itself (utils/training/interrupts.py: it finishes the step and saves).
Everywhere else (start-up, the audit, the data scan, the final validation, plots, val.py and detect.py) an entry
script's ``cli`` runs under :func:`exit_on_stop_signal`: a stop signal raises :class:`StopSignal` (a
``KeyboardInterrupt``) in the main thread, so every ``with`` block and ``finally`` on the way out runs (atomic
writes delete their temporary files, the run folder's lock is released, a video file is closed). Then the script
prints one line, ends its data-loader workers and exits with 130 (SIGINT), 143 (SIGTERM) or 138 (SIGUSR1), as a
process killed by that signal would. Code that knows what is on disk names it with :func:`stop_stage`.

Why ``os._exit`` at the end: a loader stopped while it started its workers is left half made; a normal exit
would print its destructor's traceback, and wait forever for workers that ignore SIGTERM (they leave stop
signals to the main process). Nothing is left to write by then.
"""

import contextlib
import multiprocessing
import os
import signal
import sys
from functools import wraps

from utils.env_vars import read
from utils.logging import LOGGER

# SIGUSR1 is missing on Windows
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))


class StopSignal(KeyboardInterrupt):
    """A stop signal received outside the training loop, raised in the main thread."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop_signal(signum, frame):
    raise StopSignal(signum)


def _set_handlers(handler) -> dict:
    """Install ``handler`` for every stop signal; returns the previous ones ({} off the main thread)."""
    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: signals are the main thread's business
            break
    return previous


def flush_output() -> None:
    """Flush the logger's handlers and the std streams (before ``os._exit``, which skips this)."""
    for handler in LOGGER.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def end_worker_processes() -> None:
    """End this process's daemonic children (data-loader workers) before ``os._exit``.

    A normal interpreter exit terminates them with SIGTERM; ``os._exit`` skips that, and they ignore SIGTERM
    anyway. torch's SIGCHLD handler would report their end as a failed worker, so it is reset first; that is
    possible on the main thread only, elsewhere the workers are left to notice their parent is gone.
    """
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except (AttributeError, ValueError):  # no SIGCHLD (Windows), or not the main thread
        return
    workers = [child for child in multiprocessing.active_children() if child.daemon]
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join(timeout=5)


def _prints_for_the_job() -> bool:
    """Under torchrun every rank gets the signal; rank 0 speaks for the job."""
    return read("RANK") <= 0  # -1 when unset: no torchrun


def _program(program: str) -> str:
    return program[:1].upper() + program[1:]


@contextlib.contextmanager
def stop_stage(describe):
    """Name what a stop in this block leaves: ``describe()`` (or the string ``describe``) is the rest of the
    line, e.g. 'before its first step; no checkpoint was written'. The innermost stage wins."""
    try:
        yield
    except KeyboardInterrupt as e:
        if getattr(e, "stage", None) is None:
            e.stage = describe() if callable(describe) else describe
        raise


def stop_line(program: str, error: KeyboardInterrupt) -> str:
    """``Training stopped by SIGTERM <stage>.``: the one line printed for ``error``."""
    name = signal.Signals(getattr(error, "signum", signal.SIGINT)).name
    stage = getattr(error, "stage", None) or "before it finished"
    return f"{_program(program)} stopped by {name} {stage.rstrip('.')}."


def exit_on_stop_signal(program: str):
    """Decorator for an entry script's ``cli``: a stop signal during it is one line on stderr and exit code
    128 + the signal, ending the process (see the module's docstring). Otherwise the handlers are put back and
    ``cli`` returns or raises as before."""

    def decorate(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            previous = _set_handlers(_raise_stop_signal)
            try:
                return func(*args, **kwargs)
            except KeyboardInterrupt as e:
                _set_handlers(signal.SIG_IGN)  # a second Ctrl-C from here on must not print a traceback
                if _prints_for_the_job():
                    print(stop_line(program, e), file=sys.stderr)
                end_worker_processes()
                flush_output()
                os._exit(128 + getattr(e, "signum", signal.SIGINT))
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        return wrapper

    return decorate
