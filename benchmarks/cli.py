"""The benchmark commands parse like the entry scripts: every flag is checked before any data is generated
or any worker starts, and a bad one is one ``ERROR:`` line with exit code 2 (utils/options.py's checker).

Each command builds a :class:`utils.options.OneLineErrorParser`, lists what its numeric flags must satisfy
in an :class:`utils.options.OptionRules`, and starts with ``parse_checked(parser, RULES, argv)``;
tests/test_benchmark_flags.py walks every command with one bad value per numeric flag.
:func:`map_in_workers` reports an error raised in a worker process as one line too.
"""

import ctypes
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor

from utils.errors import UserError
from utils.options import OneLineErrorParser, OptionRules, check_options


def parser_for(module: str, description: str, **kwargs) -> OneLineErrorParser:
    """The parser of ``python -m <module>``: a bad flag is one ERROR line naming the flag."""
    return OneLineErrorParser(prog=f"python -m {module}", description=description, **kwargs)


def parse_checked(parser, rules: OptionRules, argv=None):
    """Parse ``argv`` and check it against ``rules``; the first bad flag is one UserError line."""
    return check_options(parser.parse_args(argv), rules)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def request_stop_with_parent() -> None:
    """SIGTERM this process when its parent dies, SIGKILL included (Linux; elsewhere nothing). Also the
    ``preexec_fn`` of a benchmark's child commands, so that none trains on after the benchmark was killed."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_with_parent(parent_pid: int) -> None:
    """Worker initializer: :func:`request_stop_with_parent`. Without it, killing a matrix left its workers training
    on, beside the rerun, in the same run folders. The SIGTERM lets a training worker save a resumable last.pt."""
    request_stop_with_parent()
    if os.getppid() != parent_pid:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def map_in_workers(func, items: list, jobs: int) -> list:
    """``[func(item) for item in items]`` in ``jobs`` spawned processes, which stop when this process dies; an error
    raised in one is one line."""
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=stop_with_parent,
                             initargs=(os.getpid(),)) as pool:
        try:
            return list(pool.map(func, items))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 -- whatever a worker raised: one line, not its traceback
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UserError(f"a worker failed: {type(e).__name__}: {first}") from None
