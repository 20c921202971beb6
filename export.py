"""Export a trained checkpoint to ONNX, TorchScript and/or OpenVINO, then check the written model (YOLOv5's flags).

Usage:
    python export.py --weights runs/train/exp/weights/best.pt --include onnx torchscript openvino --imgsz 640
    python export.py --weights best.pt --include onnx --dynamic          # any batch size and image size

Each model is written beside the checkpoint (best.onnx, best.torchscript, best_openvino_model/ holding
best.xml + best.bin) with its metadata (strides, class names, image size) inside, then loaded again
(ONNX through onnxruntime, OpenVINO through its CPU runtime) and run on the same input as the PyTorch
model; the largest difference is printed and an fp32 export whose outputs differ by more than 1e-4
relative to the output scale fails (exit code 1) and is not kept.
"""

import argparse
import functools
import importlib
import io
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from models.backends import (METADATA_KEYS, OPENVINO_FOLDER, OPENVINO_METADATA,  # noqa: E402
                             TORCHSCRIPT_METADATA, load_backend)
from models.experimental import attempt_load  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.user_modules import load_user_modules  # noqa: E402
from utils.files import atomic_write_bytes, replace_folder  # noqa: E402
from utils.logging import LOGGER, colorstr  # noqa: E402
from utils.ops import check_img_size, is_positive_int, size_list  # noqa: E402
from utils.options import EXPORT_UPSTREAM_FLAGS, OneLineErrorParser, add_modules_flag  # noqa: E402
from utils.torch_utils import select_device  # noqa: E402
from utils.version import add_version_flag  # noqa: E402

ONNX_OPSETS = (7, 20)  # the opsets torch.onnx.export(dynamo=False) accepts, lowest and highest
FORMATS = {"onnx": "{stem}.onnx", "torchscript": "{stem}.torchscript", "openvino": "{stem}" + OPENVINO_FOLDER}
# (import name, pip command) per format; OpenVINO models are converted from the ONNX export
PACKAGES = {"onnx": [("onnx", "onnx onnxruntime")], "openvino": [("onnx", "onnx"), ("openvino", "openvino")]}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}  # largest difference / output scale


class ExportCheckError(Exception):
    """The exported file's outputs differ from PyTorch's by more than the tolerance."""


class PredictionOnly(nn.Module):
    """Wraps a detection model so the exported graph returns ``pred (bs, N, nc + 5)`` alone."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, im: torch.Tensor) -> torch.Tensor:
        return self.model(im)[0]


def export_metadata(model, imgsz, batch, dynamic) -> dict:
    """Plain metadata stored in the exported file (keys :data:`models.backends.METADATA_KEYS`)."""
    meta = {"stride": [float(s) for s in model.stride], "names": list(model.names), "imgsz": list(imgsz),
            "batch": int(batch), "dynamic": bool(dynamic)}
    return {key: meta[key] for key in METADATA_KEYS}


def onnx_bytes(model, im, opset, dynamic, simplify, meta) -> bytes:
    """Serialised ONNX model of ``PredictionOnly(model)`` traced on ``im``, with ``meta`` attached."""
    import onnx

    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 1: "anchors"}}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation and tracer notes
        torch.onnx.export(PredictionOnly(model).eval(), (im,), buffer, dynamo=False, opset_version=opset,
                          input_names=["images"], output_names=["output0"],
                          dynamic_axes=axes if dynamic else None, do_constant_folding=True)
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto)
    if simplify:
        import onnxsim

        proto, ok = onnxsim.simplify(proto)
        if not ok:
            raise ExportCheckError("onnxsim could not verify the simplified model; export without --simplify")
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    return proto.SerializeToString()


def torchscript_bytes(model, im, meta) -> bytes:
    """Serialised traced TorchScript of ``PredictionOnly(model)`` with ``meta`` as config.txt."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes and torch.jit's deprecation notice
        traced = torch.jit.trace(PredictionOnly(model).eval(), im, strict=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer, _extra_files={TORCHSCRIPT_METADATA: json.dumps(meta)})
    return buffer.getvalue()


def relative_difference(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Largest |out - ref| over ``(bs, N, no)`` predictions, relative to the output scale.

    Boxes (xywh pixels) are divided by the largest reference box value; scores are probabilities,
    whose scale is 1.
    """
    if ref.shape != out.shape:
        return float("inf")
    diff = (out.float() - ref.float()).abs()
    box_scale = ref[..., :4].abs().max().clamp(min=1.0)
    return max(float(diff[..., :4].max() / box_scale), float(diff[..., 4:].max()))


def openvino_save(onnx_data: bytes, meta: dict, folder: Path, stem: str) -> None:
    """Convert serialised ONNX to OpenVINO IR with ``meta`` in its runtime info; writes ``folder/stem.xml``
    and ``folder/stem.bin``."""
    import openvino

    model = openvino.convert_model(io.BytesIO(onnx_data))
    for key, value in meta.items():
        model.set_rt_info(json.dumps(value), [OPENVINO_METADATA, key])
    # save_model stores weights as fp16 unless told otherwise; the check and the contract are fp32
    openvino.save_model(model, str(folder / f"{stem}.xml"), compress_to_fp16=False)


def check_export(fmt, candidate, path, model, im, device):
    """Load the written ``candidate`` (to become ``path``) as a backend, run it and ``model`` on ``im``,
    print the largest relative difference; ExportCheckError above the tolerance of ``im``'s dtype."""
    backend = load_backend(candidate, device=device)
    with torch.no_grad():
        ref = model(im)[0]
        out = backend(im)[0]
    difference = relative_difference(ref, out)
    tolerance = TOLERANCE[im.dtype]
    LOGGER.info(f"{colorstr(fmt + ':')} largest difference to PyTorch {difference:.3g} "
                f"(relative to output scale; limit {tolerance:g})")
    if not difference <= tolerance:
        raise ExportCheckError(f"{fmt}: exported outputs differ from PyTorch by {difference:.3g} relative "
                               f"(limit {tolerance:g}); {path} was not written")


def write_and_check(fmt, data, path, model, im, device):
    """Write ``data`` to a sibling temporary file, check it (:func:`check_export`); on success move it
    to ``path``, otherwise delete it and raise ExportCheckError."""
    tmp = path.with_name(f".{path.stem}.check{path.suffix}")
    atomic_write_bytes(tmp, data)
    try:
        check_export(fmt, tmp, path, model, im, device)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    LOGGER.info(f"{colorstr(fmt + ':')} saved {path} ({path.stat().st_size / 1e6:.1f} MB)")


def write_and_check_folder(fmt, write, path, model, im, device):
    """Call ``write(folder)`` on a sibling temporary folder, check it; on success it replaces ``path``
    (:func:`utils.files.replace_folder`), otherwise it is deleted and ExportCheckError raised."""
    tmp = path.with_name(f".{path.name}.check")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        check_export(fmt, tmp, path, model, im, device)
        replace_folder(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in path.iterdir())
    LOGGER.info(f"{colorstr(fmt + ':')} saved {path}/ ({size / 1e6:.1f} MB)")


def export_one(fmt, weights, model, im, opt, meta):
    """Write and check one format; returns its path (a file, or the OpenVINO folder)."""
    weights = Path(weights)
    path = weights.with_name(FORMATS[fmt].format(stem=weights.stem))
    LOGGER.info(f"\n{colorstr(fmt + ':')} exporting {weights} at {tuple(im.shape)} ...")
    try:
        if fmt == "torchscript":
            write_and_check(fmt, torchscript_bytes(model, im, meta), path, model, im, im.device)
            return path
        data = onnx_bytes(model, im, opt.opset, opt.dynamic, opt.simplify, meta)
        if fmt == "onnx":
            write_and_check(fmt, data, path, model, im, im.device)
        else:
            write = functools.partial(openvino_save, data, meta, stem=weights.stem)
            write_and_check_folder(fmt, write, path, model, im, im.device)
    except OSError as e:
        raise UserError(f"{path}: the {fmt} export could not be written ({e.strerror or e}); free disk space or "
                        f"copy {weights.name} to a writable folder; any earlier {path.name} is unchanged") from None
    return path


def check_packages(opt):
    """A UserError with the pip command when a package that the requested formats need is missing."""
    needed = {}
    for fmt in opt.include:
        for module, pip in PACKAGES.get(fmt, ()):
            needed.setdefault(module, pip)
    for module, pip in needed.items():
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"--include {' '.join(opt.include)} needs {module}; pip install {pip}") from None
    if opt.simplify and "onnx" in needed:
        try:
            importlib.import_module("onnxsim")
        except ImportError:
            raise UserError("--simplify needs onnxsim; pip install onnxsim, or drop --simplify") from None


def check_options(opt, device):
    """Validate flag combinations before any work; returns the checked (h, w) image size."""
    unknown = [f for f in opt.include if f not in FORMATS]
    if unknown or not opt.include:
        raise UserError(f"--include {opt.include}: choose from {list(FORMATS)}")
    if not is_positive_int(opt.batch_size):
        raise UserError(f"--batch-size {opt.batch_size!r}: must be a positive integer")
    if not 1 <= len(opt.imgsz) <= 2 or not all(map(is_positive_int, opt.imgsz)):
        raise UserError(f"--imgsz {opt.imgsz}: give one size or 'height width', positive integers")
    if opt.half and "openvino" in opt.include:
        raise UserError("--half: OpenVINO export is fp32 only; drop --half or export openvino separately")
    if opt.half and device.type != "cuda":
        raise UserError("--half needs a CUDA --device (fp16 export is GPU only); drop --half for CPU")
    if opt.half and opt.dynamic:
        raise UserError("--half and --dynamic cannot be combined; choose one")
    low, high = ONNX_OPSETS
    if {"onnx", "openvino"} & set(opt.include) and not (is_positive_int(opt.opset) and low <= opt.opset <= high):
        raise UserError(f"--opset {opt.opset!r}: the ONNX exporter supports opsets {low} to {high}; "
                        f"choose one in that range (default 17)")
    check_packages(opt)
    return opt.imgsz * 2 if len(opt.imgsz) == 1 else opt.imgsz


def run(weights, imgsz=(640,), batch_size=1, include=("torchscript",), dynamic=False, simplify=False, opset=17,
        half=False, device="", modules=()):
    """Export ``weights`` to each format in ``include``; returns the written paths. ``modules``: ``--modules``
    files whose registered blocks the checkpoint's model uses."""
    load_user_modules(modules)
    include = [include] if isinstance(include, str) else list(include)  # "onnx" is one format, not four letters
    opt = argparse.Namespace(weights=weights, imgsz=size_list(imgsz), batch_size=batch_size, include=include,
                             dynamic=dynamic, simplify=simplify, half=half, opset=opset)
    device = select_device(device)
    imgsz = check_options(opt, device)
    model = attempt_load(weights, device=device, fuse=True)
    imgsz = check_img_size(imgsz, stride=int(model.stride.max()))
    generator = torch.Generator().manual_seed(0)
    im = torch.rand(batch_size, 3, *imgsz, generator=generator).to(device)
    if half:
        im, model = im.half(), model.half()
    with torch.no_grad():
        model(im)  # dry run
    meta = export_metadata(model, imgsz, batch_size, dynamic)
    return [export_one(fmt, weights, model, im, opt, meta) for fmt in dict.fromkeys(include)]


def parse_opt(argv=None):
    parser = OneLineErrorParser(prog="python export.py", description=__doc__, upstream_flags=EXPORT_UPSTREAM_FLAGS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=str, required=True, help="checkpoint (.pt) to export")
    parser.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[640], help="image size h w")
    parser.add_argument("--batch-size", type=int, default=1, help="batch size of the exported graph")
    parser.add_argument("--include", nargs="+", default=["torchscript"], help=f"formats: {' '.join(FORMATS)}")
    parser.add_argument("--dynamic", action="store_true", help="any batch size and image size")
    parser.add_argument("--simplify", action="store_true", help="ONNX (and OpenVINO, made from it): onnxsim")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    parser.add_argument("--half", action="store_true", help="FP16 export (CUDA --device only; not OpenVINO)")
    parser.add_argument("--device", default="cpu", help="cuda device, i.e. 0 or cpu")
    add_version_flag(parser)
    add_modules_flag(parser)
    return parser.parse_args(argv)


def cli(argv=None):
    """Command-line entry: user mistakes exit 2, a failed output check exits 1."""
    try:
        exit_on_user_error(lambda: run(**vars(parse_opt(argv))))()
    except ExportCheckError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
