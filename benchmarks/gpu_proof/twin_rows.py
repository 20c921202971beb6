"""The GPU proof's rows for the deterministic twins (section ``twins``).

Per twin, on one op input ``x`` of shape ``(B, C, H, W)``:

- ``reruns``: the twin's forward and backward under ``torch.use_deterministic_algorithms(True)``, 5
  times; the SHA-256 of the input gradient must be the same every time (claim). It also shows that the
  twin raises no "does not have a deterministic implementation" error.
- ``agrees``: the twin and the native op in float64, determinism off: forward within 1e-10 and input
  gradient within 1e-8, absolute, on unit-scale random data (claim; the GPU's reductions sum in
  another order than the CPU tests' reference).
- ``native``: what the native op does on CUDA: raises under strict, or (a silent op) gives several
  gradient hashes in 5 runs (information: a native kernel whose atomics happen not to collide in 5 runs
  is not the twin's failure). On a CPU this does not apply: CPU kernels are deterministic.

And a model row pair: tests/support/user_block_zoo.py's nine user blocks in one small detector, trained
by ``train.py --deterministic strict`` twice (the twins replace the flagged ops; determinism.json names
them) with the same final EMA checksum.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import torchvision.ops as tvo

from benchmarks.gpu_proof.ops import TORCH_ALERT
from benchmarks.gpu_proof.report import info, skip, verdict
from benchmarks.gpu_proof.runs import finished
from tests.support.user_block_zoo import write_zoo_model_yaml
from utils.determinism.twins.interpolation import interpolate
from utils.determinism.twins.pooling import (adaptive_avg_pool2d, adaptive_avg_pool3d, adaptive_max_pool2d,
                                             adaptive_max_pool3d)
from utils.determinism.twins.sampling import grid_sample
from utils.determinism.twins.vision_ops import deform_conv2d, roi_align, roi_pool
from utils.torch_utils import temporary_determinism

RERUNS = 5
FORWARD_ATOL, BACKWARD_ATOL = 1e-10, 1e-8  # float64, absolute, unit-scale data
FULL_SHAPE, QUICK_SHAPE = (8, 16, 48, 40), (2, 4, 11, 9)  # odd sizes, windows that overlap


def _volume(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, 3, H, W)``: three scaled copies of ``x`` as depth slices."""
    return x[:, :, None] * torch.linspace(1, 2, 3, device=x.device, dtype=x.dtype).view(1, 1, 3, 1, 1)


def _rotated_grid(x: torch.Tensor) -> torch.Tensor:
    theta = torch.tensor([[0.9, 0.2, 0.05], [-0.2, 0.9, 0.0]], device=x.device, dtype=x.dtype)
    return F.affine_grid(theta.expand(len(x), 2, 3), list(x.shape), align_corners=False)


def _boxes(x: torch.Tensor) -> torch.Tensor:
    """Twelve overlapping boxes per image, ``(K, 5)`` as ``(batch index, x1, y1, x2, y2)`` in pixels."""
    h, w = x.shape[-2:]
    corners = torch.tensor([[0.0, 0.0, 0.6, 0.7], [0.3, 0.2, 1.0, 0.9], [0.1, 0.4, 0.5, 1.0], [0.25, 0.25, 0.75, 0.75]],
                           dtype=x.dtype) * torch.tensor([w, h, w, h], dtype=x.dtype)
    per_image = torch.cat([corners, corners + 0.5, corners * 0.9])
    rows = [torch.cat([torch.full((len(per_image), 1), float(i), dtype=x.dtype), per_image], 1) for i in range(len(x))]
    return torch.cat(rows).to(x.device)


def _deform_arguments(x: torch.Tensor) -> tuple:
    """``(offset, weight, mask)`` for a 3x3 modulated deformable conv, offsets of +-2 px from a fixed seed."""
    generator = torch.Generator().manual_seed(1)
    b, c, h, w = x.shape
    offset = torch.randn((b, 18, h, w), generator=generator, dtype=x.dtype) * 2
    weight = torch.randn((c, c, 3, 3), generator=generator, dtype=x.dtype) / (3 * c ** 0.5)
    mask = torch.rand((b, 9, h, w), generator=generator, dtype=x.dtype)
    return offset.to(x.device), weight.to(x.device), mask.to(x.device)


def _deform(op: Callable) -> Callable:
    def call(x):
        offset, weight, mask = _deform_arguments(x)
        return op(x, offset, weight, None, padding=1, mask=mask)
    return call


@dataclass(frozen=True)
class TwinCase:
    """One twin against its native op, both ``(B, C, H, W) -> tensor``."""

    native: Callable
    twin: Callable


TWIN_CASES = {
    "adaptive_max_pool2d (7, 5)": TwinCase(lambda x: F.adaptive_max_pool2d(x, (7, 5)),
                                           lambda x: adaptive_max_pool2d(x, (7, 5))),
    "adaptive_max_pool3d (2, 7, 5)": TwinCase(lambda x: F.adaptive_max_pool3d(_volume(x), (2, 7, 5)),
                                              lambda x: adaptive_max_pool3d(_volume(x), (2, 7, 5))),
    "adaptive_avg_pool2d (None, 3)": TwinCase(lambda x: F.adaptive_avg_pool2d(x, (None, 3)),
                                              lambda x: adaptive_avg_pool2d(x, (None, 3))),
    "adaptive_avg_pool3d (2, 7, 5)": TwinCase(lambda x: F.adaptive_avg_pool3d(_volume(x), (2, 7, 5)),
                                              lambda x: adaptive_avg_pool3d(_volume(x), (2, 7, 5))),
    "interpolate bicubic x1.7": TwinCase(lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic"),
                                         lambda x: interpolate(x, scale_factor=1.7, mode="bicubic")),
    "grid_sample bilinear zeros": TwinCase(lambda x: F.grid_sample(x, _rotated_grid(x), align_corners=False),
                                           lambda x: grid_sample(x, _rotated_grid(x), align_corners=False)),
    "deform_conv2d with mask": TwinCase(_deform(tvo.deform_conv2d), _deform(deform_conv2d)),
    "roi_align aligned": TwinCase(lambda x: tvo.roi_align(x, _boxes(x), (3, 4), 1.0, 2, True),
                                  lambda x: roi_align(x, _boxes(x), (3, 4), 1.0, 2, True)),
    "roi_pool": TwinCase(lambda x: tvo.roi_pool(x, _boxes(x), (3, 4), 1.0),
                         lambda x: roi_pool(x, _boxes(x), (3, 4), 1.0)),
}


def case_input(device: torch.device, quick: bool, dtype=torch.float32) -> torch.Tensor:
    """The rows' input, from its own generator: ``FULL_SHAPE`` on a GPU, ``QUICK_SHAPE`` in the quick plan."""
    generator = torch.Generator().manual_seed(0)
    return torch.rand(QUICK_SHAPE if quick else FULL_SHAPE, generator=generator, dtype=dtype).to(device)


def gradient_hash(op: Callable, x: torch.Tensor) -> str:
    """SHA-256 of the input gradient of ``op(x)`` with a fixed upstream gradient."""
    leaf = x.detach().clone().requires_grad_()
    output = op(leaf)
    upstream = torch.rand(output.shape, generator=torch.Generator().manual_seed(2), dtype=output.dtype)
    grad, = torch.autograd.grad(output, leaf, upstream.to(output.device))
    return hashlib.sha256(grad.detach().cpu().numpy().tobytes()).hexdigest()


def twin_reruns_row(case: TwinCase, x: torch.Tensor):
    """Claim: the twin's backward gives one gradient hash in :data:`RERUNS` strict runs."""
    with temporary_determinism(True):
        hashes = {gradient_hash(case.twin, x) for _ in range(RERUNS)}
    return verdict(len(hashes) == 1, f"twin under strict on {x.device.type}: {len(hashes)} distinct gradient "
                                     f"hash(es) in {RERUNS} runs", hashes=sorted(hashes))


def native_row(case: TwinCase, x: torch.Tensor):
    """Information: the native op raises under strict on CUDA, or gives several gradient hashes."""
    if x.device.type != "cuda":
        return skip(f"not applicable on {x.device.type}: its native kernels are deterministic")
    try:
        with temporary_determinism(True):
            gradient_hash(case.native, x)
    except RuntimeError as e:
        if TORCH_ALERT not in str(e):
            raise
        return info(f"native raises under strict: {str(e).strip().splitlines()[0][:160]}", outcome="raises")
    hashes = {gradient_hash(case.native, x) for _ in range(RERUNS)}
    said = "varies" if len(hashes) > 1 else "repeated (its atomics did not collide here)"
    return info(f"native runs under strict (no alert) and {said}: {len(hashes)} distinct hash(es) in {RERUNS} runs",
                outcome="varies" if len(hashes) > 1 else "repeats", hashes=sorted(hashes))


def agreement_row(case: TwinCase, x: torch.Tensor):
    """Claim: twin and native agree in float64 (forward and input gradient) on the device."""
    x = x.double()
    leaf = x.clone().requires_grad_()
    native, twin = case.native(leaf), case.twin(leaf)
    upstream = torch.rand(native.shape, generator=torch.Generator().manual_seed(3), dtype=native.dtype).to(x.device)
    native_grad, = torch.autograd.grad(native, leaf, upstream)
    twin_grad, = torch.autograd.grad(twin, leaf, upstream)
    forward = (twin - native).abs().max().item()
    backward = (twin_grad - native_grad).abs().max().item()
    return verdict(forward <= FORWARD_ATOL and backward <= BACKWARD_ATOL,
                   f"float64 max |twin - native|: forward {forward:.1e} (<= {FORWARD_ATOL:.0e}), input gradient "
                   f"{backward:.1e} (<= {BACKWARD_ATOL:.0e})", forward=forward, backward=backward)


def twin_section(proof, device: torch.device, quick: bool) -> None:
    """Three rows per twin (reruns and agreement are claims, the native outcome is information)."""
    x = case_input(device, quick)
    for name, case in TWIN_CASES.items():
        proof.check("twins", f"{name}: twin backward bit-identical x{RERUNS}", lambda c=case: twin_reruns_row(c, x))
        proof.check("twins", f"{name}: twin agrees with native", lambda c=case: agreement_row(c, x))
        proof.check("twins", f"{name}: native on CUDA", lambda c=case: native_row(c, x), claim=False)


def start_zoo_runs(pool, layer, settings, folder: Path, deadline: float) -> tuple:
    """Write the zoo model YAML into ``folder`` and submit its strict run and rerun; ``(cfg, futures)``."""
    cfg = write_zoo_model_yaml(folder, name="user-block-zoo.yaml")
    return cfg, {key: pool.submit(layer.run_named, settings, cfg, f"zoo-{key}", deadline) for key in ("first", "again")}


def zoo_strict_row(future):
    """Claim: the zoo model trained under strict with a clean audit, twins named in determinism.json."""
    run = future.result()
    finished(run)
    report = run.report()
    twins = (report.get("twins") or {}).get("twins", [])
    replaced = len((report.get("twins") or {}).get("replaced", []))
    ok = (report["mode"] == "strict" and report["relaxed_backward"] is False and report["audit"]["clean"]
          and bool(twins))
    return verdict(ok, f"exit 0 in {run.seconds:.0f} s, relaxed {report['relaxed_backward']}, clean "
                       f"{report['audit']['clean']}, {replaced} op(s) replaced by twins {', '.join(twins)}",
                   twins=twins, replaced=replaced, sha256=run.checksum())


def zoo_rerun_row(futures: dict):
    """Claim: the rerun ends with the first run's final EMA checksum."""
    first, again = futures["first"].result(), futures["again"].result()
    finished(first)
    finished(again)
    return verdict(first.checksum() == again.checksum(),
                   f"rerun: {again.checksum()[:16]} vs {first.checksum()[:16]}", reference=first.checksum(),
                   other=again.checksum())


def zoo_rows(proof, futures: dict) -> None:
    proof.check("twins", "user-block-zoo: strict run with twins, clean audit", lambda: zoo_strict_row(futures["first"]))
    proof.check("twins", "user-block-zoo: rerun bit-identical", lambda: zoo_rerun_row(futures))
