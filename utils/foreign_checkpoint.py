"""Convert an upstream YOLOv5 (v6/v7) or FFCA-YOLO authors' checkpoint into this project's plain checkpoint.

Usage: ``python convert_checkpoint.py SRC.pt DST.pt`` (the command line; this module is its library) then ``python train.py --weights DST.pt ...``

Those checkpoints pickle whole model objects. :func:`read_foreign_checkpoint` parses them with an unpickler that resolves only an allow-list of globals (tensor and storage
rebuilding, ``OrderedDict``, ``set``); every other global, module classes and functions such as
``os.system`` alike, becomes an inert :class:`Placeholder` that merely records its arguments and
state. Nothing named by the file is imported or called, so no ``__reduce__`` payload can execute.

The converter then takes the model YAML stored in the checkpoint, builds this project's model from
it (the model class is passed in to :func:`convert`; utils/ does not import models/), fills every parameter and
buffer from the file's tensors (by name, else by order and shape within each layer), fails unless
every tensor of the file was used, and saves a plain ``weights_only`` checkpoint atomically.
FFM layers pickled by the authors' FFCA-YOLO code (any FFM class not from this project's
``models.ffca``) get the ``authors`` FFM arithmetic in the converted model YAML
(:func:`with_authors_ffm`), so the converted model computes what the authors' model computed;
the converter logs one line saying which FFM arithmetic each layer kept (docs/export.md).
"""

from __future__ import annotations

import collections
import hashlib
import pickle
import re
import zipfile
from pathlib import Path

import torch

from utils.training.checkpoints import save_checkpoint, stored_weights
from utils.errors import UserError
from utils.logging import LOGGER

STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "HalfStorage": torch.float16, "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "UntypedStorage": torch.uint8,
}


class Placeholder:
    """Stands in for any class or function a pickle names; stores what the pickle gives it, runs nothing.

    ``qualname`` is ``module.name`` of the global; ``args``/``kwargs`` come from REDUCE/NEWOBJ,
    ``state`` from BUILD (an ``nn.Module``'s ``__dict__``), ``items``/``list`` from SETITEMS/APPENDS.
    """

    qualname = "?"
    state = None  # NEWOBJ creates instances without __init__; these class defaults are never mutated

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value):
        self.__dict__.setdefault("list", []).append(value)

    def extend(self, values):
        self.__dict__.setdefault("list", []).extend(values)

    def __repr__(self):
        return f"Placeholder({self.qualname})"


def _placeholder_class(module: str, name: str) -> type:
    return type(f"Placeholder_{name}", (Placeholder,), {"qualname": f"{module}.{name}"})


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *state):
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for one ``data.pkl``; storages are read from the zip by ``storage_bytes(key)``."""

    def __init__(self, file, storage_bytes):
        super().__init__(file)
        self._storage_bytes = storage_bytes
        self._storages = {}

    def find_class(self, module, name):
        if module in ("collections",) and name == "OrderedDict":
            return collections.OrderedDict
        if module in ("builtins", "__builtin__") and name in ("set", "frozenset"):
            return {"set": set, "frozenset": frozenset}[name]
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module in ("torch", "torch.storage") and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        return _placeholder_class(module, name)

    def persistent_load(self, pid):
        """``('storage', dtype, key, location, numel)`` -> a flat tensor of that dtype from the zip."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)):
            raise pickle.UnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
        _, dtype, key, _, _ = pid
        if key not in self._storages:
            raw = bytearray(self._storage_bytes(str(key)))
            self._storages[key] = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        return self._storages[key]

    @staticmethod
    def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, *metadata):
        if not isinstance(storage, torch.Tensor):
            raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
        return storage.as_strided(tuple(size), tuple(stride), offset).clone()


def read_foreign_checkpoint(path):
    """Unpickle the ``torch.save`` zip at ``path`` safely; returns its top-level object (usually a dict)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                raise UserError(f"{path}: no data.pkl inside; not a torch.save file of PyTorch 1.6 or newer")
            prefix = pkl[: -len("data.pkl")]
            with archive.open(pkl) as f:
                return _RestrictedUnpickler(f, lambda key: archive.read(f"{prefix}data/{key}")).load()
    except zipfile.BadZipFile:
        raise UserError(f"{path}: not a zip-format torch checkpoint (legacy or damaged file)") from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, RuntimeError) as e:
        raise UserError(f"{path}: cannot read the checkpoint safely ({type(e).__name__}: {str(e)[:120]})") from None


# ----------------------------------------------------------------------------- foreign model
def module_tensors(module: Placeholder, prefix: str = "") -> dict:
    """``state_dict()``-style ``{name: tensor}`` of a pickled ``nn.Module`` placeholder, in registration order."""
    state = module.state if isinstance(module.state, dict) else {}
    out = {}
    for name, tensor in (state.get("_parameters") or {}).items():
        if isinstance(tensor, torch.Tensor):
            out[prefix + name] = tensor
    skip = state.get("_non_persistent_buffers_set") or set()
    for name, tensor in (state.get("_buffers") or {}).items():
        if isinstance(tensor, torch.Tensor) and name not in skip:
            out[prefix + name] = tensor
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, Placeholder):
            out.update(module_tensors(child, f"{prefix}{name}."))
    return out


def foreign_model(ckpt, path) -> tuple[dict, list, dict, str, dict]:
    """(model YAML dict, class names, tensors, class name, {layer index: layer class name}) of the EMA
    (else model) in a foreign checkpoint."""
    if not isinstance(ckpt, dict):
        raise UserError(f"{path}: expected a checkpoint dict, found {type(ckpt).__name__}")
    model = stored_weights(ckpt)
    if isinstance(ckpt.get("model_cfg"), dict) and isinstance(model, dict):
        raise UserError(f"{path}: already a checkpoint of this project (plain weights and a model YAML, as train.py "
                        "and convert_checkpoint.py write them); it needs no conversion: pass it as it is, e.g. "
                        f"--weights {path}")
    if not isinstance(model, Placeholder) or not isinstance(model.state, dict):
        raise UserError(f"{path}: no pickled model under 'ema' or 'model'; is this a YOLOv5/FFCA-YOLO checkpoint?")
    cfg = model.state.get("yaml")
    if not isinstance(cfg, dict) or "backbone" not in cfg:
        raise UserError(f"{path}: the pickled model has no model YAML dict ('yaml'); cannot rebuild it")
    check_plain_yaml(cfg, path)
    names = model.state.get("names") or [f"class{i}" for i in range(int(cfg.get("nc", 0)))]
    names = [str(names[k]) for k in sorted(names)] if isinstance(names, dict) else [str(n) for n in names]
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in module_tensors(model).items()}
    return cfg, names, tensors, model.qualname, pickled_layer_classes(model)


def _first_object(value, where: str):
    """(where, value) of the first item in nested dicts/lists that is not plain YAML data, else None."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return None
    if isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"{where}[{k!r}]", v) for k, v in value.items())
        bad_key = next((k for k in value if not isinstance(k, (str, int))), None)
        if bad_key is not None:
            return f"{where} (a key)", bad_key
    else:
        return where, value
    return next((found for w, v in items if (found := _first_object(v, w)) is not None), None)


def check_plain_yaml(cfg: dict, path) -> None:
    """Refuse a stored model YAML that holds anything but YAML data (strings, numbers, lists, dicts): a pickled
    object there is never built into a model nor carried into the converted checkpoint."""
    found = _first_object(cfg, "yaml")
    if found is not None:
        where, value = found
        kind = value.qualname if isinstance(value, Placeholder) else type(value).__name__
        raise UserError(f"{path}: the model YAML stored in the checkpoint holds a pickled object ({kind}) at "
                        f"{where}, not YAML data; refusing to convert it (the file may be malicious)")


def _layer_of(key: str) -> str:
    match = re.match(r"model\.(\d+)\.", key)
    return match.group(1) if match else ""


def match_weights(expected: dict, foreign: dict, path) -> dict:
    """Fill every key of ``expected`` ({name: tensor}) from ``foreign``: same name and shape first, then,
    layer by layer, the remaining tensors in registration order when every shape agrees. A key left
    unfilled, or a foreign tensor left unused, is a UserError."""
    matched = {k: foreign[k] for k, v in expected.items() if k in foreign and foreign[k].shape == v.shape}
    rest_expected = [k for k in expected if k not in matched]
    rest_foreign = [k for k in foreign if k not in matched]
    for layer in dict.fromkeys(_layer_of(k) for k in rest_expected):
        ours = [k for k in rest_expected if _layer_of(k) == layer]
        theirs = [k for k in rest_foreign if _layer_of(k) == layer]
        if len(ours) == len(theirs) and all(expected[a].shape == foreign[b].shape for a, b in zip(ours, theirs)):
            matched.update({a: foreign[b] for a, b in zip(ours, theirs)})
            rest_foreign = [k for k in rest_foreign if k not in theirs]
    missing = [k for k in expected if k not in matched]
    if missing or rest_foreign:
        raise UserError(f"{path}: weights do not map onto the rebuilt model (unfilled {missing[:3]}, "
                        f"unused {rest_foreign[:3]}); the checkpoint's modules differ from this project's")
    return matched


FFM_MODULES = ("FFM_Concat2", "FFM_Concat3")
PROJECT_FFM_MODULE = "models.ffca."  # where this project's FFM classes live; any other is the authors'


def pickled_layer_classes(model: Placeholder) -> dict:
    """{layer index: ``module.name`` of the pickled class} for the layers of a pickled model's ``model`` list."""
    layers = (model.state.get("_modules") or {}).get("model")
    children = (layers.state.get("_modules") or {}) if isinstance(layers, Placeholder) and isinstance(
        layers.state, dict) else {}
    return {int(k): v.qualname for k, v in children.items() if isinstance(v, Placeholder) and str(k).isdigit()}


def _with_ffm_rows(cfg: dict, arithmetic_of) -> dict:
    """``cfg`` with FFM row number ``i`` (layer index) set to ``[dimension, arithmetic_of(i)]``, the row's
    dimension kept (default 1); rows where ``arithmetic_of`` gives None are left as they are."""
    out = {**cfg}
    i = 0
    for section in ("backbone", "head"):
        if not isinstance(cfg.get(section), list):
            continue  # the model parser names the missing section
        rows = []
        for row in cfg[section]:
            arithmetic = arithmetic_of(i) if isinstance(row, list) and len(row) == 4 and row[2] in FFM_MODULES else None
            if arithmetic is not None:
                dimension = row[3][0] if isinstance(row[3], list) and row[3] else 1
                row = [row[0], row[1], row[2], [dimension, arithmetic]]
            rows.append(row)
            i += 1
        out[section] = rows
    return out


def with_authors_ffm(cfg: dict, layer_classes: dict) -> dict:
    """``cfg`` with its FFM rows switched to the ``authors`` arithmetic where the pickled layer is not
    this project's (``[dimension, 'authors']``, the row's dimension kept, default 1)."""
    return _with_ffm_rows(cfg, lambda i: None if layer_classes.get(i, "").startswith(PROJECT_FFM_MODULE) else "authors")


def with_fixed_ffm(cfg: dict) -> dict:
    """``cfg`` with every FFM row in this project's ``fixed`` arithmetic (``--fixed-ffm``: the weights are
    kept, so the model is a starting point for fine-tuning, no longer a copy of the authors' outputs)."""
    return _with_ffm_rows(cfg, lambda i: "fixed")


def authors_ffm_layers(cfg: dict) -> list:
    """Layer indices of the FFM rows of ``cfg`` in the ``authors`` arithmetic."""
    rows = [*(cfg.get("backbone") or []), *(cfg.get("head") or [])]
    return [i for i, row in enumerate(rows) if isinstance(row, list) and len(row) == 4 and row[2] in FFM_MODULES
            and isinstance(row[3], list) and "authors" in row[3][1:]]


def ffm_arithmetic_report(model) -> tuple[dict, str]:
    """({arithmetic: [layer indices]}, one log line) for the FFM layers of a built model; ({}, '') without FFM."""
    kept = {}
    for layer in model.model:
        if hasattr(layer, "arithmetic"):
            kept.setdefault(layer.arithmetic, []).append(int(layer.i))
    parts = []
    if "authors" in kept:
        parts.append(f"authors' (w / sum(w), applied through .view(N, H, W, C)) in layers {kept['authors']}, "
                     "so outputs equal the authors' code")
    if "fixed" in kept:
        parts.append(f"fixed (this project's, mean-1 per-channel weights) in layers {kept['fixed']}")
    return kept, ("FFM arithmetic kept: " + "; ".join(parts) + " (docs/export.md)") if parts else ""


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(src, dst, model_class, fixed_ffm: bool = False) -> dict:
    """Convert ``src`` into a plain checkpoint at ``dst``; ``model_class`` builds a model from a YAML dict.
    ``fixed_ffm`` writes every FFM row in this project's arithmetic (see :func:`with_fixed_ffm`).
    Returns the checkpoint written."""
    if Path(dst).resolve() == Path(src).resolve():
        raise UserError(f"{dst}: the destination must differ from the source checkpoint")
    if Path(dst).is_dir():
        raise UserError(f"{dst}: the destination is a folder; give a file path such as {Path(dst) / 'converted.pt'}")
    cfg, names, tensors, qualname, layer_classes = foreign_model(read_foreign_checkpoint(src), src)
    cfg = with_authors_ffm({k: v for k, v in cfg.items() if k != "ch"}, layer_classes)
    switched = authors_ffm_layers(cfg) if fixed_ffm else []
    if fixed_ffm:
        cfg = with_fixed_ffm(cfg)
    model = model_class(cfg, nc=int(cfg["nc"]))
    state = match_weights(model.state_dict(), tensors, src)
    model.load_state_dict(state)
    arithmetic, line = ffm_arithmetic_report(model)
    if line:
        LOGGER.info(f"{src}: {line}")
    if switched:
        LOGGER.warning(f"{src}: --fixed-ffm: FFM layers {switched} were trained in the authors' arithmetic; the "
                       f"converted model no longer reproduces their outputs until fine-tuned (python train.py "
                       f"--weights {dst} ...; docs/export.md)")
    ckpt = {"model_cfg": model.yaml, "nc": model.yaml["nc"], "names": names, "model": model.state_dict(),
            "ema": None, "epoch": -1, "best_fitness": None,
            "converted_from": {"file": str(src), "sha256": file_sha256(src), "class": qualname,
                               "tensors": len(tensors), "ffm_arithmetic": arithmetic,
                               "ffm_switched_to_fixed": switched}}
    try:
        save_checkpoint(ckpt, dst)
    except OSError as e:
        raise UserError(f"{e.filename or dst}: cannot write the converted checkpoint ({e.strerror}); "
                        "free disk space or choose a writable destination") from None
    LOGGER.info(f"Converted {src} ({qualname}, {len(tensors)} tensors, {len(names)} classes) -> {dst}")
    return ckpt

