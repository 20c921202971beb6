"""Why FFCA-YOLO-n learns slower than yolov5n-p2: scale, gradient and BatchNorm statistics per module.

Both models train on one matrix cell (default glyphs, 256 px, seed 1, where yolov5n-p2 starts at epoch
16 and FFCA-YOLO-n at 23) with the matrix's recipe (30-epoch schedule, ``train.py --save-period``), and
each run is stopped once the last checkpoint asked for is written. Then, for a freshly initialised model
(same seed, AutoAnchor's anchors) and each checkpoint, one fixed batch of training images (no
augmentation) goes forward and backward in training mode, and the command prints:

- per layer: output RMS, RMS of the loss gradient at the output, and the norm of the parameter gradient
  relative to the parameters' norm (the size of an SGD step at a given learning rate);
- the same for the layers both models share (stem, backbone, head C3s), with FFCA-YOLO-n / yolov5n-p2;
- per FFCA module whether it is near identity: FEM's residual branch RMS over its shortcut's, the share
  of FEM outputs its final ReLU zeroes, and how much of the input a linear read-out of the output
  recovers (R^2; 1 for an identity); SCAM's added branch RMS over its input's and its gate; FFM's
  normalised channel weights;
- the BatchNorms in and around each FFCA module in eval mode: mean |gamma| and how far the running
  statistics are from the statistics of the batch (the mismatch validation sees).

    python -m benchmarks.accuracy.module_stats --out runs/module-stats     # trains both models, ~20 min
    python -m benchmarks.accuracy.module_stats --trained runs/x/weights/best.pt   # measures only, seconds

With ``--out`` the runs are kept and a second call only measures. ``--trained`` trains nothing: it prints
the FFCA-module lines for the weights each checkpoint validates (the EMA), on a batch of its own
training data at its own image size.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.accuracy.matrix import KINDS, make_data
from benchmarks.accuracy.variants import VARIANTS, variant_yaml
from benchmarks.cli import parse_checked, parser_for, request_stop_with_parent
from models.experimental import stored_model
from models.ffca import FEM, SCAM, _WeightedConcat
from models.yolo import Model
from utils.dataloaders import create_dataloader
from utils.dataset.data_config import check_dataset
from utils.errors import UserError, exit_on_user_error
from utils.files import yaml_load
from utils.loss import ComputeLoss, scale_loss_gains
from utils.options import OptionRules
from utils.training.checkpoints import float_weights, inference_weights, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
HYP = ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"
FFCA = "ffca-yolo-n-published"  # the authors' initialisation, whose start this study measured (issue 38)
MODELS = ("yolov5n-p2", FFCA)
# Layers both models have, by role: (role, yolov5n-p2 row, ffca-yolo-n row) of their YAML files.
SHARED = (("stem conv s2", 0, 0), ("conv s4", 1, 1), ("C3 s4", 2, 2), ("conv s8", 3, 4), ("C3 s8", 4, 5),
          ("conv s16", 5, 7), ("C3 s16", 6, 8), ("SPPF", 7, 9), ("head C3 P3 (top-down)", 11, 13),
          ("head C3 P2 out", 15, 17), ("head C3 P3 out", 18, 20), ("head C3 P4 out", 21, 23))
READOUT_PIXELS = 4096  # pixels sampled for the linear read-out of a module's input from its output


def train_until(model: str, data: Path, opt, out: Path) -> Path:
    """Train ``model`` with the matrix recipe in a child process until ``epoch{last}.pt`` exists, then stop it
    with SIGINT (train.py's graceful stop); returns the run's weights folder. An existing checkpoint is kept."""
    weights = out / "runs" / model / "weights"
    last = weights / f"epoch{max(opt.epochs_at)}.pt"
    if last.exists():
        return weights
    cmd = [sys.executable, str(ROOT / "train.py"), "--weights", "", "--cfg", str(variant_yaml(model, out / "models")),
           "--data", str(data), "--imgsz", str(opt.size), "--epochs", str(opt.schedule), "--batch-size", "16",
           "--workers", "0", "--seed", str(opt.seed), "--noplots", "--save-period", str(opt.save_period),
           "--project", str(out / "runs"), "--name", model, "--exist-ok", "--hyp", str(opt.hyp)]
    print(" ".join(cmd), flush=True)
    with open(out / f"{model}.log", "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                 preexec_fn=request_stop_with_parent)
        while child.poll() is None and not last.exists():
            time.sleep(5)
        child.send_signal(signal.SIGINT)
        child.wait()
    if not last.exists():
        raise UserError(f"training {model} stopped before {last.name}; see {out / f'{model}.log'}")
    return weights


def fixed_batch(data_yaml: Path, imgsz: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` training images (no augmentation) as ``(imgs float (n, 3, s, s), targets (k, 6))``."""
    data = check_dataset(data_yaml)
    loader, _ = create_dataloader(data["train"], imgsz, n, 32, hyp=yaml_load(HYP), augment=False, shuffle=False,
                                  workers=0, nc=int(data["nc"]))
    imgs, targets, _, _ = next(iter(loader))
    return imgs.float() / 255, targets


def model_at(weights: Path, epoch: int | None, seed: int) -> Model:
    """The trained (not EMA) model of ``epoch{epoch}.pt``, or for ``None`` a fresh one (seeded) with the run's anchors."""
    ckpt = load_checkpoint(weights / f"epoch{epoch if epoch is not None else 0}.pt")
    state = float_weights(ckpt["model"])
    if epoch is None:
        torch.manual_seed(seed)
        model = Model(ckpt["model_cfg"], nc=ckpt.get("nc"))
        model.model[-1].anchors.copy_(state[f"model.{len(model.model) - 1}.anchors"])
        return model
    model = Model(ckpt["model_cfg"], nc=ckpt.get("nc"))
    model.load_state_dict(state)
    return model


def trained_model(path: Path) -> tuple[Model, Path, int]:
    """The weights a train.py checkpoint validates (its EMA), the data YAML it trained on and its image size."""
    ckpt = load_checkpoint(path)
    opt = ckpt.get("opt") or {}
    if not opt.get("data") or not opt.get("imgsz"):
        raise UserError(f"{path}: the checkpoint does not record its training data and image size (opt.data, "
                        "opt.imgsz); pass a last.pt or best.pt that train.py wrote")
    return stored_model(ckpt, inference_weights(ckpt, path), path), Path(opt["data"]), int(opt["imgsz"])


def fresh_variant(name: str, out: Path, seed: int, anchors_from: Path) -> Model:
    """Variant ``name`` freshly initialised (seeded) with the anchors AutoAnchor gave the yolov5n-p2 run."""
    reference = model_at(anchors_from, None, seed)
    torch.manual_seed(seed)
    model = Model(variant_yaml(name, out / "models"), nc=reference.model[-1].nc)
    model.model[-1].anchors.copy_(reference.model[-1].anchors)
    return model


def rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt())


def layer_stats(model: Model, imgs: torch.Tensor, targets: torch.Tensor, hyp: dict) -> dict[int, dict]:
    """Per layer row (Detect excluded): output RMS, loss-gradient RMS at the output, |grad| / |w| of its parameters."""
    model = deepcopy(model).train()
    outputs: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(_module, _inputs, out):
            out.retain_grad()
            outputs[i] = out
        return hook

    hooks = [m.register_forward_hook(keep(i)) for i, m in enumerate(model.model[:-1])]
    try:
        preds = model(imgs)
    finally:
        for h in hooks:
            h.remove()
    detect = model.model[-1]
    loss, _ = ComputeLoss(model, scale_loss_gains(hyp, detect.nl, detect.nc, imgs.shape[-1]))(preds, targets)
    loss.backward()
    stats = {}
    for i, layer in enumerate(model.model):
        params = [p for p in layer.parameters() if p.grad is not None]
        out, grad = outputs.get(i), norm([p.grad for p in params])
        stats[i] = {"module": type(layer).__name__, "out": rms(out) if out is not None else float("nan"),
                    "grad_out": rms(out.grad) if out is not None and out.grad is not None else float("nan"),
                    "grad": grad, "step": grad / max(norm(params), 1e-12)}
    return stats


def norm(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.detach().float().pow(2).sum() for t in tensors)) ** 0.5 if tensors else float("nan")


def readout_r2(x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> float:
    """Share of ``x``'s variance a least-squares linear map from ``y`` (+ bias) recovers, over sampled pixels."""
    xs, ys = (t.detach().permute(0, 2, 3, 1).reshape(-1, t.shape[1]).double() for t in (x, y))
    pick = torch.from_numpy(np.random.default_rng(seed).choice(len(xs), min(READOUT_PIXELS, len(xs)), replace=False))
    xs, ys = xs[pick], ys[pick]
    design = torch.cat((ys, torch.ones(len(ys), 1, dtype=ys.dtype)), 1)
    fit = torch.linalg.lstsq(design, xs).solution
    residual = xs - design @ fit
    return float(1 - residual.pow(2).sum() / (xs - xs.mean(0)).pow(2).sum())


def fem_identity(layer: FEM, x: torch.Tensor) -> str:
    """FEM (training mode): residual branch / shortcut RMS, share zeroed by the final ReLU, read-out R^2."""
    captured = {}
    hook = layer.project.register_forward_hook(lambda _m, _i, out: captured.__setitem__("project", out))
    try:
        y = layer(x)
    finally:
        hook.remove()
    shortcut = layer.shortcut(x)
    branch = layer.scale * captured["project"]
    return (f"branch/shortcut RMS {rms(branch) / rms(shortcut):.4f} (projection BN mean |gamma| "
            f"{float(layer.project.bn.weight.abs().mean()):.4f}), zeroed by ReLU {float((y == 0).float().mean()):.2f}, "
            f"input read-out R^2 {readout_r2(x, y):.3f}")


def scam_identity(layer: SCAM, x: torch.Tensor) -> str:
    """SCAM (training mode): added branch / input RMS, mean gate, read-out R^2."""
    captured = {}
    hook = layer.gate.register_forward_hook(lambda _m, _i, out: captured.__setitem__("gate", out.sigmoid()))
    try:
        y = layer(x)
    finally:
        hook.remove()
    gate = captured["gate"]
    return (f"branch/input RMS {rms(y - x) / rms(x):.3f}, gate mean {float(gate.mean()):.2f} "
            f"(min {float(gate.min()):.2f}, max {float(gate.max()):.2f}), input read-out R^2 {readout_r2(x, y):.3f}")


def ffm_weights(layer: _WeightedConcat) -> str:
    """Normalised channel weights per input: mean, min-max."""
    parts = layer.normalised_weights().detach().split(layer.channels)
    return "weights per input " + ", ".join(f"{float(p.mean()):.2f} ({float(p.min()):.2f}-{float(p.max()):.2f})"
                                             for p in parts)


def module_identity(model: Model, imgs: torch.Tensor) -> list[str]:
    """One line per FFCA module (training mode, on a copy: BatchNorm updates stay there)."""
    model = deepcopy(model).train()
    inputs: dict[int, object] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, i=i: inputs.__setitem__(i, args[0]))
             for i, m in enumerate(model.model) if isinstance(m, (FEM, SCAM, _WeightedConcat))]
    try:
        with torch.no_grad():
            model(imgs)
            lines = []
            for i, x in sorted(inputs.items()):
                layer = model.model[i]
                what = (fem_identity(layer, x) if isinstance(layer, FEM) else scam_identity(layer, x)
                        if isinstance(layer, SCAM) else ffm_weights(layer))
                lines.append(f"  {i:>2} {type(layer).__name__}: {what}")
    finally:
        for h in hooks:
            h.remove()
    return lines


def neighbours(model: Model) -> list[int]:
    """Rows of the FFCA modules, the rows feeding them and the first row after each."""
    rows = set()
    for i, m in enumerate(model.model):
        if isinstance(m, (FEM, SCAM, _WeightedConcat)):
            sources = [m.f] if isinstance(m.f, int) else list(m.f)
            rows |= {i, i + 1, *(i + s if s < 0 else s for s in sources)}
    return sorted(r for r in rows if r < len(model.model) - 1)


def bn_mismatch(model: Model, imgs: torch.Tensor, rows: list[int]) -> list[str]:
    """Per row, over its BatchNorms in eval mode: mean |gamma|, and the batch's statistics against the running ones:
    RMS of (batch mean - running mean) / running std and the geometric mean of batch var / running var."""
    model = deepcopy(model).eval()
    seen: dict[nn.BatchNorm2d, torch.Tensor] = {}
    bns = [(i, bn) for i in rows for bn in model.model[i].modules() if isinstance(bn, nn.BatchNorm2d)]
    hooks = [bn.register_forward_pre_hook(lambda m, args: seen.__setitem__(m, args[0])) for _, bn in bns]
    try:
        with torch.no_grad():
            model(imgs)
    finally:
        for h in hooks:
            h.remove()
    lines = []
    for i in rows:
        mine = [bn for j, bn in bns if j == i and bn in seen]
        if not mine:
            continue
        shift, ratio, gamma = [], [], []
        for bn in mine:
            x = seen[bn].transpose(0, 1).reshape(bn.num_features, -1)
            std = (bn.running_var + bn.eps).sqrt()
            shift.append(((x.mean(1) - bn.running_mean) / std).pow(2))
            ratio.append((x.var(1) + bn.eps).log() - (bn.running_var + bn.eps).log())
            gamma.append(bn.weight.detach().abs())
        lines.append(f"  {i:>2} {type(model.model[i]).__name__:<12} {len(mine):>2} BN:"
                     f" |gamma| {float(torch.cat(gamma).mean()):.3f}"
                     f"  mean shift {float(torch.cat(shift).mean().sqrt()):.2f} sd"
                     f"  var ratio {float(torch.cat(ratio).mean().exp()):.2f}")
    return lines


def layer_table(stats: dict[str, dict[int, dict]]) -> str:
    """Markdown table, one row per layer, columns per checkpoint: output RMS, gradient RMS at it, |grad|/|w|."""
    labels = list(stats)
    head = ["row", "module", *(f"{what} {label}" for what in ("out RMS", "grad RMS", "|g|/|w|") for label in labels)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, first in stats[labels[0]].items():
        cells = [str(i), first["module"], *(f"{stats[label][i][key]:.3g}" for key in ("out", "grad_out", "step")
                                           for label in labels)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shared_table(p2: dict[str, dict[int, dict]], ffca: dict[str, dict[int, dict]]) -> str:
    """The layers both models have: FFCA-YOLO-n / yolov5n-p2 of gradient RMS at the output and |grad|/|w|."""
    labels = list(p2)
    head = ["layer", *(f"{what} {label}" for what in ("grad RMS ratio", "|g|/|w| ratio") for label in labels)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for role, i, j in SHARED:
        cells = [role, *(f"{ffca[label][j][key] / p2[label][i][key]:.2f}" for key in ("grad_out", "step")
                         for label in labels)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


RULES = OptionRules(positive=("size", "schedule", "save_period", "n_train", "n_val", "batch"),
                    non_negative=("seed", "epochs_at"), folders=("out",), files=("hyp",))


def parse_opt(argv=None):
    p = parser_for("benchmarks.accuracy.module_stats", description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="glyphs", choices=KINDS, help="matrix data kind")
    p.add_argument("--size", type=int, default=256, help="image size (data and training)")
    p.add_argument("--seed", type=int, default=1, help="data and training seed")
    p.add_argument("--schedule", type=int, default=30, help="epochs of the learning-rate schedule (the matrix's 30)")
    p.add_argument("--epochs-at", type=int, nargs="+", default=[2, 6, 8],
                   help="0-based epochs measured (multiples of --save-period; warm-up ends in epoch 6 at 256 images)")
    p.add_argument("--save-period", type=int, default=2)
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="images in the measured batch")
    p.add_argument("--hyp", type=Path, default=HYP)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "module-stats", help="runs and data are kept here")
    p.add_argument("--also-init", nargs="+", default=[], choices=VARIANTS,
                   help="also compare these variants, freshly initialised (not trained), with yolov5n-p2 at init")
    p.add_argument("--trained", type=Path, nargs="+", default=[],
                   help="train nothing: print the FFCA modules' lines for these train.py checkpoints")
    opt = parse_checked(p, RULES, argv)
    off = [e for e in opt.epochs_at if e % opt.save_period]
    if off:
        p.error(f"--epochs-at {' '.join(map(str, off))}: not a multiple of --save-period {opt.save_period}")
    return opt


def print_trained(checkpoints: list[Path], batch: int) -> None:
    for path in checkpoints:
        model, data, imgsz = trained_model(path)
        imgs, _ = fixed_batch(data, imgsz, batch)
        print(f"\n{path}: FFCA modules (EMA weights, {batch} training images of {data.name} at {imgsz} px)\n"
              + "\n".join(module_identity(model, imgs)))


@exit_on_user_error
def main(argv=None) -> None:
    opt = parse_opt(argv)
    torch.set_num_threads(1)
    if opt.trained:
        print_trained(opt.trained, opt.batch)
        return
    out = opt.out.resolve()
    data = make_data(opt.kind, opt.size, opt.seed, opt.n_train, opt.n_val, out)
    imgs, targets = fixed_batch(data, opt.size, opt.batch)
    hyp = yaml_load(opt.hyp)
    stats = {}
    for name in MODELS:
        weights = train_until(name, data, opt, out)
        models = {"init": model_at(weights, None, opt.seed),
                  **{f"e{e}": model_at(weights, e, opt.seed) for e in opt.epochs_at}}
        stats[name] = {label: layer_stats(m, imgs, targets, hyp) for label, m in models.items()}
        print(f"\n## {name}: per layer (one batch of {opt.batch} training images, training mode)\n")
        print(layer_table(stats[name]))
        for label, m in models.items():
            if name == FFCA:
                print(f"\n{name} {label}: FFCA modules\n" + "\n".join(module_identity(m, imgs)))
            rows = neighbours(m) if name == FFCA else [i for _, i, _ in SHARED]
            print(f"{name} {label}: BatchNorms (eval mode)\n" + "\n".join(bn_mismatch(m, imgs, rows)))
    print(f"\n## {FFCA} / yolov5n-p2 on the layers both have\n")
    print(shared_table(stats["yolov5n-p2"], stats[FFCA]))
    for name in opt.also_init:
        model = fresh_variant(name, out, opt.seed, anchors_from=out / "runs" / MODELS[0] / "weights")
        print(f"\n## {name} at init / yolov5n-p2 at init\n")
        print(shared_table({"init": stats["yolov5n-p2"]["init"]}, {"init": layer_stats(model, imgs, targets, hyp)}))
        print(f"{name} init: FFCA modules\n" + "\n".join(module_identity(model, imgs)))


if __name__ == "__main__":
    main()
