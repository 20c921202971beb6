"""How well a detector's features tell objects from background, layer by layer, across checkpoints.

For each checkpoint (e.g. the ``epochN.pt`` files of ``train.py --save-period``), every chosen
layer's feature map on the validation images is split into object cells (the cell holding a
label's centre) and background cells (away from every label box, sampled). The figure is the
squared Mahalanobis distance between the two groups' mean feature vectors under their pooled
covariance: the separation along the best linear direction, in standard deviations squared.
0 means the layer cannot tell a glyph's cell from background with any linear read-out; it does not
change under a per-channel affine map (BatchNorm in eval mode), so it compares runs and epochs.

    python -m benchmarks.accuracy.separability RUN/weights/epoch*.pt --data DATA.yaml --layers 1 2

Without ``--layers`` it reports each Detect input. Layer numbers are the model YAML's row numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from benchmarks.accuracy.probe import load_pair
from models.backends import load_backend
from utils.converters.sources import list_images
from utils.dataset.data_config import check_dataset
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

BACKGROUND_PER_IMAGE = 200  # background cells sampled per image and layer
RIDGE = 1e-3  # covariance ridge, relative to the mean variance: keeps dead channels invertible


def squared_mahalanobis(objects: np.ndarray, background: np.ndarray, ridge: float = RIDGE) -> float:
    """``(n1, c)`` and ``(n0, c)`` feature rows -> squared distance of the means under the pooled covariance."""
    if len(objects) < 2 or len(background) < 2:
        raise ValueError(f"need at least 2 rows per group, got {len(objects)} object and {len(background)} background")
    pooled = (np.cov(objects, rowvar=False) * (len(objects) - 1) + np.cov(background, rowvar=False) * (len(background) - 1))
    pooled = np.atleast_2d(pooled / (len(objects) + len(background) - 2))
    pooled += ridge * np.trace(pooled) / len(pooled) * np.eye(len(pooled))
    diff = objects.mean(0) - background.mean(0)
    return float(diff @ np.linalg.solve(pooled, diff))


def cell_masks(boxes: torch.Tensor, h: int, w: int, stride: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, 4)`` xyxy pixel boxes -> ``(h, w)`` masks: cells holding a box centre, and cells
    clear of every box by at least one cell (background)."""
    centres = torch.zeros(h, w, dtype=torch.bool)
    near = torch.zeros(h, w, dtype=torch.bool)
    for x0, y0, x1, y1 in (boxes / stride).tolist():
        centres[min(int((y0 + y1) / 2), h - 1), min(int((x0 + x1) / 2), w - 1)] = True
        near[max(int(y0) - 1, 0):int(y1) + 2, max(int(x0) - 1, 0):int(x1) + 2] = True
    return centres, ~near


def default_layers(model) -> list[int]:
    """The layers feeding the Detect head."""
    return list(model.model[-1].f)


def check_layers(model, layers: list[int]) -> None:
    """Refuse row numbers that are not feature maps of this model (the Detect row included)."""
    last = len(model.model) - 2
    bad = [i for i in layers if not 0 <= i <= last]
    if bad:
        raise ValueError(f"--layers {' '.join(map(str, bad))}: this model's feature rows are 0-{last}")


def collect_cells(model, images: list[Path], layers: list[int], seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer, the object-cell and sampled background-cell feature rows over ``images``."""
    captured: dict[int, torch.Tensor] = {}
    hooks = [model.model[i].register_forward_hook(lambda _m, _a, out, i=i: captured.__setitem__(i, out)) for i in layers]
    rng = np.random.default_rng(seed)
    rows: dict[int, tuple[list, list]] = {i: ([], []) for i in layers}
    try:
        for path in images:
            x, boxes = load_pair(str(path))
            with torch.no_grad():
                model(x)
            for i in layers:
                feature = captured[i][0]
                c, h, w = feature.shape
                centres, background = cell_masks(boxes, h, w, x.shape[-1] / w)
                flat = feature.reshape(c, -1).T.numpy()
                rows[i][0].append(flat[centres.flatten().numpy()])
                free = np.flatnonzero(background.flatten().numpy())
                rows[i][1].append(flat[rng.choice(free, size=min(BACKGROUND_PER_IMAGE, len(free)), replace=False)])
    finally:
        for hook in hooks:
            hook.remove()
    return {i: (np.concatenate(obj), np.concatenate(bg)) for i, (obj, bg) in rows.items()}


def measure(weights: str, data: str, layers: list[int] | None, max_images: int) -> dict[int, float]:
    """Layer -> squared Mahalanobis distance (objects vs background) for one checkpoint."""
    model = load_backend(weights, fuse=False).model.float().eval()
    layers = layers or default_layers(model)
    check_layers(model, layers)
    images = list_images(check_dataset(data)["val"])[:max_images]
    return {i: squared_mahalanobis(obj, bg) for i, (obj, bg) in collect_cells(model, images, layers).items()}


def epoch_order(path: str) -> tuple[int, str]:
    """Sort key: ``epochN.pt`` by N, anything else (last.pt, best.pt) after, by name."""
    found = re.fullmatch(r"epoch(\d+)\.pt", Path(path).name)
    return (int(found.group(1)) if found else 1 << 30, path)


RULES = OptionRules(positive=("max_images",), non_negative=("layers",), files=("data", "weights"))


@exit_on_user_error
def main(argv=None) -> None:
    p = parser_for("benchmarks.accuracy.separability", description=__doc__.splitlines()[0])
    p.add_argument("weights", nargs="+", help="checkpoints, e.g. RUN/weights/epoch*.pt (printed in epoch order)")
    p.add_argument("--data", required=True, help="data YAML whose val images were generated square")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="model YAML row numbers (default: the Detect inputs)")
    p.add_argument("--max-images", type=int, default=64)
    opt = parse_checked(p, RULES, argv)
    torch.set_num_threads(1)
    for weights in sorted(opt.weights, key=epoch_order):
        try:
            figures = measure(weights, opt.data, opt.layers, opt.max_images)
        except ValueError as e:
            p.error(str(e))
        print(f"{Path(weights).name:>12}  " + "  ".join(f"layer {i}: {d:7.2f}" for i, d in figures.items()), flush=True)


if __name__ == "__main__":
    main()
