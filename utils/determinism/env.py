"""Environment report: library versions, devices, threads and determinism state.

``python -m utils.determinism.env`` prints it; training runs save the same dict in their run folder, so a
difference between two runs can be traced to a difference between two machines.
"""

import contextlib
import os
import platform
import sys

import numpy as np
import torch

from utils.env_vars import recorded
from utils.torch_utils import cudnn_version, determinism_state
from utils.torchvision_ops import version as torchvision_version


def _optional_version(module_name: str) -> str | None:
    """``module.__version__`` or None when the package is not installed."""
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return getattr(module, "__version__", None)


def _gpus() -> list[dict]:
    """Name, memory (MiB) and compute capability of every visible CUDA device."""
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"index": index, "name": props.name, "memory_mib": props.total_memory // (1 << 20),
                     "capability": f"{props.major}.{props.minor}"})
    return gpus


def _cpu_model() -> str | None:
    """The processor's model name (Linux ``/proc/cpuinfo``; elsewhere what ``platform`` knows, if anything)."""
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/cpuinfo") as info:
            return next(line for line in info if line.startswith("model name")).split(":", 1)[1].strip()
    return platform.processor() or None


def environment_report() -> dict:
    """Versions, CUDA/cuDNN, GPUs, thread counts and determinism state as plain data."""
    cuda_available = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision_version(),  # not imported: that costs seconds (utils/torchvision_ops.py)
        "opencv": _optional_version("cv2"),
        "numpy": np.__version__,
        "cuda_available": cuda_available,
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn_version(),
        "gpus": _gpus() if cuda_available else [],
        "cpu": _cpu_model(),
        # the vector width of ATen's CPU kernels: processors that differ here round some sums differently
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": recorded("OMP_NUM_THREADS"),
        "determinism": determinism_state(),
    }


def format_report(report: dict) -> str:
    """One ``key: value`` line per fact; nested dicts and GPU lists indented below their key."""
    lines = []
    for key, value in report.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines.extend(f"  {k}: {v}" for k, v in value.items())
        elif key == "gpus":
            lines.append(f"gpus: {len(value) or 'none'}")
            lines.extend(f"  CUDA:{g['index']} {g['name']}, {g['memory_mib']} MiB, "
                         f"compute capability {g['capability']}" for g in value)
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main() -> int:
    """Print the environment report."""
    print(format_report(environment_report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
