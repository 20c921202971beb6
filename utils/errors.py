"""The one exception type for mistakes a user can fix (a bad flag, file or value).

Entry scripts catch :class:`UserError` and print its message as a single line
instead of a traceback; library code raises it whenever the cause is in the
user's input rather than in the program.
"""

import sys


class UserError(Exception):
    """A problem in the user's input; the message names the file/flag/value and the fix."""


def exit_on_user_error(func):
    """Run ``func(*args, **kwargs)``; turn a UserError into one ``ERROR:`` line and exit code 2."""

    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as e:
            print(f"ERROR: {e}", file=sys.stderr)
            sys.exit(2)

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper
