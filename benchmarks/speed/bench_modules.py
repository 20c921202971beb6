"""Forward + backward time of the FFCA modules (FEM, FFM_Concat2/3, SCAM, C3_Faster) at model sizes.

    python -m benchmarks.speed.bench_modules                                  # ffca-yolo-n, ffca-yolo at 160 px
    python -m benchmarks.speed.bench_modules --imgsz 256 --repeats 15
    python -m benchmarks.speed.bench_modules --baseline 57ecaac               # A/B against models/ffca.py at a commit
    python -m benchmarks.speed.bench_modules --whole --baseline 57ecaac       # whole models, same A/B
    python -m benchmarks.speed.bench_modules --whole --nc 4 --models ffca-yolo-n \\
        benchmarks/accuracy/models/yolov5n-p2.yaml

Every FFCA layer of each model is timed on the input shape it gets at ``--imgsz`` (batch
``--batch-size``), in training mode, one forward and one backward with a fixed upstream gradient.
With ``--baseline REV`` the same layers (same weights: the state dict is shared) also run with the
classes of ``models/ffca.py`` at git revision REV; the two are timed alternately, the order
swapped every repeat, and the medians compared, so load from other processes hits both alike.
``err`` and ``base err`` are each implementation's largest difference from the baseline run in
float64 (output, input and parameter gradients; relative to each tensor's largest magnitude): equal
maths shows as errors of the same float32 rounding size.
"""

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from copy import deepcopy
from pathlib import Path

import torch

from models import ffca
from models.yolo import Model
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
MODULE_TYPES = ("FEM", "FFM_Concat2", "FFM_Concat3", "SCAM", "C3_Faster")


def load_baseline(rev: str):
    """``models/ffca.py`` as it was at git revision ``rev``, imported as a separate module."""
    source = subprocess.run(["git", "show", f"{rev}:models/ffca.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "ffca_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("ffca_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_baseline(layer: torch.nn.Module, baseline) -> torch.nn.Module:
    """A copy of ``layer`` (same weights) whose FFCA classes are the baseline's classes of the same name."""
    copy = deepcopy(layer)
    for m in copy.modules():
        if type(m).__module__ == ffca.__name__:
            m.__class__ = getattr(baseline, type(m).__name__)
    return copy


def model_yaml(cfg: str) -> Path:
    """``models/<cfg>.yaml`` for a model name, or ``cfg`` itself when it is a YAML path."""
    return Path(cfg) if cfg.endswith((".yaml", ".yml")) else ROOT / "models" / f"{cfg}.yaml"


def ffca_layers(cfg: str, imgsz: int) -> list[tuple[str, torch.nn.Module, list[tuple[int, ...]]]]:
    """``(label, layer, input shapes at batch 1)`` for every FFCA layer of ``cfg`` at ``imgsz``."""
    model = Model(model_yaml(cfg)).eval()
    shapes = {}
    hooks = [layer.register_forward_pre_hook(
        lambda m, args, i=layer.i: shapes.__setitem__(i, [tuple(t.shape) for t in
                                                          (args[0] if isinstance(args[0], list) else [args[0]])]))
        for layer in model.model if type(layer).__name__ in MODULE_TYPES]
    with torch.no_grad():
        model(torch.zeros(1, 3, imgsz, imgsz))
    for h in hooks:
        h.remove()
    return [(f"{cfg}[{i}] {type(model.model[i]).__name__}", model.model[i].train(), shapes[i]) for i in sorted(shapes)]


class WholeModel(torch.nn.Module):
    """A detection model whose training outputs (one tensor per level) are flattened and joined,
    so that the model times like a single layer."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([level.flatten(1) for level in self.model(x)], 1)


def make_inputs(shapes, batch: int, memory_format=torch.contiguous_format) -> list[torch.Tensor]:
    """Random inputs ``(batch, C, H, W)`` in ``memory_format`` that require grad."""
    return [torch.randn((batch,) + s[1:]).contiguous(memory_format=memory_format).requires_grad_() for s in shapes]


def step(layer, inputs, grad_out) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One seeded forward + backward; returns the output and the input and parameter gradients."""
    for t in inputs:
        t.grad = None
    layer.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # DropPath draws the same samples in both implementations
    out = layer(inputs if len(inputs) > 1 else inputs[0])
    out.backward(grad_out)
    grads = [t.grad for t in inputs] + [p.grad for p in layer.parameters()]
    return out.detach(), grads


def float64_errors(layer, inputs, grad_out, results) -> list[float]:
    """Each implementation's largest error against ``layer`` run in float64 (output and all gradients),
    relative to the float64 tensor's largest magnitude: rounding noise of the float32 run. Gradients
    that are zero in exact arithmetic (a bias just before a BatchNorm) are left out: both
    implementations give rounding noise there."""
    reference = deepcopy(layer).double()
    out64, grads64 = step(reference, [t.detach().double().requires_grad_() for t in inputs], grad_out.double())
    exact = [out64] + grads64
    kept = [i for i, b in enumerate(exact) if b.abs().max() > 1e-9]
    return [max(float((ours[i].double() - exact[i]).abs().max() / exact[i].abs().max()) for i in kept)
            for ours in ([out] + grads for out, grads in results)]


def timed(layer, inputs, grad_out) -> float:
    """CPU seconds of this process for one forward + backward (time spent descheduled by other
    processes on a shared machine does not count, unlike wall time)."""
    start = time.process_time()
    step(layer, inputs, grad_out)
    return time.process_time() - start


def bench_layer(label, layer, shapes, args, baseline) -> str:
    """One table row: median ms (and the baseline's, its ratio and the largest relative difference)."""
    torch.manual_seed(0)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    inputs = make_inputs(shapes, args.batch_size, memory_format)
    layer = layer.to(memory_format=memory_format)
    layers = {"current": layer}
    if baseline is not None:
        layers["baseline"] = as_baseline(layer, baseline)
    with torch.no_grad():
        probe = layer(inputs if len(inputs) > 1 else inputs[0])
    grad_out = torch.randn_like(probe)  # same memory format as the output
    results = {name: step(m, inputs, grad_out) for name, m in layers.items()}
    times = {name: [] for name in layers}
    names = list(layers)
    for r in range(args.warmup + args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t = timed(layers[name], inputs, grad_out)
            if r >= args.warmup:
                times[name].append(t)
    row = f"{label:<34} {str(shapes[0][1:]) if len(shapes) == 1 else '+'.join(str(s[1]) for s in shapes):<16}"
    row += f" {1e3 * statistics.median(times['current']):9.1f}"
    if baseline is not None:
        errors = float64_errors(layers["baseline"], inputs, grad_out, [results["current"], results["baseline"]])
        ratio = statistics.median(times["baseline"]) / statistics.median(times["current"])
        row += f" {1e3 * statistics.median(times['baseline']):9.1f} {ratio:7.2f}x {errors[0]:9.1e} {errors[1]:9.1e}"
    return row


RULES = OptionRules(positive=("nc", "imgsz", "batch_size", "repeats", "threads"), non_negative=("warmup",))


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.bench_modules",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["ffca-yolo-n", "ffca-yolo"],
                   help="model names in models/ or YAML paths (l-ffca-yolo has the C3_Faster layers)")
    p.add_argument("--nc", type=int, default=None, help="classes for --whole (default: the YAML's)")
    p.add_argument("--imgsz", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7, help="timed steps per implementation (median reported)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="+", choices=MODULE_TYPES, help="time only these module types")
    p.add_argument("--baseline", help="git revision whose models/ffca.py to compare against")
    p.add_argument("--channels-last", action="store_true", help="inputs and weights in channels-last memory format")
    p.add_argument("--whole", action="store_true", help="time each whole model instead of its FFCA layers")
    args = parse_checked(p, RULES, argv)
    torch.set_num_threads(args.threads)
    baseline = load_baseline(args.baseline) if args.baseline else None
    header = f"{'layer':<34} {'input':<16} {'ms':>9}"
    if baseline is not None:
        header += f" {'base ms':>9} {'speedup':>8} {'err':>9} {'base err':>9}"
    print(f"forward+backward, batch {args.batch_size}, {args.imgsz} px, {args.threads} thread(s), "
          f"median of {args.repeats}{', channels-last' if args.channels_last else ''}\n{header}")
    if args.whole:
        for cfg in args.models:
            model = Model(model_yaml(cfg), nc=args.nc).train()
            print(bench_layer(f"{cfg} (whole model)", WholeModel(model), [(1, 3, args.imgsz, args.imgsz)], args,
                              baseline), flush=True)
        return
    seen = set()
    for cfg in args.models:
        for label, layer, shapes in ffca_layers(cfg, args.imgsz):
            key = (type(layer).__name__, tuple(shapes))
            if key in seen or (args.only and type(layer).__name__ not in args.only):
                continue
            seen.add(key)
            print(bench_layer(label, layer, shapes, args, baseline), flush=True)


if __name__ == "__main__":
    main()
