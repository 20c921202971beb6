"""Which samples each batch holds: a seeded, shardable batch sampler and the loader that drives it.

The sampler (main process) yields batches of keys ``(index, epoch, draw)``; the data set seeds every
random decision for a sample from its key, so batches are a pure function of ``(seed, epoch)``
whatever the number of workers, and ``set_epoch(epoch, start_batch)`` replays the tail of an epoch.
"""

import math

import numpy as np
from torch.utils.data import DataLoader, Sampler

from utils.training.interrupts import stop_signals_held

SAMPLER_STREAM = 2**32 - 1  # seed word for the epoch order, distinct from any sample index


def _image_weights(dataset) -> np.ndarray:
    """(N,) sampling weight per image: sum over its labels of the class weight (rare classes weigh more)."""
    classes = [lb[:, 0].astype(int) for lb in dataset.labels]
    nc = max((int(c.max()) + 1 for c in classes if len(c)), default=1)
    cw = dataset.class_weights
    if cw is None:
        freq = np.bincount(np.concatenate(classes) if classes else np.zeros(0, int), minlength=nc).astype(float)
        cw = 1.0 / np.maximum(freq, 1.0)
    cw = np.asarray(cw, dtype=float)
    per_image = np.array([cw[c].sum() if len(c) else cw.min() for c in classes]) + 1e-9
    return per_image / per_image.sum()


class DeterministicBatchSampler(Sampler):
    """Batches of keys ``(index, epoch, draw)`` whose order is a pure function of ``(seed, epoch)``.

    With ``rank >= 0`` and a world size above 1 each rank gets an equal shard (padded by repeating
    the start of the order, as DistributedSampler does); rect batches are sharded whole so every
    batch keeps one shape. ``set_epoch(epoch, start_batch)`` skips the first batches of that epoch.

    A data set letterboxed per image (``shape_per_image``, evaluation) is cut into batches within each group of
    one shape, in order: the last batch of a group may be short, and no batch mixes two shapes.

    With ``global_batch`` (``--micro-batch``), batches are micro-batches of ``batch_size``: each step's
    ``global_batch`` images are cut from the epoch order first, split into micro-batches, and every rank
    takes its contiguous share of them (utils/training/micro_batches.py), so what a step holds does not
    depend on the world size; ``start_batch`` and :meth:`steps` count steps, not micro-batches.
    """

    def __init__(self, dataset, batch_size, shuffle=False, seed=0, rank=-1, world_size=1, global_batch=0):
        super().__init__()
        self.dataset = dataset
        self.n = len(dataset)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed) % 2**63
        self.rank = max(rank, 0) if world_size > 1 else 0
        self.world_size = world_size if rank >= 0 else 1
        self.global_batch = int(global_batch)
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch (any int >= 0) and the first batch to deliver (resume inside an epoch)."""
        last = self.steps() if self.global_batch else len(self)
        if start_batch < 0 or start_batch > last:
            raise ValueError(f"start_batch {start_batch} outside 0..{last}")
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def _order(self):
        """(N,) image indices and (N,) draw numbers (repeats of an index within the epoch) for the whole epoch."""
        rng = np.random.default_rng([self.seed, self.epoch, SAMPLER_STREAM])
        if getattr(self.dataset, "image_weights", False):
            order = rng.choice(self.n, self.n, p=_image_weights(self.dataset))
            draws = np.zeros(self.n, dtype=np.int64)
            seen = {}
            for j, i in enumerate(order.tolist()):
                draws[j] = seen.get(i, 0)
                seen[i] = draws[j] + 1
            return order, draws
        order = rng.permutation(self.n) if self.shuffle else np.arange(self.n)
        return order, np.zeros(self.n, dtype=np.int64)

    def _shape_grouped(self):
        """Batches cut within groups of one shape: an unsharded, unshuffled evaluation set letterboxed per image."""
        return self.world_size == 1 and not self.shuffle and getattr(self.dataset, "shape_per_image", False)

    def _rect_sharded(self):
        return self.world_size > 1 and getattr(self.dataset, "rect", False)

    def steps(self) -> int:
        """Steps in an epoch with ``global_batch``: the last one may be short."""
        return math.ceil(self.n / self.global_batch)

    def step_share(self, step: int) -> range:
        """Global indices, within step ``step``, of the micro-batches this rank takes (``global_batch`` only)."""
        images = min(self.global_batch, self.n - step * self.global_batch)
        count = math.ceil(images / self.batch_size)
        per_rank = self.global_batch // self.batch_size // self.world_size
        start = self.rank * per_rank
        return range(min(start, count), min(start + per_rank, count))

    def _micro_batches(self, keys):
        out = []
        for step in range(self.steps()):
            images = keys[step * self.global_batch:(step + 1) * self.global_batch]
            out += [images[j * self.batch_size:(j + 1) * self.batch_size] for j in self.step_share(step)]
        return out

    def batches(self):
        """All batches of keys this rank sees in the current epoch (before ``start_batch`` is applied)."""
        order, draws = self._order()
        keys = [(int(i), self.epoch, int(d)) for i, d in zip(order, draws)]
        if self.global_batch:
            return self._micro_batches(keys)
        bs = self.batch_size
        if self._shape_grouped():
            return [keys[i:min(i + bs, group.stop)] for group in self.dataset.shape_groups()
                    for i in range(group.start, group.stop, bs)]
        if self._rect_sharded():
            batches = [keys[i:i + bs] for i in range(0, len(keys), bs)]
            return _pad_to_multiple(batches, self.world_size)[self.rank::self.world_size]
        if self.world_size > 1:
            keys = _pad_to_multiple(keys, self.world_size)[self.rank::self.world_size]
        return [keys[i:i + bs] for i in range(0, len(keys), bs)]

    def __iter__(self):
        skip = self.start_batch
        if self.global_batch:
            skip = sum(len(self.step_share(step)) for step in range(self.start_batch))
        yield from self.batches()[skip:]

    def __len__(self):
        """Batches in a full epoch for this rank (a resumed epoch delivers ``len - start_batch``)."""
        if self.global_batch:
            return sum(len(self.step_share(step)) for step in range(self.steps()))
        if self._shape_grouped():
            return sum(math.ceil(len(group) / self.batch_size) for group in self.dataset.shape_groups())
        if self._rect_sharded():
            return math.ceil(math.ceil(self.n / self.batch_size) / self.world_size)
        return math.ceil(math.ceil(self.n / self.world_size) / self.batch_size)


def _pad_to_multiple(items, k):
    """Repeat ``items`` from the start until its length is a multiple of ``k``."""
    total = math.ceil(len(items) / k) * k
    reps = math.ceil(total / len(items))
    return (items * reps)[:total]


class DeterministicDataLoader(DataLoader):
    """DataLoader whose batches depend only on ``(seed, epoch)``; call ``set_epoch`` before each epoch."""

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        with stop_signals_held():  # workers start here (persistent ones at the first epoch only)
            return super().__iter__()

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch; ``start_batch`` skips that many batches without loading them (mid-epoch resume)."""
        self.batch_sampler.set_epoch(epoch, start_batch)

