"""The guard against non-finite values: a loss, a gradient or the weights after a step, decided on every
rank at once.

A NaN or infinite loss (a learning rate too high, a bad label, fp16 overflow) would otherwise be
back-propagated, stepped into the weights and the EMA, and saved in every later checkpoint. The
batch's forward pass has already updated BatchNorm's running statistics by then, so they are put
back from a copy taken before the forward: the model is left exactly as it was before the batch.

A finite loss can still give a non-finite step: an overflowing gradient, or a huge learning rate times a
finite one. :class:`GuardedStep` checks the global gradient norm (computed for clipping anyway) and the
weights after the step (one fused max-abs over every parameter); a bad step is undone from a copy of the
parameters and the optimizer state taken before it, and the EMA is not updated.
"""

import torch
import torch.nn as nn

from utils.ddp import DistInfo, gather_objects, max_over_ranks

NAN_POLICIES = ("stop", "skip")
CLIP_NORM = 10.0  # YOLOv5's gradient clipping


def nonfinite_origins(local: dict | None, dist: DistInfo) -> list:
    """Every rank's report of a non-finite value (``local``: None where all was finite), in rank order;
    [] when no rank has one. One small all-reduce; the reports themselves are gathered only after a hit."""
    if not max_over_ranks([local is not None], dist)[0]:
        return []
    return [report for report in gather_objects(local, dist) if report is not None]


def loss_report(rank: int, terms, micro: int | None = None) -> dict:
    """Where a non-finite loss arose: the rank, the micro-batch (``--micro-batch``) and the three terms."""
    return {"rank": rank, "micro": micro, "terms": [float(v) for v in terms]}


class BufferSnapshot:
    """A copy of the BatchNorm buffers that a training forward pass updates, to put back after a bad batch."""

    def __init__(self, model: nn.Module):
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.live = [b for m in norms for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                     if b is not None]
        self.saved = [b.clone() for b in self.live]

    def take(self) -> None:
        if self.live:
            torch._foreach_copy_(self.saved, self.live)

    def restore(self) -> None:
        if self.live:
            torch._foreach_copy_(self.live, self.saved)


def all_finite(tensors: list) -> bool:
    """True when every element of every tensor is finite."""
    return floats_finite([t for t in tensors if t.is_floating_point() and t.numel()])


def floats_finite(tensors: list) -> bool:
    """:func:`all_finite` for non-empty floating-point tensors: one fused max-abs (which cannot overflow,
    unlike a 2-norm) and one device sync."""
    if not tensors:
        return True
    with torch.no_grad():
        return bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors, float("inf")))).all())


class GuardedStep:
    """The optimizer step (unscale, clip at :data:`CLIP_NORM`, step, scaler update, EMA) kept only when the
    gradients and the weights after it are finite on every rank; otherwise the parameters and optimizer state
    are put back as they were before it and the EMA is left alone. Either way the accumulated gradients are
    cleared."""

    def __init__(self, optimizer: torch.optim.Optimizer, buffers: list = ()):
        """``buffers``: BatchNorm's running statistics, checked with the weights (the caller puts them back)."""
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.checked = [t for t in self.params + list(buffers) if t.is_floating_point() and t.numel()]
        self._state_seen, self._entries = None, -1
        self._live, self._saved, self._plain, self._plain_values, self._empty = [], [], [], [], []

    def _layout(self) -> None:
        """The tensors and values a step changes (parameters, optimizer state), listed again only when the
        optimizer's state was created (its first step) or replaced (a resume)."""
        state = self.optimizer.state
        if self._state_seen is state and self._entries == len(state):
            return
        self._live = self.params + [v for s in state.values() for v in s.values() if torch.is_tensor(v)]
        self._saved = [t.detach().clone() for t in self._live]
        self._plain = [(s, key) for s in state.values() for key, v in s.items() if not torch.is_tensor(v)]
        self._empty = [p for p in self.params if not state.get(p)]
        self._state_seen, self._entries = state, len(state)

    def _take(self) -> None:
        self._layout()
        with torch.no_grad():
            torch._foreach_copy_(self._saved, self._live)
        self._plain_values = [s[key] for s, key in self._plain]

    def _restore(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self._live, self._saved)
        for (s, key), value in zip(self._plain, self._plain_values):
            s[key] = value
        for p in self._empty:  # state the step itself created (momentum buffers at the first step)
            self.optimizer.state.pop(p, None)

    def __call__(self, model, scaler, ema, dist: DistInfo) -> str | None:
        """Take the step; None when it was kept, else what was not finite (the step is undone on every rank)."""
        scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP_NORM)
        # under AMP, a gradient that overflowed is the scaler's business: it skips that step and lowers its scale
        bad_gradient = not scaler.is_enabled() and not bool(torch.isfinite(norm))
        self._take()
        problem = None
        if bad_gradient:
            problem = f"non-finite gradient (global norm {float(norm):.4g})"
        else:
            scaler.step(self.optimizer)
            if not floats_finite(self.checked):
                problem = "non-finite weights after the optimizer step"
        scaler.update()
        if max_over_ranks([problem is not None], dist)[0]:
            self._restore()
            problem = problem or "a non-finite step on another rank"
        self.optimizer.zero_grad()
        if problem is None and ema:
            ema.update(model)
        return problem


def describe_origins(origins: list, world_size: int) -> str:
    """Where a non-finite loss arose: ' on rank R in micro-batch M (box b, obj o, cls c)', the first origin in
    rank order (a rank reports its first non-finite micro-batch), and how many other ranks had one."""
    first = origins[0]
    where = f" on rank {first['rank']}" if world_size > 1 else ""
    where += f" in micro-batch {first['micro']}" if first["micro"] is not None else ""
    box, obj, cls = first["terms"]
    text = f"{where} (box {box:.4g}, obj {obj:.4g}, cls {cls:.4g})"
    if len(origins) > 1:
        text += f", also on {len(origins) - 1} other rank(s)"
    return text


def nonfinite_message(what: str, where: str, epoch: int, batch: int, amp: bool, skipping: bool,
                      step: bool = False) -> str:
    """One line: what stopped being finite (``what``: 'non-finite loss', or with ``step`` a step's problem) and
    where (``where``: :func:`describe_origins`), what was done, and the likely causes."""
    causes = "a learning rate too high (lr0 in --hyp), a label with a box of zero or negative size"
    causes += ", fp16 overflow (AMP: try --device cpu to compare)" if amp else ""
    if skipping:
        action = "skipped (--nan-policy skip)"
    else:
        action = "not stepped" if step else "not back-propagated or stepped"
    if step:
        action += ("; the weights, optimizer state, EMA and BatchNorm statistics are as before the step, and the "
                   "gradients accumulated since the last step are dropped")
    return f"{what} at epoch {epoch} batch {batch}{where}: {action}; likely causes: {causes}"
