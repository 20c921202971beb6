"""The run's determinism report (determinism.json): what is needed to rerun or explain a run."""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from utils.env_vars import recorded, recorded_nccl
from utils.files import atomic_write_bytes
from utils.torch_utils import cudnn_version
from utils.torchvision_ops import version as torchvision_version


def device_names(device: torch.device) -> list:
    if device.type == "cuda":
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [f"cpu ({os.cpu_count()} cores)"]


def nccl_version() -> str | None:
    """The NCCL this torch was built with, as ``major.minor.patch`` (None for builds without NCCL)."""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def data_fingerprint(im_files, label_files) -> str:
    """SHA-256 of the training image list (file names, in order) and the label files' contents."""
    digest = hashlib.sha256()
    for im_file, lb_file in zip(im_files, label_files):
        digest.update(Path(im_file).name.encode() + b"\0")
        label = Path(lb_file)
        digest.update(label.read_bytes() if label.is_file() else b"<no label file>")
        digest.update(b"\0")
    return digest.hexdigest()


def run_guarantee(policy) -> str:
    """One line: what a rerun on the same stack is promised to give, for a ``DeterminismPolicy``."""
    ops = ", ".join(f"{op} x{n}" for op, n in policy.nondeterministic_ops.items())
    if policy.mode == "off":
        return "may differ: --deterministic off uses the fastest, nondeterministic kernels"
    if ops and policy.mode == "scoped":
        return f"may differ in the last bits because the backward ran relaxed for: {ops}"
    if ops:
        return f"may differ because these ops warned (no deterministic implementation): {ops}"
    return "bit-identical on this stack (same hardware, driver, CUDA, cuDNN and torch)"


def determinism_report(*, policy, audit, opt, dist, dataset, device, audit_path=None) -> dict:
    """Mode, seed, audit, relaxation, versions, devices and data identity of this run.

    ``twins`` lists the deterministic twins the training forward ran and the native findings they replaced
    (the audit is then the one with the twins routed). ``audit_path`` says whether the audit came from its cache (``{"path": "cached" | "computed",
    "file"}``); it is how the run started, not what it computes, so compare does not read it.
    """
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "mode": policy.mode,
        "seed": opt.seed,
        "relaxed_backward": bool(policy.relax_backward),
        "nondeterministic_ops": policy.nondeterministic_ops,
        "guarantee": run_guarantee(policy),
        "audit": audit,
        "audit_path": audit_path,
        "twins": policy.twins.to_dict() if policy.twins is not None else None,
        "policy_state": policy.state(),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torchvision": torchvision_version(),
            "cuda": torch.version.cuda,
            "cudnn": cudnn_version(),
        },
        "devices": device_names(device),
        "CUBLAS_WORKSPACE_CONFIG": recorded("CUBLAS_WORKSPACE_CONFIG"),
        "PYTHONHASHSEED": recorded("PYTHONHASHSEED"),
        "nccl": {"version": nccl_version(), "environment": recorded_nccl()},
        "world_size": dist.world_size,
        "workers": opt.workers,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector width of torch's CPU kernels
        "label_cache_hash": getattr(dataset, "cache_hash", None),
        "data_fingerprint": data_fingerprint(dataset.im_files, dataset.label_files),
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
