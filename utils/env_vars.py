"""The one place the project reads environment variables: each is read, checked and named when it is used.

Nothing here runs at import, so a bad value can never break ``import train``; it is reported by the code
that needs it. A value outside a variable's range is one :class:`UserError` line (exit 2) naming the
variable, the value and the accepted range, unless the variable has a safe default: then one warning,
and the run goes on with that default. docs/environment.md lists every variable of :data:`VARIABLES`
(and :data:`RECORDED`); tests/test_env_vars.py checks that list against this one.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from utils.errors import UserError
from utils.logging import LOGGER


@dataclass(frozen=True)
class Variable:
    """An environment variable the project interprets; ``parse`` raises ValueError outside ``accepted``."""

    name: str
    accepted: str  # the range, in words, as the error line and the docs table give it
    parse: Callable[[str], object]  # the stripped value ('' when unset) -> what the code uses
    safe_default: bool = False  # a bad value warns and uses the default instead of stopping


def _number(text: str, low: float, integer: bool = False) -> float:
    value = int(text) if integer else float(text)
    if not math.isfinite(value) or value < low:
        raise ValueError(text)
    return value


def _positive_minutes(text: str) -> float:
    value = _number(text or "30", 0)
    if value == 0:
        raise ValueError(text)
    return value


def _flag(default: bool) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        if not text:
            return default
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)

    return parse


def _cache_home(text: str) -> Path:
    if text and not Path(text).is_absolute():  # the XDG spec: a relative path is invalid and ignored
        raise ValueError(text)
    return Path(text) if text else Path.home() / ".cache"


def _audit_cache(text: str) -> Path | None:
    if text.lower() in ("off", "0", "false", "no"):
        return None
    if not text:
        return read("XDG_CACHE_HOME") / "ffca-yolo" / "audit"
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(text)
    return folder


def _count(low: int, default: int) -> Callable[[str], int]:
    return lambda text: int(_number(text, low, integer=True)) if text else default


def _tracking_uri(text: str) -> str:
    scheme = text.partition(":")[0].lower() if "://" in text or text.startswith("databricks") else ""
    if scheme not in MLFLOW_SCHEMES:
        raise ValueError(text)
    return text


def _upstream(text: str) -> Path | None:
    if text and not Path(text).expanduser().is_dir():
        raise ValueError(text)
    return Path(text).expanduser() if text else None


# The stores MLflow's tracking-store registry knows; '' is a local folder path.
MLFLOW_SCHEMES = ("", "file", "http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks",
                  "databricks-uc", "uc")
# What a run sets for an http(s) store when the user has not (MLflow's own defaults retry for minutes).
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": 1, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
                        "MLFLOW_HTTP_REQUEST_TIMEOUT": 10}

VARIABLES = {v.name: v for v in (
    Variable("FFCA_DDP_TIMEOUT_MIN", "a positive number of minutes, e.g. 30", _positive_minutes),
    Variable("FFCA_AUDIT_CACHE", "a folder (made when missing) or off", _audit_cache, safe_default=True),
    Variable("XDG_CACHE_HOME", "an absolute folder path", _cache_home, safe_default=True),
    Variable("PIN_MEMORY", "true or false (also 1/0, yes/no, on/off)", _flag(True), safe_default=True),
    Variable("WORLD_SIZE", "an integer of at least 1 (torchrun sets it)", _count(1, 1)),
    Variable("RANK", "an integer of at least 0, below WORLD_SIZE (torchrun sets it)", _count(0, -1)),
    Variable("LOCAL_RANK", "an integer of at least 0 (torchrun sets it)", _count(0, -1)),
    Variable("TORCHELASTIC_RUN_ID", "any text (torchrun sets it)", str),
    Variable("MLFLOW_TRACKING_URI", f"a folder path or a URI of scheme {', '.join(MLFLOW_SCHEMES[1:])}",
             lambda text: _tracking_uri(text) if text else ""),
    Variable("MLFLOW_EXPERIMENT_NAME", "any text", str),
    Variable("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "an integer of at least 0",
             _count(0, MLFLOW_HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]), safe_default=True),
    Variable("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "an integer of at least 0",
             _count(0, MLFLOW_HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]), safe_default=True),
    Variable("MLFLOW_HTTP_REQUEST_TIMEOUT", "an integer number of seconds of at least 1",
             _count(1, MLFLOW_HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_TIMEOUT"]), safe_default=True),
    Variable("YOLOV5_UPSTREAM", "an existing folder (a YOLOv5 checkout)", _upstream, safe_default=True),
)}
# Read as they are, never interpreted: written into run records, or handed on unchanged (to CUDA, cuBLAS or
# child processes).
RECORDED = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH",
            "NCCL_NVLS_ENABLE")


def read(name: str):
    """The checked value of ``name`` (its default when unset or empty); a bad value stops or warns, naming it."""
    variable = VARIABLES[name]
    text = os.environ.get(name, "").strip()
    try:
        return variable.parse(text)
    except ValueError:
        problem = f"{name}={text!r}: expected {variable.accepted}"
        if not variable.safe_default:
            raise UserError(f"{problem}; set it to such a value or unset it") from None
        LOGGER.warning(f"{problem}; using the default ({variable.parse('')}) instead")
        return variable.parse("")


def recorded(name: str) -> str | None:
    """The raw value of a variable that is only recorded or passed on (None when unset)."""
    if name not in RECORDED:
        raise KeyError(f"{name} is not a recorded variable; add it to RECORDED or VARIABLES")
    return os.environ.get(name)


def recorded_nccl() -> dict:
    """Every ``NCCL_*`` variable as set (NCCL reads them itself; a run records them to explain a difference)."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("NCCL_")}


def pass_on(name: str) -> None:
    """Export ``name``'s checked value (its default when unset or bad), for a library that reads it itself."""
    os.environ[name] = str(read(name))
