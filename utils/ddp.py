"""DistributedDataParallel plumbing for ``torchrun`` launches (NCCL on CUDA, gloo on CPU)."""

import datetime
import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from utils.env_vars import read
from utils.errors import UserError
from utils.logging import LOGGER


def process_group_timeout() -> datetime.timedelta:
    """``FFCA_DDP_TIMEOUT_MIN`` (default 30): a rank that dies must not leave the others waiting forever."""
    return datetime.timedelta(minutes=read("FFCA_DDP_TIMEOUT_MIN"))


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: ``rank == -1`` means no DDP."""

    rank: int = -1
    local_rank: int = -1
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank in (-1, 0)

    @property
    def enabled(self) -> bool:
        return self.rank != -1


def dist_info_from_env(local_rank_flag: int = -1) -> DistInfo:
    """Read ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set by torchrun (``--local_rank`` as fallback)."""
    world_size = read("WORLD_SIZE")
    if world_size <= 1:
        return DistInfo()
    local_rank, rank = read("LOCAL_RANK"), read("RANK")
    local_rank = local_rank if local_rank >= 0 else local_rank_flag
    rank = rank if rank >= 0 else local_rank
    if rank >= world_size:
        raise UserError(f"RANK={rank} with WORLD_SIZE={world_size}: a rank counts from 0 to WORLD_SIZE - 1; "
                        "start the job with torchrun, which sets both")
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size)


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets ``TORCHELASTIC_RUN_ID``), whatever the world size."""
    return bool(read("TORCHELASTIC_RUN_ID"))


def check_ddp_batch(batch_size: int, world_size: int) -> int:
    """Total ``--batch-size`` → per-rank batch size; it must divide evenly by the world size."""
    if batch_size == -1:
        raise UserError("--batch-size -1 (AutoBatch) is not supported with DDP; give a total batch size "
                        f"that is a multiple of the world size {world_size}")
    if batch_size % world_size:
        raise UserError(f"--batch-size {batch_size} must be a multiple of the world size {world_size} "
                        f"(e.g. {max(world_size, batch_size // world_size * world_size)})")
    return batch_size // world_size


def per_rank_batch_size(opt, info: DistInfo) -> int:
    """The batch each process loads: ``opt.batch_size`` (the total) divided over the ranks (checked for --quad)."""
    per_rank = check_ddp_batch(opt.batch_size, info.world_size) if info.enabled else opt.batch_size
    if opt.quad and per_rank % 4:
        raise UserError(f"--quad needs a per-device batch size divisible by 4, got {per_rank}")
    return per_rank


def init_process_group(info: DistInfo, device: torch.device) -> None:
    """Start the process group: NCCL for CUDA devices, gloo for CPU, with a bounded timeout.

    From here on only rank 0 logs at INFO, so the job prints one copy of the run's progress."""
    timeout = process_group_timeout()
    backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    if not info.is_main:
        LOGGER.setLevel(logging.WARNING)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=timeout)


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op without DDP)."""
    if info.enabled and dist.is_initialized():
        dist.barrier()


@contextmanager
def rank_zero_first(info: DistInfo):
    """Run the block on rank 0 first (e.g. to build a cache), then on the other ranks."""
    if not info.is_main:
        barrier(info)
    yield
    if info.is_main:
        barrier(info)


def broadcast_object(obj, info: DistInfo, src: int = 0):
    """Send ``obj`` (picklable plain data) from rank ``src`` to every rank."""
    if not (info.enabled and dist.is_initialized()):
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def gather_objects(obj, info: DistInfo) -> list:
    """``obj`` (picklable plain data) from every rank, in rank order, on every rank; ``[obj]`` without DDP."""
    if not (info.enabled and dist.is_initialized()):
        return [obj]
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


@contextmanager
def refused_alike(info: DistInfo):
    """Around a check every rank makes alike (the world size, the batch size): a UserError it raises is printed
    once, by rank 0, and every rank exits with 2 once rank 0 has printed it (no time depends on it: a
    barrier). Without a process group the error goes on to the caller."""
    try:
        yield
    except UserError as e:
        if not (info.enabled and dist.is_initialized()):
            raise
        if info.is_main:
            print(f"ERROR: {e}", file=sys.stderr, flush=True)
        dist.barrier()
        raise SystemExit(2) from None


def destroy_process_group(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def max_over_ranks(values: list, info: DistInfo) -> list:
    """Each integer's (or flag's) maximum over all ranks, so every rank stops or saves at the same batch
    and knows which signal stopped it."""
    if not (info.enabled and dist.is_initialized()):
        return [int(v) for v in values]
    tensor = torch.tensor([int(v) for v in values], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def rank_ordered_mean_hook(process_group, bucket):
    """DDP communication hook: each element's mean over the ranks, summed in rank order, for all-reduce traffic.

    DDP's default all-reduce sums a bucket's elements in an order set by where each element sits in
    the bucket, and DDP lays its buckets out anew after the first iteration of every DDP object.
    A resumed run builds a fresh DDP, so its first step sums on the initial layout while the
    uninterrupted run is already on the rebuilt one; with three or more ranks ``(a + b) + c`` and
    ``a + (b + c)`` differ in the last bit. NCCL may also pick ring, tree or NVLS by message size.
    Here every element is ``(rank 0 + rank 1 + ... + rank W-1) / W``, added left to right in the
    bucket's dtype, whatever the layout, algorithm or topology.

    Each rank owns one shard of the bucket (padded to a multiple of W): an all-to-all brings it every
    rank's copy of that shard, the rank adds them in rank order, and an all-gather returns the means
    to every rank. Each rank sends ``2 (W-1)/W`` of the bucket, as a ring all-reduce does, and holds
    at most two bucket-sized buffers besides the bucket. The all-to-all is waited for inside the hook
    so that every rank issues its collectives in DDP's bucket order (on CUDA that wait is a stream
    dependency, not a host stall).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    world_size = dist.get_world_size(group)
    grads = bucket.buffer()
    if grads.numel() == 0:
        done = torch.futures.Future()
        done.set_result(grads)
        return done
    shard = -(-grads.numel() // world_size)
    padded = grads if grads.numel() == shard * world_size else padded_copy(grads, shard * world_size)
    copies = torch.empty_like(padded)
    dist.all_to_all_single(copies, padded, group=group)
    rank_copies = copies.view(world_size, shard)
    mean = rank_copies[0]
    for copy in rank_copies[1:]:
        mean.add_(copy)
    mean.div_(world_size)
    work = all_gather_single(padded, mean, group, async_op=True)

    def into_bucket(_):
        if padded is not grads:
            grads.copy_(padded[:grads.numel()])
        return grads

    return work.get_future().then(into_bucket)


def padded_copy(flat: torch.Tensor, numel: int) -> torch.Tensor:
    """``flat`` followed by zeros up to ``numel`` elements."""
    padded = flat.new_zeros(numel)
    padded[:flat.numel()].copy_(flat)
    return padded


def all_gather_single(output: torch.Tensor, shard: torch.Tensor, group, async_op: bool):
    """Every rank's ``shard`` concatenated into ``output``: torch 2.14's name for ``all_gather_into_tensor``,
    which it deprecates; older torch (>= 2.3) has only the old name."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, shard, group=group, async_op=async_op)
