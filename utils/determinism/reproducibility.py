"""The run's determinism report (determinism.json): what is needed to rerun or explain a run."""

import json
import os
import sys
from pathlib import Path

import torch
import torchvision

from utils.files import atomic_write_bytes


def device_names(device: torch.device) -> list:
    if device.type == "cuda":
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [f"cpu ({os.cpu_count()} cores)"]


def determinism_report(*, policy, audit, opt, dist, dataset, device) -> dict:
    """Mode, seed, audit, relaxation, versions, devices and data identity of this run."""
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "mode": policy.mode,
        "seed": opt.seed,
        "relaxed_backward": bool(policy.relax_backward),
        "audit": audit,
        "policy_state": policy.state(),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        },
        "devices": device_names(device),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
        "world_size": dist.world_size,
        "workers": opt.workers,
        "label_cache_hash": getattr(dataset, "cache_hash", None),
    }


def write_json(path, data: dict) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, default=str) + "\n").encode())


def record_checksum(save_dir, checksum: str) -> None:
    """Add the final EMA weights' SHA-256 to determinism.json and weights/sha256.txt."""
    save_dir = Path(save_dir)
    report_path = save_dir / "determinism.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["final_ema_sha256"] = checksum
    write_json(report_path, report)
    atomic_write_bytes(save_dir / "weights" / "sha256.txt", f"{checksum}  ema (fp32, before stripping)\n".encode())
