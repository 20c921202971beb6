"""Run an entry script's command line with a stop signal sent to itself at a chosen point (tests/test_stop_signals.py).

    python tests/support/stop_launcher.py SCRIPT MODULE:FUNCTION SIGNAL arguments...

SCRIPT is train, val or detect. MODULE.FUNCTION is replaced by a wrapper that sends SIGNAL (INT, TERM or USR1) to
this process, then calls the original: Python runs the handler right after ``os.kill`` returns, so the signal
lands in that function, every time, however busy the machine is.
"""

import importlib
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def signal_on_call(target: str, signum: int) -> None:
    module_name, function_name = target.split(":")
    module = importlib.import_module(module_name)
    original = getattr(module, function_name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return original(*args, **kwargs)

    setattr(module, function_name, signalled)


if __name__ == "__main__":
    script, target, name, *arguments = sys.argv[1:]
    entry = importlib.import_module(script)
    signal_on_call(target, getattr(signal, f"SIG{name}"))
    sys.argv = [f"{script}.py", *arguments]
    entry.cli()
