"""Checkpoints as plain data: written atomically, loaded with ``weights_only=True``.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts only (no
pickled classes), so ``torch.load(path, weights_only=True)`` can read it and a
malicious file cannot run code. The keys train.py writes are defined in one place,
:func:`utils.training.run_state.training_state`; ``REQUIRED_KEYS`` are the ones every reader needs.
"""

import hashlib
import io
import zipfile
from pathlib import Path

import torch

from utils.errors import UserError, first_line
from utils.files import atomic_open, plain_data as to_plain

REQUIRED_KEYS = ("model_cfg", "model")


def save_checkpoint(ckpt: dict, path, on_commit=None) -> None:
    """Serialise ``ckpt`` to memory, then write it atomically to ``path``.

    Values are made plain first (e.g. ``torch.__version__`` is a str subclass that
    ``weights_only`` loading would refuse). Serialising to memory first means a failure (bad
    object, full disk) never touches the existing file; the caller sees the OSError and the
    previous checkpoint stays. ``on_commit()`` runs once the new file is in place (see
    :func:`utils.files.atomic_open`).
    """
    buffer = io.BytesIO()
    torch.save(to_plain(ckpt), buffer)
    with atomic_open(path, "wb", on_commit=on_commit) as f:
        f.write(buffer.getbuffer())


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; every failure is a one-line UserError."""
    if not str(path).strip():  # Path('') is '.', which would be reported as a missing checkpoint named '.'
        raise UserError("--weights '': give a checkpoint, e.g. --weights runs/train/exp/weights/best.pt")
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as e:
        raise UserError(f"{path}: not a readable checkpoint ({first_line(e)}); "
                        "it may be truncated, corrupt or from another program") from None
    except Exception as e:  # torch raises UnpicklingError subclasses for foreign pickles
        raise UserError(f"{path}: not a safe checkpoint of this project ({type(e).__name__}): only plain files load; "
                        "a pickled YOLOv5 or FFCA-YOLO checkpoint converts without running its code: python "
                        f"convert_checkpoint.py {path} {path.with_name(path.stem + '-converted.pt')}") from None
    if not isinstance(ckpt, dict) or any(k not in ckpt for k in REQUIRED_KEYS):
        raise UserError(f"{path}: not a checkpoint of this project (missing keys {list(REQUIRED_KEYS)})")
    return ckpt


def float_weights(state_dict: dict) -> dict:
    """Floating-point tensors to fp32 (stripped checkpoints hold fp16); others unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}


def stored_weights(ckpt: dict):
    """A checkpoint's weights as stored: the EMA when present, else the model."""
    return ckpt.get("ema") or ckpt.get("model")


def inference_weights(ckpt: dict, path) -> dict:
    """The weights to use from a checkpoint: the EMA when present, else the model, in fp32."""
    state = stored_weights(ckpt)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: the checkpoint's weights are not a state dict; "
                        "re-save it with this project's train.py")
    return float_weights(state)


def state_dict_sha256(state_dict: dict) -> str:
    """SHA-256 over a state dict's tensors (sorted keys, raw bytes): equal iff bit-identical."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        tensor = state_dict[key]
        digest.update(key.encode())
        if isinstance(tensor, torch.Tensor):
            t = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(str(t.dtype).encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
