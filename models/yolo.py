"""YOLO detection models built from YOLOv5-schema YAML files, without ``eval``.

A model YAML has ``nc``, ``depth_multiple``, ``width_multiple``, ``anchors`` (a list of per-level
``[w, h, w, h, ...]`` pixel sizes, or an integer count per level for placeholders that AutoAnchor
replaces) and ``backbone``/``head`` rows ``[from, number, module, args]``. Module names resolve
through a registry: ``nn.Name`` is ``torch.nn.Name``, project modules by class name, and user
modules via :func:`register_module`.

Usage: ``python models/yolo.py --cfg models/ffca-yolo.yaml [--imgsz 640] [--nc N]``
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import math  # noqa: E402
from copy import deepcopy  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from models.common import C3, SPP, SPPF, Bottleneck, Concat, Conv, DWConv, Focus  # noqa: E402
from models.ffca import FEM, SCAM, C3_Faster, FFM_Concat2, FFM_Concat3  # noqa: E402
from utils.autoanchor import check_anchor_order_stride_units  # noqa: E402
from utils.errors import UserError, exit_on_user_error, first_line  # noqa: E402
from utils.files import yaml_load  # noqa: E402
from utils.logging import LOGGER  # noqa: E402
from utils.ops import make_divisible  # noqa: E402
from utils.options import OneLineErrorParser, find_repo_file  # noqa: E402
from utils.torch_utils import model_info  # noqa: E402

STRIDE_PROBE_SIZE = 128  # square input for the forward pass that measures strides
ARG_STYLES = ("in_out", "in_out_repeat", "same", "concat", "weighted_concat", "raw", "detect")


# ----------------------------------------------------------------------------- Detect head
def placeholder_anchors(nl: int, na: int) -> torch.Tensor:
    """``(nl, na, 2)`` anchors in stride units for ``anchors: na`` YAMLs, until AutoAnchor fits them.

    Every level gets the same sizes in stride units (1.5 to 6 strides, alternating square, tall and
    wide), so in pixels they grow with the stride like YOLOv5's COCO anchors.
    """
    ratios = ((1.0, 1.0), (0.7, 1.4), (1.4, 0.7))
    sizes = [1.5 * 4 ** (k / (na - 1)) if na > 1 else 3.0 for k in range(na)]
    level = torch.tensor([[s * ratios[k % 3][0], s * ratios[k % 3][1]] for k, s in enumerate(sizes)])
    return level.expand(nl, na, 2).clone()


class Detect(nn.Module):
    """YOLOv5 detection head: one 1x1 conv per level to ``na * (nc + 5)`` channels.

    ``anchors`` is a list of ``nl`` pixel lists ``[w0, h0, w1, h1, ...]`` or an int (placeholders).
    The ``anchors`` buffer ``(nl, na, 2)`` holds pixel sizes until :class:`DetectionModel` measures
    the strides and converts it to stride units (placeholders are created in stride units).

    Training forward: list of ``(bs, na, ny, nx, nc + 5)`` raw logits. Eval forward:
    ``(pred, raw)`` with ``pred`` ``(bs, N, nc + 5)``: xywh in input pixels, sigmoid scores.
    """

    def __init__(self, nc: int = 80, anchors=3, ch=()):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(ch)
        self.placeholder = isinstance(anchors, int)  # anchors came from a count, not from sizes
        if self.placeholder:
            self.na = anchors
            anchor_tensor = placeholder_anchors(self.nl, self.na)
        else:
            self.na = len(anchors[0]) // 2
            anchor_tensor = torch.tensor(anchors, dtype=torch.float32).view(self.nl, self.na, 2)
        self.register_buffer("anchors", anchor_tensor)
        self.register_buffer("stride", torch.zeros(self.nl), persistent=False)
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)

    def forward(self, xs: list[torch.Tensor]):
        raw = []
        for i, conv in enumerate(self.m):
            y = conv(xs[i])
            bs, _, ny, nx = y.shape
            raw.append(y.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous())
        if self.training:
            return raw
        return torch.cat([self._decode(y, i) for i, y in enumerate(raw)], 1), raw

    def _decode(self, y: torch.Tensor, i: int) -> torch.Tensor:
        """``(bs, na, ny, nx, no)`` logits -> ``(bs, na*ny*nx, no)`` pixel xywh and sigmoid scores."""
        bs, _, ny, nx, _ = y.shape
        stride = self.stride[i]
        gy, gx = torch.meshgrid(torch.arange(ny, device=y.device, dtype=y.dtype),
                                torch.arange(nx, device=y.device, dtype=y.dtype), indexing="ij")
        grid = torch.stack((gx, gy), -1).view(1, 1, ny, nx, 2) - 0.5
        anchor_px = (self.anchors[i] * stride).view(1, self.na, 1, 1, 2).to(y.dtype)
        xy, wh, scores = y.sigmoid().split((2, 2, self.nc + 1), 4)
        xy = (xy * 2 + grid) * stride
        wh = (wh * 2) ** 2 * anchor_px
        return torch.cat((xy, wh, scores), 4).view(bs, -1, self.no)

    @torch.no_grad()
    def initialize_biases(self) -> None:
        """YOLOv5's priors: objectness ~8 objects per 640 image per level, classes ~0.6/nc."""
        for conv, s in zip(self.m, self.stride.tolist()):
            b = conv.bias.view(self.na, -1)
            b[:, 4] += math.log(8 / (640 / s) ** 2)
            b[:, 5:5 + self.nc] += math.log(0.6 / (self.nc - 0.99999))


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class ModuleSpec:
    """How the parser builds a module: its class and how YAML args become constructor args.

    Styles: ``in_out`` ``(c1, c2, *args)`` with ``c2 = args[0]`` width-scaled; ``in_out_repeat``
    also inserts the row's repeats as ``n``; ``same`` ``(c1, *args)`` keeping channels; ``concat``
    args as given, channels summed; ``weighted_concat`` ``(input_channels, *args)``, channels summed;
    ``raw`` args as given, channels kept; ``detect`` the detection head.
    """

    cls: type
    style: str


_REGISTRY: dict[str, ModuleSpec] = {}
_NN_STYLES = {"BatchNorm2d": "same", "Conv2d": "in_out", "ConvTranspose2d": "in_out"}


def register_module(cls=None, *, name: str | None = None, style: str = "in_out", override: bool = False):
    """Make an ``nn.Module`` class usable by name in model YAMLs; works as a decorator or a call.

    ``@register_module(style="same")`` on ``class MyAttention(nn.Module)`` taking ``(c1, ...)``
    lets a YAML row say ``[-1, 1, MyAttention, [...]]``. See :class:`ModuleSpec` for styles.
    """

    def add(module_cls):
        key = name or module_cls.__name__
        if not (isinstance(module_cls, type) and issubclass(module_cls, nn.Module)):
            raise TypeError(f"register_module: {module_cls!r} is not an nn.Module subclass")
        if style not in ARG_STYLES:
            raise ValueError(f"register_module: style {style!r} is not one of {ARG_STYLES}")
        if key.startswith("nn."):
            raise ValueError(f"register_module: name {key!r} may not start with 'nn.' (reserved for torch.nn)")
        existing = _REGISTRY.get(key)
        if existing and existing.cls is not module_cls and not override:
            raise ValueError(f"register_module: {key!r} is already registered to {existing.cls!r}; "
                             "pass override=True to replace it")
        _REGISTRY[key] = ModuleSpec(module_cls, style)
        return module_cls

    return add if cls is None else add(cls)


for _cls in (Conv, DWConv, Bottleneck, SPP, SPPF, Focus, FEM):
    register_module(_cls, style="in_out")
for _cls in (C3, C3_Faster):
    register_module(_cls, style="in_out_repeat")
register_module(SCAM, style="same")
register_module(Concat, style="concat")
register_module(FFM_Concat2, style="weighted_concat")
register_module(FFM_Concat3, style="weighted_concat")
register_module(Detect, style="detect")


def known_module_names() -> list[str]:
    """Registered module names (``nn.*`` names are also accepted)."""
    return sorted(_REGISTRY)


def resolve_module(name) -> ModuleSpec | None:
    """``'nn.Upsample'`` -> torch.nn.Upsample, ``'C3'`` -> registered class; None if unknown."""
    if not isinstance(name, str):
        return None
    if name.startswith("nn."):
        attr = getattr(nn, name[3:], None)
        if isinstance(attr, type) and issubclass(attr, nn.Module):
            return ModuleSpec(attr, _NN_STYLES.get(name[3:], "raw"))
        return None
    return _REGISTRY.get(name)


def unregistered_blocks(cfg: dict) -> list[str]:
    """Module names of ``cfg``'s backbone and head rows that resolve to nothing (a user's block not loaded)."""
    rows = [row for section in ("backbone", "head") for row in (cfg.get(section) or [])
            if isinstance(row, list) and len(row) == 4]
    return sorted({row[2] for row in rows if isinstance(row[2], str) and resolve_module(row[2]) is None})


# ----------------------------------------------------------------------------- parser
_LITERALS = {"None": None, "True": True, "False": False}


def resolve_arg(value, cfg: dict):
    """Turn YAML names into values: ``nc``/``anchors`` from the YAML dict, ``None``/``True``/``False``.

    Any other string (e.g. ``nearest``) stays a string; nothing is evaluated.
    """
    if isinstance(value, list):
        return [resolve_arg(v, cfg) for v in value]
    if isinstance(value, str):
        if value in ("nc", "anchors"):
            return cfg[value]
        return _LITERALS.get(value, value)
    return value


class _RowError(Exception):
    """A problem in one YAML row; parse_model adds the file and row position."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_from(f, i: int) -> list[int]:
    """Validate a row's ``from`` for layer ``i``; return it as absolute indices (-1 = model input)."""
    items = f if isinstance(f, list) else [f]
    if not items or not all(_is_int(j) for j in items):
        raise _RowError(f"'from' must be an int or a list of ints, got {f!r}")
    absolute = []
    for j in items:
        a = i + j if j < 0 else j
        if j >= i or (a < 0 and not (j == -1 and i == 0)):
            raise _RowError(f"'from' index {j} does not name an earlier layer (this is layer {i})")
        absolute.append(a)
    return absolute


def _check_anchors(anchors, n_levels: int):
    """Validate Detect's anchors: a positive int, or ``n_levels`` equal-length even lists of numbers."""
    if _is_int(anchors):
        if anchors < 1:
            raise _RowError(f"anchors count must be a positive int, got {anchors}")
        return
    if not isinstance(anchors, list) or len(anchors) != n_levels:
        raise _RowError(f"anchors must be an int or {n_levels} lists (one per Detect input), got {anchors!r}")
    lengths = {len(a) if isinstance(a, list) else -1 for a in anchors}
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                  for a in anchors if isinstance(a, list) for v in a)
    if len(lengths) != 1 or min(lengths) < 2 or min(lengths) % 2 or not numbers:
        raise _RowError(f"anchors must be lists of positive [w, h, w, h, ...] pixel sizes "
                        f"of equal length per level, got {anchors!r}")


def _build_args(spec: ModuleSpec, args: list, n: int, c_in: list[int], gw: float):
    """Constructor args, output channels and remaining repeats for one row (see ModuleSpec)."""
    c1 = c_in[0]
    style = spec.style
    if style in ("in_out", "in_out_repeat"):
        if not args or not _is_int(args[0]) or args[0] < 1:
            raise _RowError(f"first argument must be the output channels (positive int), got {args!r}")
        c2 = make_divisible(args[0] * gw, 8)
        args = [c1, c2, *args[1:]]
        if style == "in_out_repeat":
            args.insert(2, n)
            n = 1
        return args, c2, n
    if style == "same":
        return [c1, *args], c1, n
    if style == "concat":
        return args, sum(c_in), n
    if style == "weighted_concat":
        return [list(c_in), *args], sum(c_in), n
    if style == "detect":
        if len(args) < 2:
            raise _RowError(f"Detect args must be [nc, anchors], got {args!r}")
        if not _is_int(args[0]) or args[0] < 1:
            raise _RowError(f"Detect nc must be a positive int, got {args[0]!r}")
        _check_anchors(args[1], len(c_in))
        return [args[0], args[1], list(c_in)], None, n
    return args, c1, n


def _parse_row(row, i: int, ch: list[int], cfg: dict, gd: float, gw: float):
    """Build layer ``i`` from one ``[from, number, module, args]`` row; return (layer, c2, from)."""
    if not isinstance(row, list) or len(row) != 4:
        raise _RowError(f"expected [from, number, module, args], got {row!r}")
    f, n, name, args = row
    sources = _check_from(f, i)
    if not _is_int(n) or n < 1:
        raise _RowError(f"number of repeats must be a positive int, got {n!r}")
    spec = resolve_module(name)
    if spec is None:
        raise _RowError(f"unknown module {name!r} (known: {', '.join(known_module_names())}, nn.*; "
                        "register your own with models.yolo.register_module and pass its file with --modules)")
    if not isinstance(args, list):
        raise _RowError(f"args must be a list, got {args!r}")
    try:
        args = resolve_arg(args, cfg)
    except KeyError as e:
        raise _RowError(f"argument {e.args[0]!r} needs a top-level {e.args[0]!r} key in the YAML") from None
    n = max(round(n * gd), 1) if n > 1 else n
    c_in = [ch[-1] if a == -1 else ch[a] for a in sources]  # ch[-1] is the model input at layer 0
    args, c2, n = _build_args(spec, args, n, c_in, gw)
    try:
        layer = nn.Sequential(*(spec.cls(*args) for _ in range(n))) if n > 1 else spec.cls(*args)
    except (TypeError, ValueError) as e:
        raise _RowError(f"{name}{tuple(args)} could not be built: {e}") from None
    layer.i, layer.f, layer.n, layer.args = i, f, n, args
    layer.type = f"{spec.cls.__module__}.{spec.cls.__qualname__}"
    layer.np = sum(p.numel() for p in layer.parameters())
    return layer, c2, f


def _check_top_level(d: dict, source: str) -> tuple[float, float]:
    """Validate ``nc``, multiples and sections; return (depth_multiple, width_multiple)."""
    for key in ("nc", "backbone", "head"):
        if key not in d:
            raise UserError(f"{source}: missing top-level key '{key}'; see models/yolov5s.yaml for the schema")
    if not _is_int(d["nc"]) or d["nc"] < 1:
        raise UserError(f"{source}: nc must be a positive int (number of classes), got {d['nc']!r}")
    multiples = []
    for key in ("depth_multiple", "width_multiple"):
        value = d.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UserError(f"{source}: {key} must be a positive number, got {value!r}")
        multiples.append(float(value))
    for key in ("backbone", "head"):
        if not isinstance(d[key], list) or not d[key]:
            raise UserError(f"{source}: '{key}' must be a non-empty list of [from, number, module, args] rows")
    return multiples[0], multiples[1]


def parse_model(d: dict, ch: list[int], source: str = "model dict") -> tuple[nn.Sequential, list[int]]:
    """Build the layers of a model YAML dict ``d`` for ``ch = [input_channels]``.

    Returns ``(layers, save)``: an ``nn.Sequential`` whose layers carry ``.i``, ``.f``, ``.n``,
    ``.args``, ``.type``, ``.np``, and the sorted indices of layers whose outputs later layers read.
    Any problem in ``d`` raises UserError naming ``source``, the section row and the value.
    """
    gd, gw = _check_top_level(d, source)
    rows = [("backbone", j, row) for j, row in enumerate(d["backbone"])]
    rows += [("head", j, row) for j, row in enumerate(d["head"])]
    layers, save, ch_out = [], set(), []
    for i, (section, j, row) in enumerate(rows):
        try:
            layer, c2, f = _parse_row(row, i, ch_out if i else ch, d, gd, gw)
        except _RowError as e:
            raise UserError(f"{source}: {section} row {j} (layer {i}): {e}") from None
        save.update(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        layers.append(layer)
        ch_out.append(c2)
    return nn.Sequential(*layers), sorted(save)


# ----------------------------------------------------------------------------- model
def _load_cfg(cfg) -> tuple[dict, str, str | None]:
    """``cfg`` path or dict -> (deep-copied plain dict, source name for messages, YAML file name)."""
    if isinstance(cfg, dict):
        return deepcopy(cfg), "model dict", None
    if isinstance(cfg, (str, Path)):
        path = Path(cfg)
        if path.suffix not in (".yaml", ".yml"):
            raise UserError(f"{cfg}: model config must be a .yaml file (e.g. models/ffca-yolo.yaml)")
        return yaml_load(path), str(cfg), path.name
    raise UserError(f"model config must be a YAML path or dict, got {type(cfg).__name__}")


class DetectionModel(nn.Module):
    """A YOLO detector built from a YAML path or dict; see docs/architecture.md for the contract.

    ``nc``/``anchors`` override the YAML's values (logged). ``model.yaml`` stays a plain dict
    so checkpoints can store it. Input ``(bs, ch, H, W)`` with H, W multiples of the max stride.
    """

    def __init__(self, cfg, ch: int = 3, nc: int | None = None, anchors=None):
        super().__init__()
        self.yaml, source, self.yaml_file = _load_cfg(cfg)
        ch = self.yaml["ch"] = self.yaml.get("ch", ch)
        if not _is_int(ch) or ch < 1:
            raise UserError(f"{source}: ch (input channels) must be a positive int, got {ch!r}")
        if nc is not None and nc != self.yaml.get("nc"):
            LOGGER.info(f"Overriding {source} nc={self.yaml.get('nc')} with nc={nc}")
            self.yaml["nc"] = nc
        if anchors:  # a count (hyp files give e.g. 3.0) or per-level pixel lists; 0/None keep the YAML's
            if isinstance(anchors, (int, float)) and not isinstance(anchors, bool):
                anchors = round(anchors)
            LOGGER.info(f"Overriding {source} anchors with anchors={anchors}")
            self.yaml["anchors"] = anchors
        self.model, self.save = parse_model(deepcopy(self.yaml), ch=[ch], source=source)
        detect = self.model[-1]
        if not isinstance(detect, Detect):
            raise UserError(f"{source}: the last head row must be a Detect layer, got {detect.type}")
        self.nc = self.yaml["nc"]
        self.names = [str(i) for i in range(self.nc)]
        self._init_detect(detect, ch, source)

    @torch.no_grad()
    def _init_detect(self, detect: Detect, ch: int, source: str) -> None:
        """Measure strides with an eval-mode probe (no BN-statistic or RNG side effects), then
        put anchors in stride units and set the bias priors."""
        was_training = self.training
        self.eval()
        probe = torch.zeros(1, ch, STRIDE_PROBE_SIZE, STRIDE_PROBE_SIZE)
        try:
            features = self._forward_layers(probe, stop_at_detect=True)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"{source}: a {STRIDE_PROBE_SIZE}x{STRIDE_PROBE_SIZE} probe forward failed "
                            f"({first_line(e)}); check the rows' 'from' indices and channels") from None
        finally:
            self.train(was_training)
        detect.stride.copy_(torch.tensor([STRIDE_PROBE_SIZE / x.shape[-2] for x in features]))
        if not detect.placeholder:
            detect.anchors /= detect.stride.view(-1, 1, 1)
            check_anchor_order_stride_units(detect)
        detect.initialize_biases()

    @property
    def stride(self) -> torch.Tensor:
        """``(nl,)`` float strides of the detection levels, e.g. ``[4., 8., 16.]``."""
        return self.model[-1].stride

    def forward(self, x: torch.Tensor):
        """``(bs, ch, H, W)`` -> Detect's output (training list or eval ``(pred, raw)``)."""
        return self._forward_layers(x)

    def _forward_layers(self, x: torch.Tensor, stop_at_detect: bool = False):
        """Run the layers, routing saved outputs; optionally return Detect's inputs instead."""
        outputs = []
        for layer in self.model:
            if layer.f != -1:
                x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
            if stop_at_detect and layer is self.model[-1]:
                return x
            x = layer(x)
            outputs.append(x if layer.i in self.save else None)
        return x

    def fuse(self) -> DetectionModel:
        """Fold every Conv's BatchNorm into its convolution (for inference); returns self."""
        for m in self.modules():
            if isinstance(m, Conv):
                m.fuse()
        return self

    def info(self, verbose: bool = False, imgsz: int = 640) -> tuple:
        """Log ``NAME summary: L layers, P parameters, G gradients, X GFLOPs``; return ``(L, P, G, X)``."""
        return model_info(self, verbose=verbose, imgsz=imgsz)


Model = DetectionModel


# ----------------------------------------------------------------------------- summary
def layer_table(model: DetectionModel) -> str:
    """Per-layer table: index, from, repeats, parameters, module, constructor arguments."""
    lines = [f"{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<40}{'arguments':<30}"]
    for layer in model.model:
        lines.append(f"{layer.i:>3}{str(layer.f):>18}{layer.n:>3}{layer.np:10.0f}  "
                     f"{layer.type:<40}{str(layer.args):<30}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line
def parse_opt(argv=None) -> argparse.Namespace:
    """Command-line options of ``python models/yolo.py``."""
    parser = OneLineErrorParser(prog="python models/yolo.py",
                                description="Build a model YAML and print its layers and summary.")
    parser.add_argument("--cfg", type=str, default="models/ffca-yolo.yaml", help="model YAML path")
    parser.add_argument("--imgsz", type=int, default=640, help="image size for the GFLOPs figure")
    parser.add_argument("--nc", type=int, default=None, help="override the YAML's number of classes")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> None:
    """Print the per-layer table and summary line of ``--cfg``."""
    opt = parse_opt(argv)
    if opt.imgsz < 1:
        raise UserError(f"--imgsz must be a positive int, got {opt.imgsz}")
    if opt.nc is not None and opt.nc < 1:
        raise UserError(f"--nc must be a positive int, got {opt.nc}")
    model = DetectionModel(find_repo_file(opt.cfg, "--cfg"), nc=opt.nc)
    LOGGER.info(layer_table(model))
    model.info(imgsz=opt.imgsz)


if __name__ == "__main__":
    # Run the imported module's main so layer types read models.yolo.*, not __main__.*
    from models.yolo import main as package_main

    package_main()
