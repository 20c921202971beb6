"""Run an entry script's command line with a stop signal sent to itself at a chosen point (tests/test_stop_signals.py).

    python tests/support/stop_launcher.py SCRIPT MODULE:FUNCTION SIGNAL arguments...

SCRIPT is train, val or detect. MODULE.FUNCTION is replaced by a wrapper that sends SIGNAL (INT, TERM or USR1) to
this process, then calls the original: Python runs the handler right after ``os.kill`` returns, so the signal
lands in that function, every time, however busy the machine is. SIGNAL ``raise`` raises KeyboardInterrupt there
instead, as Python's handler does: for a point where signals are blocked (a loader starting its workers), which a
real Ctrl-C still reaches through another thread.
"""

import importlib
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def signal_on_call(target: str, name: str) -> None:
    module_name, function_name = target.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, function_name)

    def signalled(*args, **kwargs):
        if name == "raise":
            raise KeyboardInterrupt
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
        return original(*args, **kwargs)

    setattr(module, function_name, signalled)


if __name__ == "__main__":
    script, target, name, *arguments = sys.argv[1:]
    entry = importlib.import_module(script)
    signal_on_call(target, name)
    sys.argv = [f"{script}.py", *arguments]
    entry.cli()
