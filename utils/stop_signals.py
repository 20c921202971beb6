"""Ctrl-C, SIGTERM and SIGUSR1 outside the training loop: one line and exit code 128 + the signal, no traceback.

The training loop stops gracefully by itself (utils/training/interrupts.py: it finishes the step and saves).
Everywhere else (imports, start-up, the audit, the data scan, the final validation, plots, val.py and detect.py)
an entry script's ``cli`` runs under :func:`exit_on_stop_signal`: a stop signal raises :class:`StopSignal` (a
``KeyboardInterrupt``) in the main thread, so every ``with`` block and ``finally`` on the way out runs (atomic
writes delete their temporary files, the run folder's lock is released, a video file is closed), then the
script prints one line and exits with 130 (SIGINT), 143 (SIGTERM) or 138 (SIGUSR1), as a process killed by
that signal would. Code that knows what is on disk names it with :func:`stop_stage`.
"""

import contextlib
import os
import signal
import sys
from functools import wraps

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


def _prints_for_the_job() -> bool:
    """Under torchrun every rank gets the signal; rank 0 speaks for the job."""
    return os.environ.get("RANK", "0") == "0"


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
    128 + the signal (see the module's docstring). Other outcomes, and the handlers, are as before."""

    def decorate(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            previous = _set_handlers(_raise_stop_signal)
            try:
                return func(*args, **kwargs)
            except KeyboardInterrupt as e:
                _set_handlers(signal.SIG_IGN)  # a second Ctrl-C while Python shuts down must not print a traceback
                previous = {}
                if _prints_for_the_job():
                    print(stop_line(program, e), file=sys.stderr, flush=True)
                sys.exit(128 + getattr(e, "signum", signal.SIGINT))
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        return wrapper

    return decorate
