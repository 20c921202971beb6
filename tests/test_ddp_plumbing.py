"""utils/ddp.py without processes: where a process sits, and the rank-0-first order."""

import pytest

from utils import ddp
from utils.ddp import DistInfo, dist_info_from_env, rank_zero_first
from utils.errors import UserError


def test_dist_info_reads_torchrun_variables(monkeypatch):
    for key, value in (("WORLD_SIZE", "4"), ("RANK", "3"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(key, value)
    info = dist_info_from_env()
    assert (info.rank, info.local_rank, info.world_size, info.enabled, info.is_main) == (3, 1, 4, True, False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert dist_info_from_env() == DistInfo() and DistInfo().is_main and not DistInfo().enabled


@pytest.mark.parametrize("rank, expected", [(0, ["body", "barrier"]), (1, ["barrier", "body"])])
def test_rank_zero_runs_the_block_first(monkeypatch, rank, expected):
    events = []
    monkeypatch.setattr(ddp, "barrier", lambda info: events.append("barrier"))
    with rank_zero_first(DistInfo(rank=rank, local_rank=rank, world_size=2)):
        events.append("body")
    assert events == expected


def test_total_batch_must_divide_over_the_ranks():
    assert ddp.check_ddp_batch(8, 2) == 4
    with pytest.raises(UserError, match="--batch-size 5 must be a multiple of the world size 2"):
        ddp.check_ddp_batch(5, 2)
    with pytest.raises(UserError, match="--batch-size -1"):
        ddp.check_ddp_batch(-1, 2)
