"""A cache for the start-up op audit, so a run whose model was audited before skips the audit.

The audit's report depends only on what one recorded training step runs: the model's structure
(YAML, modules, parameter shapes, which parameters train, anchor and stride buffers), the source
code of those modules and of the audit, loss, optimizer and EMA, the hyperparameters (loss gains
pick the loss's ops), the image size, batch size, AMP, the device type, the torch and torchvision
versions (and CUDA/cuDNN versions on CUDA) and, as the policy asks, the mode. :func:`audit_key` collects them;
the cache file ``<folder>/<sha256 of the key>.json`` holds the key and the report as JSON (no
pickle), and is used only when its stored key equals the current one.

Folder: ``$FFCA_AUDIT_CACHE`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/ffca-yolo/audit`` (default ``~/.cache/ffca-yolo/audit``). A file that cannot be
read or parsed is reported in one warning and recomputed; a folder that cannot be written costs
only the cache, never the run.
"""

import hashlib
import inspect
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from utils.determinism.op_audit import AuditReport, audit_model, detection_loss
from utils.determinism.twins.plan import TWIN_MODES, TwinPlan, twinned_audit
from utils.determinism.op_table import installed_torchvision
from utils.env_vars import read
from utils.files import atomic_write_bytes
from utils.logging import LOGGER, colorstr

CACHE_ENV = "FFCA_AUDIT_CACHE"
CACHE_FORMAT = 3  # bump when the key's fields or the file layout change (3: ops outside the table, torchvision)
_UTILS = Path(__file__).resolve().parents[1]
# What the audited step runs besides the model: the audit, the loss (and its IoU), optimizer and EMA.
AUDIT_SOURCES = (_UTILS / "determinism" / "op_audit.py", _UTILS / "determinism" / "op_table.py",
                 _UTILS / "determinism" / "cuda_trace.py", _UTILS / "loss.py", _UTILS / "metrics.py",
                 _UTILS / "torch_utils.py")
TWINS_FOLDER = _UTILS / "determinism" / "twins"
_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")  # BatchNorm state: values, not structure


def cache_dir() -> Path | None:
    """The cache folder, or None when ``$FFCA_AUDIT_CACHE`` is ``off`` (also ``0``, ``false``, ``no``)."""
    return read(CACHE_ENV)


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _source_files(model: nn.Module) -> list:
    """The project source files of every module class in ``model`` (torch's own are covered by its version)."""
    files = set()
    torch_dir = Path(torch.__file__).parent
    for cls in {type(module) for module in model.modules()}:
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:  # a class without Python source; its name is in the module tree's digest
            path = None
        if path and not Path(path).resolve().is_relative_to(torch_dir):
            files.add(Path(path).resolve())
    return sorted(files) + [p for p in AUDIT_SOURCES if p not in files]


def _sources_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for path in _source_files(model):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _structure_digests(model: nn.Module) -> dict:
    """Digests of the model's YAML, module tree, parameters (shape, dtype, trainable) and structural buffers."""
    parameters = [[name, list(p.shape), str(p.dtype), p.requires_grad] for name, p in model.named_parameters()]
    buffers = hashlib.sha256()
    for name, buffer in model.named_buffers():
        if not name.endswith(_STATISTICS):
            buffers.update(name.encode() + b"\0" + buffer.detach().cpu().contiguous().numpy().tobytes())
    return {"model_yaml": _digest(json.dumps(getattr(model, "yaml", None), sort_keys=True, default=str)),
            "modules": _digest(repr(model)),
            "parameters": _digest(json.dumps(parameters)),
            "buffers": buffers.hexdigest()}


def audit_key(model: nn.Module, *, mode: str, imgsz: int, device, batch_size: int, amp: bool, hyp: dict) -> dict:
    """Everything the audit of ``model`` depends on, as plain data (digests for the bulky parts).

    Weight values are not part of it: which aten ops one step runs follows from shapes, dtypes,
    module code and arguments, not from the numbers in the tensors.
    """
    device = torch.device(device)
    key = {"format": CACHE_FORMAT, "mode": mode, "torch": torch.__version__, "torchvision": installed_torchvision(),
           "device_type": device.type,
           "imgsz": int(imgsz), "batch_size": int(batch_size), "amp": bool(amp),
           "hyp": _digest(json.dumps(hyp, sort_keys=True, default=str)),
           "sources": _sources_digest(model), **_structure_digests(model)}
    if device.type == "cuda":
        key["cuda"] = torch.version.cuda
        key["cudnn"] = torch.backends.cudnn.version()
    return key


def cache_file(folder: Path, key: dict) -> Path:
    """``folder/<sha256 of the key>.json``."""
    return folder / f"{_digest(json.dumps(key, sort_keys=True))}.json"


def load_cached(path: Path, key: dict, from_dict: Callable[[dict], object]):
    """The report stored in ``path`` for ``key`` via ``from_dict``; None when absent or damaged (warned)."""
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
        if stored["key"] != key:  # the name is the key's digest, so only damage gets here
            raise ValueError("it holds the report of another key")
        return from_dict(stored["report"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        LOGGER.warning(f"audit cache {path} is unreadable ({type(e).__name__}: {e}); auditing again "
                       f"and rewriting it (set {CACHE_ENV}=off to disable the cache)")
        return None


def store(path: Path, key: dict, report: dict) -> bool:
    """Write ``{"key", "report"}`` to ``path`` atomically; a failure is one warning, never an error."""
    try:
        atomic_write_bytes(path, (json.dumps({"key": key, "report": report}, indent=1) + "\n").encode())
        return True
    except OSError as e:
        LOGGER.warning(f"audit cache {path} could not be written ({e.strerror or e}); the next run audits "
                       f"again (set {CACHE_ENV} to a writable folder, or off)")
        return False


def cached_audit(key: dict, compute: Callable[[], object], from_dict: Callable[[dict], object]) -> tuple:
    """``(report, path)``: the cached report for ``key`` when there is one, else ``compute()``, stored.

    ``path`` is ``{"path": "cached" | "computed", "file": cache file or None}`` for determinism.json;
    ``compute`` returns an object with ``to_dict()`` that ``from_dict`` reads back.
    """
    folder = cache_dir()
    if folder is None:
        return compute(), {"path": "computed", "file": None}
    path = cache_file(folder, key)
    report = load_cached(path, key, from_dict)
    if report is not None:
        return report, {"path": "cached", "file": str(path)}
    report = compute()
    return report, {"path": "computed", "file": str(path) if store(path, key, report.to_dict()) else None}


def start_up_audit(policy, model, imgsz: int, device, hyp: dict, amp: bool) -> tuple:
    """Audit one training step at start-up (or read it from this cache) unless the mode is off; the policy
    adopts the findings. In scoped and strict, findings a deterministic twin resolves are audited again with
    those twins routed (:func:`_with_twins`), and the policy adopts that audit.
    Returns ``(report dict, {"path": "cached" | "computed", "file"})``, ``(None, None)`` when off.
    """
    if policy.mode == "off":
        return None, None
    settings = dict(imgsz=min(imgsz, 256), device=device, batch_size=2, amp=amp)
    key = audit_key(model, mode=policy.mode, hyp=hyp, **settings)

    def audit(forward_scope=None):
        return audit_model(model, loss_factory=detection_loss(hyp), forward_scope=forward_scope, **settings)

    report, path = cached_audit(key, audit, AuditReport.from_dict)
    if policy.mode in TWIN_MODES:
        report, path = _with_twins(policy, report, path, key, audit)
    LOGGER.info(f"{colorstr('determinism: ')}{policy.adopt_audit(report)}")
    return report.to_dict(), path


def _twins_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(TWINS_FOLDER.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _with_twins(policy, native, path: dict, key: dict, audit: Callable) -> tuple:
    """``(report, path)`` of the audit with the twins that resolve ``native``'s findings routed (cached under
    its own key), the twins set on ``policy`` and one line naming what they replace; ``(native, path)`` when
    none applies."""
    paths = {}

    def cached_twinned(forward_scope):
        names = [twin.name for twin in TwinPlan.candidates(native)]
        twinned_key = {**key, "twins": names, "twin_sources": _twins_digest()}
        report, paths["twinned"] = cached_audit(twinned_key, lambda: audit(forward_scope), AuditReport.from_dict)
        return report

    plan, report = twinned_audit(native, cached_twinned)
    if plan is None:
        return native, path
    policy.twins = plan
    LOGGER.info(f"{colorstr('determinism: ')}{plan.describe()}")
    return report, paths["twinned"]
