"""Graceful stop on Ctrl-C / SIGTERM (what ``docker stop`` sends).

The first signal only sets a flag: the training loop finishes its current step, writes a
checkpoint and exits. A second signal exits at once: any atomic write in progress is abandoned
(its temporary file deleted, the previous file left whole) and the exit message says what is on
disk.

Why a watchdog thread: Python runs signal handlers only between bytecodes of the main thread,
and CPython keeps one "pending" flag per signal number, so two SIGTERMs that arrive during one
long torch op run the handler once — the second is lost. The C-level handler, however, writes
one byte per delivered signal to the wakeup fd (``signal.set_wakeup_fd``); a thread reading that
fd counts every signal, and can act while the main thread is still inside the op.
"""

import contextlib
import os
import signal
import socket
import sys
import threading

from utils.files import abandon_pending_writes
from utils.logging import LOGGER

_WATCHING = set()  # GracefulInterrupt instances whose watchdog thread is running in this process
_BEFORE_EXIT = []  # callables exit_after_interrupt runs before the process ends (a tracker marks its run KILLED)


def _after_fork_in_child() -> None:
    """A forked data-loader worker must not write its own signals into the parent's wakeup socket.

    Threads do not survive a fork, so the child's instances fall back to counting in the handler.
    """
    if _WATCHING:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
    for watcher in _WATCHING:
        watcher._watchdog = None
    _WATCHING.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def flush_output() -> None:
    """Flush the logger's handlers and the std streams (before ``os._exit``, which skips this)."""
    for handler in LOGGER.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


class GracefulInterrupt:
    """Context manager catching SIGINT and SIGTERM; ``.requested`` is the first signal's number or 0.

    ``describe_saved`` (optional) returns one line saying what is on disk; it is printed when a
    second signal makes the process exit at once.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, describe_saved=None):
        self.requested = 0
        self.count = 0
        self.describe_saved = describe_saved
        self._previous = {}
        self._lock = threading.Lock()
        self._sockets = None
        self._previous_wakeup = -1
        self._watchdog = None

    def _handle(self, signum, frame):
        """Python-level handler (main thread); the watchdog, when running, has counted already."""
        if self._watchdog is None:
            self._count(signum)

    def _count(self, signum: int) -> None:
        with self._lock:
            self.count += 1
            first = self.count == 1
            if first:
                self.requested = signum
        name = signal.Signals(signum).name
        if first:
            LOGGER.warning(f"{name} received: finishing the current step, then saving last.pt "
                           "(send it again to exit at once).")
        else:
            self._exit_now(name, 128 + signum)

    def _exit_now(self, name: str, code: int) -> None:
        """Abandon writes in progress, say what is on disk, exit without running any more Python."""
        abandoned = abandon_pending_writes()
        message = f"Second {name}: exiting now"
        if abandoned:
            message += f"; abandoned the unfinished write of {', '.join(p.name for p in abandoned)}"
        if self.describe_saved is not None:
            message += f". {self.describe_saved()}"
        LOGGER.warning(message)
        flush_output()
        os._exit(code)

    def _watch(self, reader: socket.socket) -> None:
        """Watchdog thread: one byte per delivered signal arrives on ``reader``."""
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in self.SIGNALS:
                    self._count(signum)

    def _start_watchdog(self) -> None:
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            reader.close()
            writer.close()
            return
        self._sockets = (reader, writer)
        self._watchdog = threading.Thread(target=self._watch, args=(reader,), name="signal-watchdog", daemon=True)
        self._watchdog.start()
        _WATCHING.add(self)

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. a notebook worker): leave signals alone
                return self
        self._start_watchdog()
        return self

    def __exit__(self, *exc):
        _WATCHING.discard(self)
        if self._sockets is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(self._previous_wakeup)
            reader, writer = self._sockets
            with contextlib.suppress(OSError):
                reader.shutdown(socket.SHUT_RDWR)
            self._watchdog.join(timeout=5)
            reader.close()
            writer.close()
            self._sockets, self._watchdog = None, None
        for sig, handler in self._previous.items():
            # once stopping for a signal, the process only reports and exits: a late second signal must not
            # kill it by the default handler before it says what is on disk
            signal.signal(sig, _already_stopping if self.requested else handler)
        return False

    @property
    def exit_code(self) -> int:
        """Shell convention for death by signal: 128 + signal number."""
        return 128 + self.requested if self.requested else 0


def _already_stopping(signum, frame) -> None:
    LOGGER.warning(f"{signal.Signals(signum).name} received: already stopping, reporting what is on disk")


def run_before_interrupt_exit(callback) -> None:
    """Have :func:`exit_after_interrupt` call ``callback()`` before it ends the process (which skips ``finally``)."""
    _BEFORE_EXIT.append(callback)


def forget_before_interrupt_exit(callback) -> None:
    """Undo :func:`run_before_interrupt_exit` (the block that needed it has ended)."""
    if callback in _BEFORE_EXIT:
        _BEFORE_EXIT.remove(callback)


def exit_after_interrupt(exit_code: int, saved: str, resume_command: str | None, show: bool = True) -> None:
    """Say what the interrupted run left on disk (and how to resume, if it can), then exit.

    ``saved`` is one line from :meth:`utils.training.run_state.CheckpointSaver.describe`; ``resume_command``
    is None when nothing resumable was saved.
    """
    if show:
        message = f"Training interrupted. {saved}"
        if resume_command:
            message += f"\nResume with:\n    {resume_command}"
        LOGGER.info(message)
    for callback in list(_BEFORE_EXIT):
        with contextlib.suppress(Exception):  # a failing callback must not keep the process from exiting
            callback()
    # Everything is saved and reported. Python restores the default handlers while it shuts down (slowly,
    # with torch loaded), so a late second signal would kill the process with -15 after the report: end now.
    flush_output()
    os._exit(exit_code or 1)
