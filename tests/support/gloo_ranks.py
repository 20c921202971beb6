"""Running one function on W gloo ranks on this machine: processes sharing a file store."""

import datetime
import multiprocessing
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)  # a rank that hangs fails the test instead of stalling it
# The ranks fork from a fresh server process that imported torch once (a forkserver, started on first use and
# kept): a spawned rank imports torch again, about 2 s of CPU each. The server forks before any thread starts.
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "tests.support.gloo_ranks"])


def _rank_main(rank: int, world_size: int, store: str, fn, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, world_size: int, tmp_dir: Path, *args) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes joined in one gloo group.

    ``fn`` must be importable (a module-level function); an exception in any rank fails the call with
    that rank's traceback."""
    store = Path(tmp_dir) / f"gloo_store_{world_size}"
    mp.start_processes(_rank_main, args=(world_size, str(store), fn, args), nprocs=world_size, join=True,
                       start_method="forkserver")
