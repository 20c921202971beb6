"""A new DDP run decides AMP once for every rank: a rank whose check fails turns AMP off on all of them."""

import json
from pathlib import Path

import pytest
import torch.nn as nn

from tests.support.gloo_ranks import run_on_ranks
from utils.ddp import DistInfo
from utils.training import amp as amp_module
from utils.training.amp import amp_for_run

# each rank's check_amp result, per case
CHECKS_BY_RANK = [(True, False), (False, True), (True, True), (False, False)]


def decide_on_rank(rank: int, world_size: int, out_dir: str) -> None:
    decisions = []
    for checks in CHECKS_BY_RANK:
        amp_module.check_amp = lambda model, passed=checks[rank]: passed  # this process only
        decisions.append(amp_for_run(nn.Conv2d(3, 4, 1), None, DistInfo(rank, rank, world_size)))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(decisions))


@pytest.mark.slow
def test_ranks_that_disagree_on_the_amp_check_all_train_in_fp32(tmp_path):
    run_on_ranks(decide_on_rank, 2, tmp_path, str(tmp_path))
    by_rank = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert by_rank[0] == by_rank[1] == [all(checks) for checks in CHECKS_BY_RANK]


def test_one_failed_check_is_one_warning_on_rank_zero(monkeypatch, log_lines):
    monkeypatch.setattr(amp_module, "check_amp", lambda model: True)
    monkeypatch.setattr(amp_module, "gather_objects", lambda passed, info: [passed, False, passed])
    assert amp_for_run(nn.Conv2d(3, 4, 1), None, DistInfo(2, 2, 3)) is False
    assert not log_lines  # the other ranks decide alike without repeating the line
    assert amp_for_run(nn.Conv2d(3, 4, 1), None, DistInfo(0, 0, 3)) is False
    assert [line.split("AMP: ")[-1] for line in log_lines] == [
        "the check failed on rank(s) 1; every rank trains in fp32"]
