"""The CUDA determinism check, in one command (a few minutes on one GPU):

    python benchmarks/cuda_determinism.py [--device 0] [--steps 30]

1. FFCA-YOLO-n with the upstream SCAM (``nn.AdaptiveMaxPool2d``) is flagged by the audit, and
   under ``strict`` its backward fails with PyTorch's own error;
2. the same model trains under ``scoped`` (backward relaxed because the audit asked for it);
3. the shipped FFCA-YOLO (deterministic pools) audits clean and trains under ``strict``;
4. two runs of ``--steps`` steps under ``strict`` give bit-identical weights;
5. the time per batch of each mode.
"""

import argparse
import sys
from copy import deepcopy
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import build_loop, time_batches  # noqa: E402
from models.ffca import SCAM  # noqa: E402
from models.yolo import Model, register_module  # noqa: E402
from utils.checkpoints import state_dict_sha256  # noqa: E402
from utils.env import environment_report, format_report  # noqa: E402
from utils.files import yaml_load  # noqa: E402
from utils.op_audit import audit_model  # noqa: E402
from utils.torch_utils import configure_determinism  # noqa: E402


class UpstreamSCAM(SCAM):
    """SCAM with the upstream global pools: ``nn.AdaptiveAvgPool2d(1)`` / ``nn.AdaptiveMaxPool2d(1)``."""

    def __init__(self, c1: int):
        super().__init__(c1)
        self.avg_pool, self.max_pool = nn.AdaptiveAvgPool2d(1), nn.AdaptiveMaxPool2d(1)

    def forward(self, x):
        n, c, h, w = x.shape
        key = self.key(x).view(n, h * w, 1).softmax(1)
        value = self.value(x).view(n, c, h * w)
        context = torch.bmm(value, key).view(n, c, 1, 1)
        avg = self.avg_pool(x).view(n, c).softmax(1).view(n, 1, c)
        mx = self.max_pool(x).view(n, c).softmax(1).view(n, 1, c)
        maps = torch.cat((torch.bmm(avg, value), torch.bmm(mx, value)), 1).view(n, 2, h, w)
        return x + self.context_proj(context) * self.gate(maps).sigmoid()


register_module(UpstreamSCAM, style="same", override=True)


def upstream_cfg() -> dict:
    cfg = deepcopy(yaml_load(ROOT / "models" / "ffca-yolo-n.yaml"))
    cfg["head"] = [[f, n, "UpstreamSCAM" if m == "SCAM" else m, a] for f, n, m, a in cfg["head"]]
    return cfg


def train_steps(cfg, mode: str, steps: int, device: str, imgsz: int, batch: int) -> str:
    """``steps`` training steps from seed 0 under ``mode``; returns the weights' SHA-256."""
    loop, compute_loss, loader = build_loop(cfg, imgsz, batch, workers=4, mode=mode, device=device)
    loop.model.train()
    done, epoch, nb = 0, 0, len(loader)
    while done < steps:
        loader.set_epoch(epoch)
        for i, (imgs, targets, _, _) in enumerate(loader):
            loop.train_step(imgs, targets, epoch, i, nb, compute_loss)
            done += 1
            if done == steps:
                break
        epoch += 1
    torch.cuda.synchronize()
    return state_dict_sha256(loop.model.state_dict())


def check(title: str, ok: bool) -> bool:
    print(f"[{'PASS' if ok else 'FAIL'}] {title}")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="0")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    device = f"cuda:{args.device}"
    if not torch.cuda.is_available():
        sys.exit("ERROR: no CUDA device; this check needs a GPU (run the CPU test suite instead)")
    configure_determinism("strict", seed=0)
    print(format_report(environment_report()))
    results = []

    upstream = Model(upstream_cfg(), nc=4).to(device)
    report = audit_model(upstream, imgsz=args.imgsz, device=device)
    print(report.format())
    results.append(check("audit flags adaptive_max_pool2d_backward in UpstreamSCAM",
                         any("adaptive_max_pool2d" in f.op and "SCAM" in f.module for f in report.findings)))
    try:
        train_steps(upstream_cfg(), "strict", 1, device, args.imgsz, args.batch_size)
        results.append(check("strict raises PyTorch's error on the upstream SCAM", False))
    except RuntimeError as e:
        print(f"    PyTorch: {str(e).splitlines()[0]}")
        results.append(check("strict raises PyTorch's error on the upstream SCAM",
                             "does not have a deterministic implementation" in str(e)))
    try:
        train_steps(upstream_cfg(), "scoped", 5, device, args.imgsz, args.batch_size)
        results.append(check("scoped trains the upstream SCAM model", True))
    except RuntimeError as e:
        results.append(check(f"scoped trains the upstream SCAM model ({e})", False))

    shipped = ROOT / "models" / "ffca-yolo.yaml"
    clean = audit_model(Model(shipped, nc=4).to(device), imgsz=args.imgsz, device=device)
    results.append(check("shipped ffca-yolo audits clean on CUDA (torch flagged nothing)",
                         clean.clean and not clean.torch_flagged))
    first = train_steps(shipped, "strict", args.steps, device, args.imgsz, args.batch_size)
    second = train_steps(shipped, "strict", args.steps, device, args.imgsz, args.batch_size)
    print(f"    sha256 run 1: {first}\n    sha256 run 2: {second}")
    results.append(check(f"two {args.steps}-step strict runs of ffca-yolo are bit-identical", first == second))

    print(f"\nTime per batch, ffca-yolo, imgsz {args.imgsz}, batch {args.batch_size}:")
    base = None
    for mode in ("off", "warn", "scoped", "strict"):
        seconds = time_batches(shipped, args.imgsz, args.batch_size, 4, mode, warmup=3, batches=20, device=device)
        base = base or seconds
        print(f"    {mode:<7}{seconds * 1000:9.1f} ms  x{seconds / base:.3f}")
    print(f"\n{sum(results)}/{len(results)} checks passed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
