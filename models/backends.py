"""One inference interface for every weights format: PyTorch checkpoints, ONNX, TorchScript and OpenVINO.

``load_backend(weights, device)`` returns an :class:`InferenceBackend`, an ``nn.Module`` whose
forward takes ``im`` ``(bs, 3, h, w)`` float in 0-1 and returns ``(pred, raw)``: ``pred``
``(bs, N, nc + 5)`` holds xywh in input pixels and sigmoid scores, exactly as the PyTorch model's
eval forward; ``raw`` is the model's per-level output for checkpoints and None otherwise. Every
backend exposes ``stride`` (float tensor), ``names`` (list of str), ``nc``, ``device``, ``fixed_shape``
(``(bs, h, w)`` of a static export, else None) and ``kind``.

Exported files carry their own metadata (see :data:`METADATA_KEYS`): ONNX in the model's
``metadata_props``, TorchScript in the archive's ``config.txt``, OpenVINO in the model's runtime info
under :data:`OPENVINO_METADATA`; loading needs nothing else. An OpenVINO model is a folder
``NAME_openvino_model/`` holding ``NAME.xml`` and ``NAME.bin``; either the folder or the .xml may be given.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.experimental import attempt_load, weight_paths
from utils.errors import UserError, first_line
from utils.logging import LOGGER
from utils.options import MISSING_FILE_HINTS

METADATA_KEYS = ("stride", "names", "imgsz", "batch", "dynamic")
TORCHSCRIPT_METADATA = "config.txt"
OPENVINO_METADATA = "ffca_yolo"  # runtime-info section: rt_info[OPENVINO_METADATA][key] = json string
OPENVINO_FOLDER = "_openvino_model"  # export.py writes best.pt -> best_openvino_model/best.xml
PAD_VALUE = 114 / 255  # letterbox grey, so a padded static input looks like letterbox padding
SUFFIXES = {".pt": "pytorch", ".onnx": "onnx", ".torchscript": "torchscript", ".xml": "openvino"}


def check_metadata(meta, path) -> dict:
    """Validate exported metadata: every key of METADATA_KEYS present, strides and names sane."""
    missing = [k for k in METADATA_KEYS if k not in meta] if isinstance(meta, dict) else list(METADATA_KEYS)
    if missing:
        raise UserError(f"{path}: exported model has no {missing} metadata; re-export it with this "
                        "project's export.py")
    if not meta["stride"] or not isinstance(meta["names"], list) or not meta["names"]:
        raise UserError(f"{path}: exported metadata has empty 'stride' or 'names'; re-export it with export.py")
    return meta


class InferenceBackend(nn.Module):
    """Base of all backends: metadata attributes plus :meth:`forward` ``im -> (pred, raw)``."""

    kind = "base"

    def __init__(self, stride, names, device, fixed_shape=None):
        super().__init__()
        self.register_buffer("stride", torch.as_tensor(stride, dtype=torch.float32), persistent=False)
        self.names = [str(n) for n in names]
        self.nc = len(self.names)
        self.device = torch.device(device)
        self.fixed_shape = fixed_shape


class PyTorchBackend(InferenceBackend):
    """A checkpoint (or an ensemble of checkpoints) run by PyTorch; ``half()`` works on CUDA.

    The model runs channels-last: oneDNN and cuDNN convolutions are faster in that layout (YOLOv5n
    at 256 px on 2 CPU cores: 1.26x at batch 1, benchmarks/speed/bench_inference.py). The summation order
    differs from the plain layout, so outputs move in the last float bits only.
    """

    kind = "pytorch"

    def __init__(self, model: nn.Module):
        device = next(model.parameters()).device
        super().__init__(model.stride.tolist(), model.names, device)
        self.model = model.to(memory_format=torch.channels_last)

    def forward(self, im: torch.Tensor):
        """``(bs, 3, h, w)`` -> ``(pred (bs, N, no), raw)``, the model's own eval output."""
        return self.model(im.contiguous(memory_format=torch.channels_last))


class _ExportedBackend(InferenceBackend):
    """Shared input handling of exported files: static shapes are honoured by chunking and padding."""

    def forward(self, im: torch.Tensor):
        """``(bs, 3, h, w)`` -> ``(pred (bs, N, no), None)`` in ``im``'s dtype."""
        if self.fixed_shape is None:
            return self._run(im.float()).to(im.dtype), None
        batch, height, width = self.fixed_shape
        h, w = im.shape[2:]
        if h > height or w > width:
            raise UserError(f"input {h}x{w} is larger than the {height}x{width} this model was exported for; "
                            f"use --imgsz {max(height, width)} or re-export with --dynamic")
        im = F.pad(im.float(), [0, width - w, 0, height - h], value=PAD_VALUE)  # right/bottom: boxes stay put
        outputs = []
        for chunk in im.split(batch):
            n = len(chunk)
            if n < batch:
                chunk = torch.cat((chunk, chunk.new_zeros(batch - n, *chunk.shape[1:])))
            outputs.append(self._run(chunk)[:n])
        return torch.cat(outputs).to(im.dtype), None

    def _run(self, im: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class OnnxBackend(_ExportedBackend):
    """An ``.onnx`` file run by ONNX Runtime (CUDA provider when asked for and available)."""

    kind = "onnx"

    def __init__(self, path, device="cpu"):
        try:
            import onnxruntime
        except ImportError:
            raise UserError(f"{path}: running ONNX models needs onnxruntime; pip install onnxruntime") from None
        device = torch.device(device)
        available = onnxruntime.get_available_providers()
        providers = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in available:
            providers.insert(0, "CUDAExecutionProvider")
        elif device.type == "cuda":
            LOGGER.warning(f"{path}: onnxruntime has no CUDA provider here; running on CPU")
            device = torch.device("cpu")
        try:
            session = onnxruntime.InferenceSession(str(path), providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable models
            raise UserError(f"{path}: onnxruntime cannot load this file ({first_line(e)})") from None
        raw = session.get_modelmeta().custom_metadata_map
        meta = check_metadata({k: json.loads(v) for k, v in raw.items() if k in METADATA_KEYS}, path)
        fixed = None if meta["dynamic"] else (meta["batch"], *meta["imgsz"])
        super().__init__(meta["stride"], meta["names"], device, fixed)
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.input_dtype = "float16" if session.get_inputs()[0].type == "tensor(float16)" else "float32"
        self.imgsz = meta["imgsz"]

    def _run(self, im: torch.Tensor) -> torch.Tensor:
        """``(bs, 3, h, w)`` -> float32 ``(bs, N, no)`` on the input's device (fed in the model's input dtype)."""
        feed = im.detach().cpu().contiguous().numpy().astype(self.input_dtype)
        out = self.session.run(None, {self.input_name: feed})[0]
        return torch.from_numpy(out).float().to(im.device)


class TorchScriptBackend(_ExportedBackend):
    """A ``.torchscript`` file written by export.py (a traced model returning ``pred`` only)."""

    kind = "torchscript"

    def __init__(self, path, device="cpu"):
        extra = {TORCHSCRIPT_METADATA: ""}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notice
                module = torch.jit.load(str(path), map_location=torch.device(device), _extra_files=extra)
        except (RuntimeError, ValueError, OSError) as e:
            raise UserError(f"{path}: not a readable TorchScript file ({first_line(e)})") from None
        try:
            meta = json.loads(extra[TORCHSCRIPT_METADATA] or "{}")
        except json.JSONDecodeError:
            meta = {}
        meta = check_metadata(meta, path)
        fixed = None if meta["dynamic"] else (meta["batch"], *meta["imgsz"])
        super().__init__(meta["stride"], meta["names"], device, fixed)
        self.module = module.eval()
        self.imgsz = meta["imgsz"]

    def _run(self, im: torch.Tensor) -> torch.Tensor:
        return self.module(im)


def openvino_xml(path) -> Path:
    """The ``.xml`` of an OpenVINO model given as that file or as its folder (which must hold exactly one)."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.glob("*.xml"))
    if len(found) != 1:
        raise UserError(f"{path}: expected one .xml OpenVINO model in this folder, found {len(found)}; "
                        "re-export with python export.py --include openvino")
    return found[0]


def openvino_metadata(model) -> dict:
    """The :data:`METADATA_KEYS` found in an ``openvino.Model``'s runtime info, JSON-decoded."""
    meta = {}
    for key in METADATA_KEYS:
        if model.has_rt_info([OPENVINO_METADATA, key]):
            try:
                meta[key] = json.loads(model.get_rt_info([OPENVINO_METADATA, key]).astype(str))
            except json.JSONDecodeError:
                pass  # reported as missing by check_metadata
    return meta


def openvino_installed() -> bool:
    """Whether ``import openvino`` works (it is checked before the cached runtime below is used)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def openvino_core():
    """The process's one OpenVINO runtime, kept for the process's lifetime. With a runtime per backend,
    freed with it, the quick test tier segfaulted later on, after the export tests, in 2 runs of 2;
    with one kept runtime it passes. The exact fault inside OpenVINO was not traced."""
    import openvino

    return openvino.Core()


class OpenVinoBackend(_ExportedBackend):
    """An OpenVINO IR model (``NAME_openvino_model/NAME.xml`` + ``.bin``) run by OpenVINO on the CPU."""

    kind = "openvino"

    def __init__(self, path, device="cpu"):
        if not openvino_installed():
            raise UserError(f"{path}: running OpenVINO models needs openvino; pip install openvino")
        if torch.device(device).type != "cpu":
            LOGGER.warning(f"{path}: OpenVINO models run on the CPU here; ignoring --device {device}")
        core = openvino_core()
        xml = openvino_xml(path)
        try:
            model = core.read_model(str(xml))
        except RuntimeError as e:
            raise UserError(f"{xml}: OpenVINO cannot read this model ({first_line(e)})") from None
        meta = check_metadata(openvino_metadata(model), path)
        fixed = None if meta["dynamic"] else (meta["batch"], *meta["imgsz"])
        super().__init__(meta["stride"], meta["names"], "cpu", fixed)
        # CPUs with bf16 units default to bf16 inference; exported models are checked and used at fp32
        self.compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        self.imgsz = meta["imgsz"]

    def _run(self, im: torch.Tensor) -> torch.Tensor:
        """``(bs, 3, h, w)`` -> float32 ``(bs, N, no)`` on the input's device."""
        out = self.compiled(np.ascontiguousarray(im.detach().cpu().numpy(), dtype=np.float32))[0]
        return torch.from_numpy(out).float().to(im.device)


EXPORTED_BACKENDS = {"onnx": OnnxBackend, "torchscript": TorchScriptBackend, "openvino": OpenVinoBackend}


def weights_kind(path) -> str:
    """``'pytorch'``, ``'onnx'``, ``'torchscript'`` or ``'openvino'`` (a folder or .xml); else a UserError."""
    if not str(path).strip():  # Path('') is '.', which would read as an OpenVINO folder
        raise UserError("--weights '': give the model to run, e.g. --weights runs/train/exp/weights/best.pt")
    path = Path(path)
    if path.is_dir() or path.name.endswith(OPENVINO_FOLDER):
        return "openvino"
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise UserError(f"--weights {path}: unknown weights format; use a .pt checkpoint, or an .onnx file, "
                        f".torchscript file or NAME{OPENVINO_FOLDER} folder written by export.py")
    return kind


def load_backend(weights, device=None, fuse=True) -> InferenceBackend:
    """Open ``weights`` (a path, or a list of .pt paths for an ensemble) on ``device`` as a backend."""
    paths = weight_paths(weights)
    kinds = {weights_kind(p) for p in paths}
    if len(paths) > 1 and kinds != {"pytorch"}:
        raise UserError(f"--weights {[str(p) for p in paths]}: only .pt checkpoints can form an ensemble")
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UserError(f"--weights {missing[0]}: file not found{MISSING_FILE_HINTS['weights']}")
    device = torch.device(device or "cpu")
    if kinds == {"pytorch"}:
        return PyTorchBackend(attempt_load(paths if len(paths) > 1 else paths[0], device=device, fuse=fuse))
    path = Path(paths[0])
    backend = EXPORTED_BACKENDS[kinds.pop()](path, device)
    LOGGER.info(f"Loaded {path} ({backend.kind}, {backend.nc} classes, strides {backend.stride.tolist()})")
    return backend
