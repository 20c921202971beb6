"""Model variants for the small-object accuracy study: ablations of FFCA-YOLO-n built by row swaps.

Each ablation replaces rows of ``models/ffca-yolo-n.yaml`` in place (so layer indices and every
other row stay the same): FEM -> ``nn.Identity``, SCAM -> ``nn.Identity``, FFM_Concat -> Concat.
``ffca-yolo-n-zeroinit`` and ``ffca-yolo-n-published`` keep every row and only pass the ``init`` argument
to the FEM and SCAM rows: ``zero_last`` to both (the default of issue 38's first round) or ``published`` to
both (the authors'). The default, ``ffca-yolo-n`` itself, is ``published`` for FEM and ``zero_last`` for
SCAM (same layers and parameters; models/ffca.py).
"""

from __future__ import annotations

import inspect
from copy import deepcopy
from pathlib import Path

from models.ffca import FEM
from utils.files import yaml_load, yaml_save

ROOT = Path(__file__).resolve().parents[2]
MODELS = {
    "yolov5n": ROOT / "models" / "yolov5n.yaml",
    "yolov5n-p2": Path(__file__).parent / "models" / "yolov5n-p2.yaml",
    "ffca-yolo-n": ROOT / "models" / "ffca-yolo-n.yaml",
    "l-ffca-yolo": ROOT / "models" / "l-ffca-yolo.yaml",
}
ABLATIONS = {
    "ffca-yolo-n-noSCAM": {"SCAM": "nn.Identity"},
    "ffca-yolo-n-noFEM": {"FEM": "nn.Identity"},
    "ffca-yolo-n-concat": {"FFM_Concat2": "Concat", "FFM_Concat3": "Concat"},
}
BRANCH_INIT_VARIANTS = {  # name: (FEM init, SCAM init)
    "ffca-yolo-n-zeroinit": ("zero_last", "zero_last"),
    "ffca-yolo-n-published": ("published", "published"),
}
VARIANTS = sorted(MODELS) + sorted(ABLATIONS) + sorted(BRANCH_INIT_VARIANTS)  # every name variant_yaml builds


def with_branch_init(cfg: dict, fem_init: str, scam_init: str) -> dict:
    """Copy of a model YAML dict whose FEM rows pass ``fem_init`` (FEM's other arguments at their defaults)
    and whose SCAM rows pass ``scam_init``."""
    fem_defaults = [p.default for p in inspect.signature(FEM).parameters.values()][2:-1]  # scale, map_reduce, dilation
    out = deepcopy(cfg)
    for section in ("backbone", "head"):
        for row in out[section]:
            if row[2] == "FEM":
                row[3] = [*row[3][:1], *fem_defaults, fem_init]
            elif row[2] == "SCAM":
                row[3] = [scam_init]
    return out


def swap_modules(cfg: dict, swaps: dict[str, str]) -> dict:
    """Copy of a model YAML dict with each row's module renamed by ``swaps`` (identity rows get no args)."""
    out = deepcopy(cfg)
    for section in ("backbone", "head"):
        for row in out[section]:
            if row[2] in swaps:
                row[2] = swaps[row[2]]
                row[3] = [] if row[2] == "nn.Identity" else [1]
    return out


def scaled(cfg: dict, depth: float, width: float) -> dict:
    """Copy of a model YAML dict with other depth/width multiples (e.g. a reduced-width L-FFCA-YOLO)."""
    out = deepcopy(cfg)
    out["depth_multiple"], out["width_multiple"] = depth, width
    return out


def variant_yaml(name: str, out_dir: Path, lffca_scale: tuple[float, float] = (0.33, 0.25)) -> Path:
    """Write the model YAML for variant ``name`` into ``out_dir`` (or return the repository file)."""
    if name in ABLATIONS:
        cfg = swap_modules(yaml_load(MODELS["ffca-yolo-n"]), ABLATIONS[name])
    elif name in BRANCH_INIT_VARIANTS:
        cfg = with_branch_init(yaml_load(MODELS["ffca-yolo-n"]), *BRANCH_INIT_VARIANTS[name])
    elif name == "l-ffca-yolo" and lffca_scale:
        cfg = scaled(yaml_load(MODELS[name]), *lffca_scale)
    elif name in MODELS:
        return MODELS[name]
    else:
        raise KeyError(f"unknown variant {name!r}; choose from {VARIANTS}")
    path = Path(out_dir) / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    yaml_save(path, cfg)
    return path
