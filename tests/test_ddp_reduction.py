"""The DDP gradient hook on 2, 3 and 4 gloo ranks: every element is exactly (rank 0 + rank 1 + ...) / W.

Each rank builds every rank's bucket from seeds, so it knows the rank-ordered mean without communicating
and can require the hook's result bit for bit, on bucket sizes that do not divide by W, tiny and empty.
One spawn of 4 ranks checks every W: the whole world (DDP's default group, as training uses it) and the
subgroups of its first 3 and first 2 ranks (the hook's ``process_group`` argument); starting the ranks
costs far more than the checks.
"""

import pytest
import torch
import torch.distributed as dist

from tests.support.gloo_ranks import run_on_ranks
from utils.ddp import rank_ordered_mean_hook

BUCKET_SIZES = (0, 1, 2, 3, 5, 7, 64, 1001, 65_537)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
BIT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float64: torch.int64}


class FakeBucket:
    """What the hook reads from DDP's GradBucket: its flat gradient buffer."""

    def __init__(self, buffer: torch.Tensor):
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


def rank_gradients(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s bucket: magnitudes spread over 2^-10..2^10, so the order of the additions shows."""
    generator = torch.Generator().manual_seed(1000 * numel + rank)
    values = torch.randn(numel, generator=generator, dtype=torch.float64)
    scales = torch.randint(-10, 11, (numel,), generator=generator).to(torch.float64).exp2()
    return (values * scales).to(dtype)


def mean_in_order(parts: list, world_size: int) -> torch.Tensor:
    total = parts[0].clone()
    for part in parts[1:]:
        total.add_(part)
    return total.div_(world_size)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(BIT_VIEW[tensor.dtype])


def check_hook_on_rank(rank: int, world_size: int, group=None) -> None:
    order_shows = False
    for dtype in DTYPES:
        for numel in BUCKET_SIZES:
            parts = [rank_gradients(r, numel, dtype) for r in range(world_size)]
            expected = mean_in_order(parts, world_size)
            buffer = parts[rank].clone()
            result = rank_ordered_mean_hook(group, FakeBucket(buffer)).wait()
            assert result.data_ptr() == buffer.data_ptr() or numel == 0, "the mean must land in the bucket's buffer"
            assert torch.equal(bits(buffer), bits(expected)), (rank, world_size, dtype, numel)
            order_shows |= not torch.equal(bits(mean_in_order(parts[::-1], world_size)), bits(expected))
    # positive control: with three ranks or more, these values sum differently in another order
    assert order_shows or world_size == 2


def check_all_reduce_differs(rank: int, world_size: int, group=None) -> None:
    """gloo's own all-reduce on the largest bucket is not the rank-ordered sum: the comparison above can fail."""
    numel = BUCKET_SIZES[-1]
    parts = [rank_gradients(r, numel, torch.float32) for r in range(world_size)]
    summed = parts[rank].clone()
    dist.all_reduce(summed, group=group)
    assert not torch.equal(bits(summed.div_(world_size)), bits(mean_in_order(parts, world_size)))


def check_every_world_size(rank: int, world_size: int) -> None:
    """The hook on the whole world, then on the subgroups of its first 3 and 2 ranks (group rank = rank), and the
    positive control on 3 ranks."""
    first = {size: dist.new_group(list(range(size))) for size in (3, 2)}  # every rank takes part in new_group
    check_hook_on_rank(rank, world_size)
    for size, group in first.items():
        if rank < size:
            check_hook_on_rank(rank, size, group)
    if rank < 3:
        check_all_reduce_differs(rank, 3, first[3])


@pytest.mark.slow
def test_hook_gives_the_rank_ordered_mean_bit_for_bit_on_2_3_and_4_ranks(tmp_path):
    run_on_ranks(check_every_world_size, 4, tmp_path)
