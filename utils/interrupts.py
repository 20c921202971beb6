"""Graceful stop on Ctrl-C / SIGTERM (what ``docker stop`` sends).

The first signal only sets a flag: the training loop finishes its current step, writes a
checkpoint and exits. A second signal exits immediately.
"""

import os
import signal
import sys

from utils.logging import LOGGER


class GracefulInterrupt:
    """Context manager catching SIGINT and SIGTERM; ``.requested`` is the signal number or 0."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = 0
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested:
            LOGGER.warning(f"Second {signal.Signals(signum).name}: exiting immediately without saving.")
            os._exit(128 + signum)
        self.requested = signum
        LOGGER.warning(f"{signal.Signals(signum).name} received: finishing the current step, then saving "
                       "last.pt (send it again to exit immediately).")

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. a notebook worker): leave signals alone
                pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    @property
    def exit_code(self) -> int:
        """Shell convention for death by signal: 128 + signal number."""
        return 128 + self.requested if self.requested else 0


def exit_after_interrupt(exit_code: int, resume_command: str, show: bool = True) -> None:
    """Print how to resume (on the main process) and exit with the signal's exit code."""
    if show:
        LOGGER.info(f"Training interrupted; last.pt is saved. Resume with:\n    {resume_command}")
    sys.exit(exit_code or 1)
