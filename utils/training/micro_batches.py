"""World-size invariance (``--micro-batch N``): one run gives the same bits on 1, 2, 4 ... processes.

A step's global batch (``--batch-size`` images, cut from the epoch order before any sharding) is split
into micro-batches of ``N`` images; rank ``r`` of ``W`` takes a contiguous run of them. Everything that
a process count could change is fixed by the micro-batches instead:

- **Gradients**: each micro-batch's gradient is kept apart and all are summed in one fixed balanced
  binary tree over the step's micro-batches (:func:`tree_sum`). A rank sums its own contiguous subtree;
  the ranks' partial sums finish the same tree. With ``W`` a power of two dividing the number of
  micro-batches, each rank's share is a complete subtree, so the additions are the same for every ``W``.
- **BatchNorm**: normalisation is per micro-batch. Each micro-batch's batch statistics are captured
  (momentum 1 for that forward pass, then the buffers put back), gathered from every rank, and folded
  into the running statistics in global micro-batch order, on every rank.
- **Randomness in the step** (DropPath): each micro-batch's forward pass draws from a generator seeded
  by ``(seed, step, micro-batch)``, not by how many numbers a process has drawn.
- **Logged losses** average the step's micro-batches in global order.

No DDP wrapper is used: the ranks start from rank 0's weights, reduce the gradients themselves (at a ring
all-reduce's traffic) and take the same optimizer step.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from utils.ddp import DistInfo, all_gather_single, gather_objects, padded_copy
from utils.errors import UserError


def check_micro_batch(micro_batch: int, batch_size: int, world_size: int, opt) -> int:
    """The number of micro-batches in a full step; one line naming what can be changed when the flags
    or the process count cannot keep the result independent of the process count."""
    if batch_size < 1 or micro_batch < 1 or batch_size % micro_batch:
        raise UserError(f"--micro-batch {micro_batch}: must divide --batch-size {batch_size} (AutoBatch, -1, "
                        "cannot be combined with it)")
    for flag in ("rect", "quad", "sync_bn"):
        if getattr(opt, flag, False):
            raise UserError(f"--micro-batch with --{flag.replace('_', '-')}: not supported (it shapes batches "
                            "by process); drop one of them")
    count = batch_size // micro_batch
    if world_size & (world_size - 1) or count % world_size:
        sizes = [w for w in (1, 2, 4, 8, 16, 32, 64) if count % w == 0]
        raise UserError(f"--micro-batch {micro_batch} with --batch-size {batch_size} makes {count} micro-batches a "
                        f"step, which {world_size} processes cannot share exactly; use {', '.join(map(str, sizes))} "
                        "process(es), or another --micro-batch")
    return count


def tree_sum(leaves: list, lo: int, hi: int):
    """Sum of ``leaves[lo:hi]`` in the balanced binary tree that halves every range (the left half takes the
    extra leaf of an odd range); None leaves are empty. None when every leaf is."""
    if hi - lo == 1:
        return leaves[lo]
    mid = lo + (hi - lo + 1) // 2
    left, right = tree_sum(leaves, lo, mid), tree_sum(leaves, mid, hi)
    if left is None or right is None:
        return right if left is None else left
    return left + right


def flat_grads(params: list) -> torch.Tensor:
    """Every parameter's gradient (zeros where it has none) as one flat fp32 vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])


def reduce_partials(partial, size: int, info: DistInfo, device) -> torch.Tensor | None:
    """Every rank's subtree sum (None: the rank had no micro-batch) combined in the tree's top levels, at a
    ring all-reduce's traffic: each rank owns a shard, an all-to-all brings it every rank's copy, the rank
    finishes the tree on its shard, and an all-gather returns the shards (as utils/ddp.py's hook does)."""
    if not (info.enabled and dist.is_initialized()):
        return partial
    world_size = info.world_size
    present = torch.tensor([partial is not None], dtype=torch.uint8, device=device)
    flags = torch.empty(world_size, dtype=torch.uint8, device=device)
    all_gather_single(flags, present, None, async_op=False)
    shard = -(-size // world_size)
    send = padded_copy(partial if partial is not None else torch.zeros(size, device=device), shard * world_size)
    copies = torch.empty_like(send)
    dist.all_to_all_single(copies, send)
    rows = [row if flag else None for row, flag in zip(copies.view(world_size, shard), flags.tolist())]
    summed = tree_sum(rows, 0, world_size)
    all_gather_single(send, summed, None, async_op=False)
    return send[:size]


class BatchNormStats:
    """Per-micro-batch batch statistics of every BatchNorm layer, folded into the running statistics
    in global order on every rank.

    A layer's statistics are captured at each of its calls in a forward pass (a block may call one
    BatchNorm twice), so the fold updates it once per call, in call order, as the forward passes of the
    micro-batches run one after another would. ``momentum=None`` (a cumulative average) folds with
    ``1 / num_batches_tracked``, as BatchNorm itself does.
    """

    def __init__(self, model: nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                       and m.track_running_stats]
        self.saved, self.calls, self.handles = [], [], []

    def begin(self) -> None:
        """Before a micro-batch's forward pass: keep the buffers, and let each call write its batch statistics
        into them (momentum 1), where a forward hook copies them."""
        self.saved = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone(), m.momentum)
                      for m in self.layers]
        self.calls = [[] for _ in self.layers]
        for m, calls in zip(self.layers, self.calls):
            m.momentum = 1.0
            self.handles.append(m.register_forward_hook(self._capture(calls)))

    @staticmethod
    def _capture(calls: list):
        def hook(module, inputs, output):
            if module.training:
                calls.append((module.running_mean.detach().clone(), module.running_var.detach().clone()))
        return hook

    def end(self) -> list:
        """After its backward pass (which reads the buffers): ``[[(mean, var) per call] per layer]`` of the
        micro-batch, and the buffers as they were before it."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        with torch.no_grad():
            for m, (mean, var, tracked, momentum) in zip(self.layers, self.saved):
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(tracked)
                m.momentum = momentum
        return self.calls

    def fold(self, ordered: list) -> None:
        """Update the running statistics with each micro-batch's ``[[(mean, var) per call] per layer]``, in order."""
        with torch.no_grad():
            for stats in ordered:
                for m, calls in zip(self.layers, stats):
                    for mean, var in calls:
                        m.num_batches_tracked.add_(1)
                        rate = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
                        m.running_mean.copy_(m.running_mean * (1 - rate) + mean.to(m.running_mean) * rate)
                        m.running_var.copy_(m.running_var * (1 - rate) + var.to(m.running_var) * rate)


def in_global_order(local: list, info: DistInfo) -> list:
    """Each rank's per-micro-batch items (plain data or CPU tensors), concatenated in rank order."""
    return [item for part in gather_objects(local, info) for item in part]


def broadcast_weights(model: nn.Module, info: DistInfo) -> None:
    """Rank 0's parameters and buffers on every rank (what DDP's constructor does)."""
    if not (info.enabled and dist.is_initialized()):
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def micro_seed(seed: int, step: int, index: int) -> int:
    """The seed of micro-batch ``index`` of global step ``step``: the same whichever rank runs it."""
    return (int(seed) * 1_000_003 + int(step) * 65_537 + int(index)) % 2**63


def join_micro_batches(micro: list):
    """One rank's micro-batches ``(index, imgs, targets, paths)`` as one batch, for progress and callbacks."""
    if not micro:
        return torch.zeros(0, 3, 0, 0, dtype=torch.uint8), torch.zeros(0, 6), []
    targets, start = [], 0
    for _, imgs, tgt, _ in micro:
        shifted = tgt.clone()
        shifted[:, 0] += start
        targets.append(shifted)
        start += imgs.shape[0]
    return (torch.cat([m[1] for m in micro]), torch.cat(targets),
            [path for m in micro for path in m[3]])


class MicroBatchStep:
    """The gradient of one step from this rank's micro-batches, reduced over ranks in the fixed tree."""

    def __init__(self, model: nn.Module, info: DistInfo, device, seed: int, per_step: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.bn = BatchNormStats(model)
        self.info, self.device, self.seed = info, torch.device(device), int(seed)
        self.per_rank = per_step // info.world_size
        self.rng_devices = [self.device.index or 0] if self.device.type == "cuda" else []

    def local_gradients(self, micro: list, forward_loss, step: int, backward) -> tuple:
        """Each micro-batch's forward and backward (its own generator seed, BatchNorm statistics captured);
        returns (flat gradients or None after a non-finite loss, loss terms, BatchNorm statistics)."""
        leaves, items, stats = [], [], []
        for index, imgs, targets, _ in micro:
            for p in self.params:
                p.grad = None
            with torch.random.fork_rng(devices=self.rng_devices):
                torch.manual_seed(micro_seed(self.seed, step, index))
                self.bn.begin()
                try:
                    loss, loss_items = forward_loss(imgs, targets)
                    finite = bool(torch.isfinite(loss.detach()).all())
                    if finite:
                        backward(loss)
                finally:
                    bn = self.bn.end()
            leaves.append(flat_grads(self.params) if finite else None)
            items.append(loss_items.detach().cpu())
            stats.append([[(mean.cpu(), var.cpu()) for mean, var in calls] for calls in bn])
        return leaves, items, stats

    def apply(self, leaves: list, held: list) -> None:
        """The tree-reduced step gradient added to the gradients ``held`` from earlier steps."""
        padded = leaves + [None] * (self.per_rank - len(leaves))
        partial = tree_sum(padded, 0, len(padded)) if padded else None
        size = sum(p.numel() for p in self.params)
        total = reduce_partials(partial, size, self.info, self.device)
        offset = 0
        for p, before in zip(self.params, held):
            grad = torch.empty_like(p).copy_(total[offset:offset + p.numel()].view_as(p))  # p's memory layout
            offset += p.numel()
            p.grad = grad if before is None else before + grad

    def loss_terms(self, items: list) -> torch.Tensor:
        """The step's loss terms: every rank's micro-batches averaged in global order."""
        ordered = in_global_order(items, self.info)
        total = ordered[0].clone()
        for item in ordered[1:]:
            total = total + item
        return (total / len(ordered)).to(self.device)

    def fold_batch_norm(self, stats: list) -> None:
        """Every rank's micro-batch BatchNorm statistics folded in global order (after the step was kept)."""
        self.bn.fold(in_global_order(stats, self.info))
