"""The one exception type for mistakes a user can fix (a bad flag, file or value).

Entry scripts catch :class:`UserError` and print its message as a single line
instead of a traceback; library code raises it whenever the cause is in the
user's input rather than in the program.
"""

import sys


def first_line(error: BaseException, limit: int = 200) -> str:
    """An exception's first message line, at most ``limit`` characters (its type name when it has no message)."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


class UserError(Exception):
    """A problem in the user's input; the message names the file/flag/value and the fix."""


class OutOfMemory(Exception):
    """A step did not fit in memory; the message names the step, batch size, image size and device and what to
    try. Not the user's mistake in the strict sense, so it exits 1, not 2 (see utils/out_of_memory.py)."""


class NonFiniteLoss(Exception):
    """A batch's loss was NaN or infinite and ``--nan-policy stop`` ended the run; the message says where, what
    is on disk and what to try. Exits 1, as running out of memory does."""


def exit_on_user_error(func):
    """Run ``func(*args, **kwargs)``; turn a UserError into one ``ERROR:`` line and exit code 2, and running
    out of memory or a non-finite loss into one ``ERROR:`` line and exit code 1."""

    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            sys.exit(2)
        except (OutOfMemory, NonFiniteLoss) as e:
            print(f"ERROR: {e}", file=sys.stderr)
            sys.exit(1)

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper
