"""Graceful stop on Ctrl-C, SIGTERM (what ``docker stop`` and a scheduler send) and SIGUSR1 (a scheduler's
warning before the time limit, e.g. SLURM's ``--signal=USR1@120``).

The first signal only sets a flag: the training loop finishes its current step, writes a
checkpoint and exits with 128 + the signal (130, 143, 138). A second signal exits at once: any atomic
write in progress is abandoned (its temporary file deleted, the previous file left whole) and the exit
message says what is on disk.

Signals to the whole process group (``kill -- -PGID``, SLURM, systemd) reach the data-loader workers too.
Only the main process may act on them: a worker ignores them (:func:`leave_stop_signals_to_the_main_process`),
and holds them blocked from its fork until then (:func:`stop_signals_held`), so none dies before the main
process has saved. On the way out the main process ends its workers itself (:func:`exit_after_interrupt`).

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
import threading

from utils.files import abandon_pending_writes
from utils.logging import LOGGER
from utils.stop_signals import STOP_SIGNALS, end_worker_processes, flush_output
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


class GracefulInterrupt:
    """Context manager catching :data:`STOP_SIGNALS`; ``.requested`` is the first signal's number or 0.

    ``describe_saved`` (optional) returns one line saying what is on disk; it is printed when a
    second signal makes the process exit at once.

    ``launcher_passes_signals_on``: the process is a torchrun worker. torchrun passes each signal it gets on
    to its workers, and SLURM or systemd signal every process of the job, so a worker receives one stop
    twice; a repeat of the first signal is then not a second signal (a different one still is).
    """

    SIGNALS = STOP_SIGNALS

    def __init__(self, describe_saved=None, launcher_passes_signals_on: bool = False):
        self.requested = 0
        self.count = 0
        self.describe_saved = describe_saved
        self.launcher_passes_signals_on = launcher_passes_signals_on
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
            passed_on = self.launcher_passes_signals_on and signum == self.requested
            if not passed_on:
                self.count += 1
                if self.count == 1:
                    self.requested = signum
            first = self.count == 1 and not passed_on
        name = signal.Signals(signum).name
        if passed_on:
            LOGGER.info(f"{name} again, passed on by torchrun: still finishing the step and saving")
        elif first:
            again = "a different signal" if self.launcher_passes_signals_on else "it again"
            LOGGER.warning(f"{name} received: finishing the current step, then saving last.pt "
                           f"(send {again} to exit at once).")
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


@contextlib.contextmanager
def stop_signals_held():
    """Block :data:`STOP_SIGNALS` in this thread while it starts data-loader workers.

    A forked worker starts with its parent thread's mask, so a signal to the whole process group waits in
    it, instead of killing it, until :func:`leave_stop_signals_to_the_main_process` has made it ignore
    them. The process itself still gets the signal at once: the kernel hands it to a thread that does not
    block it, and the C handler wakes the watchdog.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks, and no process-group signals either
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def leave_stop_signals_to_the_main_process() -> None:
    """In a data-loader worker: ignore :data:`STOP_SIGNALS`, then unblock them (:func:`stop_signals_held`).

    The main process stops the run after saving; a worker that died of the signal first would make the
    loader raise "DataLoader worker ... is killed by signal" in the middle of the step. A worker still
    ends with the main process: it is ended by :func:`exit_after_interrupt`, or by the loader's shutdown,
    or it notices its parent is gone (torch checks every 5 s).
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


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
    end_worker_processes()
    flush_output()
    os._exit(exit_code or 1)
