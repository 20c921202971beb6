"""The GPU proof's op battery and its detection control.

Battery: each case wraps one op in a tiny module (``op(x * scale)``, so the backward reaches a
parameter). The audit, run on the CPU, predicts whether the op fails under strict determinism on
the target device (for CUDA from its meta trace, which takes CUDA's Python and cuDNN branches, with
the op table's rows for the target's torch release); the target device then runs a forward and backward under
``torch.use_deterministic_algorithms(True)`` and either raises PyTorch's "does not have a
deterministic implementation" error or not. A row passes when prediction and device agree. Ops the
audit finds silently nondeterministic (no alert: the device runs them) are named in the row; the
strict run cannot show their variation.

Control: ``index_add_`` of 10^6 values into one slot, repeated; without determinism a CUDA GPU
accumulates with atomics in a varying order (several hashes), under strict it must give one.
"""

import hashlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.gpu_proof.report import Verdict, info, skip, verdict
from utils.determinism.op_audit import audit_model
from utils.torch_utils import temporary_determinism

TORCH_ALERT = "does not have a deterministic implementation"
BATCH, CHANNELS, SIZE = 2, 4, 8


def run_audit(model: nn.Module, imgsz: int, device, batch_size: int, ch: int, torch_version: str = torch.__version__):
    """The CPU audit of one training step of ``model`` (the prediction the device is checked against)."""
    return audit_model(model, imgsz=imgsz, device=device, batch_size=max(batch_size, 2), ch=ch,
                       torch_version=torch_version)


class SingleOp(nn.Module):
    """``(B, C, H, W) -> op(x * scale)``: one op under test, reached by the backward through ``scale``."""

    def __init__(self, op: Callable, channels: int = CHANNELS):
        super().__init__()
        self.op = op
        self.scale = nn.Parameter(torch.ones(1, channels, 1, 1))

    def forward(self, x: torch.Tensor):
        return self.op(x * self.scale)


def _cycle(n: int, k: int, like: torch.Tensor) -> torch.Tensor:
    """``[0, 1, .., k-1, 0, 1, ..]`` of length ``n`` on ``like``'s device: indices with collisions."""
    return torch.arange(n, device=like.device) % k


def _grid(y: torch.Tensor, align_corners: bool = False) -> torch.Tensor:
    """A slightly rotated sampling grid ``(B, H, W, 2)`` for ``grid_sample``."""
    theta = torch.tensor([[0.9, 0.1, 0.05], [-0.1, 0.9, 0.0]], device=y.device, dtype=y.dtype)
    return F.affine_grid(theta.expand(y.shape[0], 2, 3), list(y.shape), align_corners=align_corners)


def _volume(y: torch.Tensor) -> torch.Tensor:
    """``(B, C, 4, H, W)``: four differently scaled copies of ``y`` as depth slices, for the 3-D ops."""
    return y[:, :, None] * torch.linspace(1, 2, 4, device=y.device, dtype=y.dtype).view(1, 1, 4, 1, 1)


def _ctc(y: torch.Tensor, cudnn_eligible: bool) -> torch.Tensor:
    """CTC loss over ``y``'s pixels as time steps (T = H*W, N = B, C classes, blank 0), two targets.

    cuDNN takes it on CUDA with int32 targets on the CPU and every input as long as T; int64
    targets on the device send it to aten's own kernel.
    """
    log_probs = F.log_softmax(y.flatten(2).permute(2, 0, 1), 2)
    targets = torch.tensor([1, 2, 3, 1, 2], dtype=torch.int32)
    targets = targets if cudnn_eligible else targets.to(y.device, torch.long)
    steps = log_probs.shape[0]
    return F.ctc_loss(log_probs, targets, [steps, steps], [3, 2])  # BATCH is 2


def _nll(y: torch.Tensor, reduction: str) -> torch.Tensor:
    """Image-shaped NLL loss (aten ``nll_loss2d``) against each pixel's own arg-max class."""
    return F.nll_loss(F.log_softmax(y, 1), y.detach().argmax(1), reduction=reduction)


def _put(y: torch.Tensor):
    """``put_`` with ``accumulate=False`` (non-deterministic on every device: the battery's CPU control)."""
    flat = y.detach().flatten().clone()
    return y.mean(), flat.put_(_cycle(8, 8, y), flat[:8] * 2, accumulate=False)


# name -> op on y (B, C, H, W); ops without a gradient return (y.mean(), result) so a backward still runs.
CASES = {
    "adaptive_max_pool2d output 1": lambda y: F.adaptive_max_pool2d(y, 1),
    "adaptive_max_pool2d output 2": lambda y: F.adaptive_max_pool2d(y, 2),
    "adaptive_avg_pool2d output 1": lambda y: F.adaptive_avg_pool2d(y, 1),
    "adaptive_avg_pool2d output 2": lambda y: F.adaptive_avg_pool2d(y, 2),
    "interpolate nearest": lambda y: F.interpolate(y, scale_factor=2, mode="nearest"),
    "interpolate bilinear": lambda y: F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False),
    "interpolate bicubic": lambda y: F.interpolate(y, scale_factor=2, mode="bicubic", align_corners=False),
    "interpolate bilinear antialias": lambda y: F.interpolate(y, size=(3, 3), mode="bilinear", antialias=True),
    "interpolate bicubic antialias": lambda y: F.interpolate(y, size=(3, 3), mode="bicubic", antialias=True),
    "reflection pad": lambda y: F.pad(y, (2, 2, 2, 2), mode="reflect"),
    "replication pad": lambda y: F.pad(y, (2, 2, 2, 2), mode="replicate"),
    "max_pool2d channels-last": lambda y: F.max_pool2d(y.contiguous(memory_format=torch.channels_last), 2),
    "grid_sample": lambda y: F.grid_sample(y, _grid(y), align_corners=False),
    "grid_sample align_corners": lambda y: F.grid_sample(y, _grid(y, True), align_corners=True),
    "max_pool3d": lambda y: F.max_pool3d(_volume(y), 2),
    "max_pool3d return_indices": lambda y: F.max_pool3d(_volume(y), 2, return_indices=True)[0],
    "adaptive_max_pool3d output 2": lambda y: F.adaptive_max_pool3d(_volume(y), 2),
    "adaptive_max_pool3d output 3": lambda y: F.adaptive_max_pool3d(_volume(y), 3),
    "ctc_loss cuDNN": lambda y: _ctc(y, cudnn_eligible=True),
    "ctc_loss native": lambda y: _ctc(y, cudnn_eligible=False),
    "nll_loss2d mean": lambda y: _nll(y, "mean"),
    "nll_loss2d none": lambda y: _nll(y, "none"),
    "histc float": lambda y: (y.mean(), torch.histc(y.detach(), bins=8, min=0, max=1)),
    "histc int": lambda y: (y.mean(), torch.histc((y.detach() * 8).long(), bins=8, min=0, max=8)),
    "bincount with weights": lambda y: (y.mean(), torch.bincount(_cycle(y.numel(), 5, y),
                                                                 weights=y.detach().flatten())),
    "median with dim": lambda y: torch.median(y.flatten(1), dim=1).values,
    "kthvalue": lambda y: torch.kthvalue(y.flatten(1), 3, dim=1).values,
    "index_reduce prod": lambda y: y.new_ones(5).index_reduce(0, _cycle(y.numel(), 5, y), y.flatten(), "prod"),
    "scatter_reduce prod": lambda y: y.new_ones(y.shape[0], 5).scatter_reduce(
        1, _cycle(y[0].numel(), 5, y).expand(y.shape[0], -1), y.flatten(1), "prod"),
    "scatter_reduce sum": lambda y: y.new_zeros(y.shape[0], 5).scatter_reduce(
        1, _cycle(y[0].numel(), 5, y).expand(y.shape[0], -1), y.flatten(1), "sum"),
    "index_add": lambda y: y.new_zeros(5).index_add(0, _cycle(y.numel(), 5, y), y.flatten()),
    "gather": lambda y: torch.gather(y.flatten(1), 1, _cycle(40, 7, y).expand(y.shape[0], -1)),
    "put_ accumulate=False": _put,
}


def _sample_input(device) -> torch.Tensor:
    """The battery's input ``(BATCH, CHANNELS, SIZE, SIZE)``, drawn from its own generator."""
    generator = torch.Generator().manual_seed(0)
    return torch.rand((BATCH, CHANNELS, SIZE, SIZE), generator=generator).to(device)


def _loss(output) -> torch.Tensor | None:
    """Sum of every floating output that requires grad."""
    outputs = output if isinstance(output, tuple) else (output,)
    parts = [t.float().sum() for t in outputs if t.is_floating_point() and t.requires_grad]
    return torch.stack(parts).sum() if parts else None


def strict_outcome(op: Callable, device: torch.device) -> tuple[str, str]:
    """``('raises' | 'runs' | 'unsupported', PyTorch's first line)`` for a strict forward and backward."""
    model = SingleOp(op).to(device)
    x = _sample_input(device)
    try:
        with temporary_determinism(True):
            loss = _loss(model(x))
            if loss is not None:
                loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    except RuntimeError as e:  # NotImplementedError (no kernel for this dtype) is a RuntimeError too
        first = str(e).strip().splitlines()[0]
        return ("raises" if TORCH_ALERT in str(e) else "unsupported"), first
    return "runs", ""


def predicted_failures(op: Callable, device_type: str, torch_version: str = torch.__version__) -> tuple:
    """``(predicted to raise on device_type, ['op (phase)', ..], the trace it came from)`` from a CPU audit.

    ``torch_version``: the release of the device's torch (the op table's rows for it). Where the
    CPU has no kernel for the op (e.g. ``histc`` on integers) the audit runs on ``meta`` alone.
    Ops that run without an alert but not deterministically are listed as ``'op (phase, silent)'``
    and do not count as raising.
    """
    try:
        report = run_audit(SingleOp(op), SIZE, "cpu", BATCH, CHANNELS, torch_version)
    except RuntimeError:  # "not implemented" / "unsupported scalarType": no CPU kernel for this dtype
        report = run_audit(SingleOp(op).to("meta"), SIZE, "meta", BATCH, CHANNELS, torch_version)
    failing = [f for f in report.findings if device_type in f.devices]
    where = report.cuda_trace if device_type == "cuda" else report.device
    listed = {f"{f.op} ({f.phase}{', silent' if f.silent else ''})" for f in failing}
    return any(not f.silent for f in failing), sorted(listed), where


def battery_case(name: str, device: torch.device, outcome: Callable | None = None,
                 torch_version: str = torch.__version__, expected: dict | None = None) -> Verdict:
    """One row: the CPU audit's prediction for ``device`` against what ``device`` does under strict.

    ``outcome(name, op, device)`` gives the device's side (default :func:`strict_outcome`; a replay
    passes recorded outcomes); ``torch_version`` is the device's torch; ``expected``: the case's
    row of the replay table for that release (None: the table has no data for it, said in the row).
    """
    op = CASES[name]
    actual, message = outcome(name, op, device) if outcome else strict_outcome(op, device)
    if actual == "unsupported":
        return skip(f"{device.type} has no kernel for this case: {message}", actual=actual, torch_message=message)
    predicted, ops, where = predicted_failures(op, device.type, torch_version)
    said = f"audit ({where}): {'raises' if predicted else 'runs'} on {device.type}"
    table = expected["outcome"] if expected else "NO DATA"
    data = {"predicted_raises": predicted, "predicted_ops": ops, "audit_device": where,
            "actual": actual, "torch_message": message, "table": table,
            "table_silent": bool(expected and expected.get("silent"))}
    detail = f"{said}{' ' + ', '.join(ops) if ops else ''}; {device.type} strict: {actual}; table: {table}"
    if predicted != (actual == "raises"):
        detail = f"MISMATCH {detail}{': ' + message if message else ''}"
    return verdict(predicted == (actual == "raises"), detail, **data)


def index_add_hashes(device: torch.device, deterministic: bool, repeats: int = 20, n: int = 10 ** 6) -> set:
    """Distinct SHA-256 hashes of ``zeros(1).index_add_(0, zeros(n), values)`` over ``repeats`` runs."""
    generator = torch.Generator().manual_seed(0)
    magnitudes = 10.0 ** torch.randint(-3, 4, (n,), generator=generator)
    values = (torch.randn(n, generator=generator) * magnitudes).to(device)
    index = torch.zeros(n, dtype=torch.long, device=device)
    hashes = set()
    with temporary_determinism(deterministic):
        for _ in range(repeats):
            total = torch.zeros(1, device=device).index_add_(0, index, values)
            hashes.add(hashlib.sha256(total.cpu().numpy().tobytes()).hexdigest())
    return hashes


def control_strict(device: torch.device, hashes_of: Callable = index_add_hashes) -> Verdict:
    """Under strict the 20 sums must be bit-identical (``hashes_of``: :func:`index_add_hashes` or a replay)."""
    hashes = hashes_of(device, True)
    return verdict(len(hashes) == 1, f"strict: {len(hashes)} distinct hash(es) in 20 runs", hashes=sorted(hashes))


def control_off(device: torch.device, hashes_of: Callable = index_add_hashes) -> Verdict:
    """Without determinism a GPU should give several sums (so the proof can see non-determinism)."""
    hashes = hashes_of(device, False)
    detail = f"off: {len(hashes)} distinct hash(es) in 20 runs"
    if device.type != "cuda":
        return info(f"{detail} (the CPU kernel need not vary; not a claim)", hashes=sorted(hashes))
    return verdict(len(hashes) > 1, detail, hashes=sorted(hashes))
