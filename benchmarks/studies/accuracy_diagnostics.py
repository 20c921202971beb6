"""Start-of-training diagnostics for the small-object study (docs/research/).

For each model variant on the tiny-shapes data: AutoAnchor's anchors per level, the share of
positive (target, anchor, cell) assignments per level, the initial objectness probability per
level, the BatchNorm output scale behind each FFM, and gradient norms per stage over the first
optimizer steps of a plain SGD loop (no augmentation, no warm-up).

    python -m benchmarks.studies.accuracy_diagnostics --variants yolov5n-p2 ffca-yolo-n --steps 30
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from benchmarks.accuracy.variants import variant_yaml
from utils.dataset.synthetic.tiny_shapes import make_tiny_shapes
from models.ffca import FFM_Concat2, FFM_Concat3
from models.yolo import Model
from utils.loss import scale_loss_gains
from utils.autoanchor import check_anchors
from utils.dataset.data_config import check_dataset
from utils.dataloaders import create_dataloader
from utils.files import yaml_load
from utils.loss import ComputeLoss
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
HYP = ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"


def stage_of(model: Model, index: int) -> str:
    """'backbone', 'neck' or 'detect' for layer ``index`` (from the YAML sections)."""
    n_backbone = len(model.yaml["backbone"])
    if index == len(model.model) - 1:
        return "detect"
    return "backbone" if index < n_backbone else "neck"


def grad_norms(model: Model) -> dict[str, float]:
    """L2 norm of the gradients per stage, plus the first layer's (stem) alone."""
    sums: dict[str, float] = {}
    for layer in model.model:
        keys = [stage_of(model, layer.i)] + (["stem"] if layer.i == 0 else [])
        g2 = sum(float(p.grad.pow(2).sum()) for p in layer.parameters() if p.grad is not None)
        for key in keys:
            sums[key] = sums.get(key, 0.0) + g2
    return {k: v ** 0.5 for k, v in sums.items()}


def ffm_bn_scale(model: Model, imgs: torch.Tensor) -> list[float]:
    """Std of the first BatchNorm output after each FFM (the next C3's cv1), train mode."""
    stds, hooks = [], []
    ffm_ids = {layer.i for layer in model.model if isinstance(layer, (FFM_Concat2, FFM_Concat3))}
    for layer in model.model:
        if layer.i - 1 in ffm_ids and hasattr(layer, "cv1"):
            hooks.append(layer.cv1.bn.register_forward_hook(lambda m, i, o: stds.append(float(o.detach().std()))))
    model(imgs)
    for h in hooks:
        h.remove()
    return stds


def level_report(model: Model, loss: ComputeLoss, preds, targets) -> list[str]:
    """Per level: stride, anchors (px), positives share, mean initial objectness probability."""
    _, _, indices, _ = loss.build_targets(preds, targets)
    total = sum(len(ix[0]) for ix in indices) or 1
    detect = model.model[-1]
    lines = []
    for i, (p, ix) in enumerate(zip(preds, indices)):
        s = float(detect.stride[i])
        anchors = (detect.anchors[i] * s).round().int().tolist()
        obj = float(p[..., 4].detach().sigmoid().mean())
        lines.append(f"  P{i} stride {s:>4.0f}: anchors {anchors}  positives {len(ix[0]) / total:5.1%} "
                     f"({len(ix[0])})  init obj p {obj:.2e}  balance {loss.balance[i]}")
    return lines


def diagnose(name: str, cfg: Path, data: dict, imgsz: int, steps: int, batch: int, seed: int) -> None:
    """Print the diagnostics for one variant."""
    torch.manual_seed(seed)
    hyp = yaml_load(HYP)
    model = Model(cfg, nc=int(data["nc"]))
    loader, dataset = create_dataloader(data["train"], imgsz, batch, int(model.stride.max()), hyp=hyp,
                                        augment=False, shuffle=True, seed=seed, workers=0, nc=int(data["nc"]))
    check_anchors(dataset, model, thr=hyp["anchor_t"], imgsz=imgsz, seed=seed)
    compute_loss = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, int(data["nc"]), imgsz))
    optimizer = torch.optim.SGD(model.parameters(), lr=hyp["lr0"], momentum=0.9, nesterov=True)
    model.train()
    print(f"\n== {name}: {sum(p.numel() for p in model.parameters()):,} parameters")
    step, batches = 0, iter(loader)
    while step < steps:
        try:
            imgs, targets, _, _ = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        imgs = imgs.float() / 255
        if step == 0:
            print("  BN std after each FFM:", [round(v, 3) for v in ffm_bn_scale(model, imgs)] or "n/a")
        optimizer.zero_grad()
        preds = model(imgs)
        total, items = compute_loss(preds, targets)
        if step == 0:
            print("\n".join(level_report(model, compute_loss, preds, targets)))
        total.backward()
        if step in (0, 1, 2, 5) or step % 10 == 9 or step == steps - 1:
            norms = "  ".join(f"{k} {v:.3g}" for k, v in sorted(grad_norms(model).items()))
            print(f"  step {step:>3}: loss box {items[0]:.4f} obj {items[1]:.4f} cls {items[2]:.4f} | grad {norms}")
        optimizer.step()
        step += 1


RULES = OptionRules(positive=("imgsz", "steps", "batch_size"), non_negative=("seed",), files=("data",))


@exit_on_user_error
def main(argv=None) -> None:
    parser = parser_for("benchmarks.studies.accuracy_diagnostics", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["yolov5n-p2", "ffca-yolo-n"])
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None, help="data YAML (default: generated tiny-shapes, 160 px)")
    args = parse_checked(parser, RULES, argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = check_dataset(args.data or make_tiny_shapes(Path(tmp) / "tiny-shapes", n_train=128, n_val=16,
                                                           seed=args.seed))
        for name in args.variants:
            diagnose(name, variant_yaml(name, Path(tmp) / "models"), data, args.imgsz, args.steps,
                     args.batch_size, args.seed)


if __name__ == "__main__":
    main()
