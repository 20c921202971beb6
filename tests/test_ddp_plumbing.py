"""utils/ddp.py without processes: where a process sits, and the rank-0-first order."""

import pytest
import torch

from utils import ddp
from utils.ddp import DistInfo, dist_info_from_env, rank_zero_first
from utils.errors import UserError
from utils.training.lost_peer import lost_peer_line


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


def test_a_lost_peer_is_one_line_naming_the_rank_and_the_timeout():
    error = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:4311: "
                         "Connection reset by peer. This is typically caused by a remote worker hanging")
    line = lost_peer_line(error, DistInfo(rank=0, local_rank=0, world_size=2))
    assert line.startswith("rank 0 lost rank 1 at [127.0.0.1]:4311 (Connection reset by peer)")
    assert "FFCA_DDP_TIMEOUT_MIN=" in line and "\n" not in line
    assert "rank 3 lost another rank" in lost_peer_line(error, DistInfo(rank=3, local_rank=1, world_size=4))
    assert lost_peer_line(RuntimeError("out of memory"), DistInfo(rank=0, local_rank=0, world_size=2)) is None
    assert lost_peer_line(error, DistInfo()) is None  # not a DDP run


# NCCL's messages as torch's ProcessGroupNCCL words them (the NCCL error's first line, then NCCL's own detail)
NCCL_TIMEOUT = ("[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=212, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
                "1800064 milliseconds before timing out.")
NCCL_REMOTE = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, remote process exited or "
               "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
               "network error or a remote process exiting prematurely.\nLast error:\nsocketProgress: Connection "
               "closed by remote peer node-2<56202>")
NCCL_ABORTED = ("[PG ID 0 PG GUID 0(default_pg) Rank 2] NCCL communicator was aborted on rank 2. (Watchdog caught "
                "exception: remote error detected from rank: 3)")
NCCL_CUDA = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run "
             "with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
             "failed.\nLast error:\nCuda failure 'out of memory'")


@pytest.mark.parametrize("message, rank, world_size, start", [
    (NCCL_TIMEOUT, 0, 2, "rank 0 lost rank 1 (NCCL collective timed out): its process or node stopped"),
    (NCCL_REMOTE, 1, 4, "rank 1 lost another rank (NCCL remote error: a peer's process exited or the network failed)"),
    (NCCL_ABORTED, 2, 4, "rank 2 lost rank 3 (NCCL communicator aborted after an error)"),
    (NCCL_CUDA, 1, 4, "rank 1: NCCL error (unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
                      "2.21.5): a collective failed on this rank"),
])
def test_an_nccl_failure_is_one_line_too(message, rank, world_size, start):
    for error in (RuntimeError(message), torch.distributed.DistBackendError(message)):
        line = lost_peer_line(error, DistInfo(rank=rank, local_rank=rank, world_size=world_size))
        assert line.startswith(start) and "FFCA_DDP_TIMEOUT_MIN=" in line and "\n" not in line, line
        assert lost_peer_line(error, DistInfo()) is None  # not a DDP run


def test_an_nccl_configuration_error_keeps_its_traceback():
    error = RuntimeError("ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
    assert lost_peer_line(error, DistInfo(rank=0, local_rank=0, world_size=2)) is None
