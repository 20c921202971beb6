"""torchvision's compiled NMS kernel and its version, without importing the torchvision package.

``import torchvision`` imports torchvision.models, whose ops pull in ``torch._dynamo``: about 2.4 s on the
2-core machine, paid by every process (train.py, val.py, detect.py, each DDP rank and loader-free worker)
that only ever needs NMS. This module loads the same compiled library torchvision registers its operators
from (``torch.ops.torchvision.nms``, CPU and CUDA) in milliseconds, and reads the version from the
package's ``version.py`` as text. If the package is imported anyway, it shares the one loaded library.
"""

import ast
import glob
import os
from functools import lru_cache
from importlib.util import find_spec

import torch

from utils.errors import UserError


def _package_folder() -> str:
    spec = find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("torchvision is not installed; install the project's requirements: "
                        "pip install -r requirements.txt")
    return spec.submodule_search_locations[0]


@lru_cache(maxsize=None)
def _nms_kernel():
    """``torch.ops.torchvision.nms``, its library loaded once (the package's own import as the fallback)."""
    folder = _package_folder()
    libraries = sorted(glob.glob(os.path.join(folder, "_C*.so")) + glob.glob(os.path.join(folder, "_C*.pyd")))
    if libraries:
        torch.ops.load_library(libraries[0])
    else:  # a build that names its library otherwise: the slow, sure way
        import torchvision  # noqa: F401
    return torch.ops.torchvision.nms


def operators():
    """``torch.ops.torchvision`` with torchvision's library loaded (roi_align, deform_conv2d, ... as well as nms)."""
    _nms_kernel()
    return torch.ops.torchvision


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """Indices of the ``boxes`` (n, 4) xyxy that greedy NMS keeps, highest ``scores`` (n,) first."""
    return _nms_kernel()(boxes, scores, float(iou_thres))


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """NMS within each of ``groups`` (n,) integer labels; kept indices, highest score first.

    Computed as ``torchvision.ops.batched_nms`` computes it, so detections are the same: up to 4,000 box
    coordinates on CPU (20,000 elsewhere) in one call with the groups moved apart by an offset larger than
    any box, above that one call per group.
    """
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    if boxes.numel() > (4000 if boxes.device.type == "cpu" else 20000):
        return _nms_per_group(boxes, scores, groups, iou_thres)
    offsets = groups.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes))
    return nms(boxes + offsets[:, None], scores, iou_thres)


def _nms_per_group(boxes, scores, groups, iou_thres):
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for group in torch.unique(groups):
        members = torch.where(groups == group)[0]
        keep[members[nms(boxes[members], scores[members], iou_thres)]] = True
    kept = torch.where(keep)[0]
    return kept[scores[kept].sort(descending=True)[1]]


@lru_cache(maxsize=None)
def version() -> str:
    """``torchvision.__version__`` (local build tag included, e.g. '0.29.1+cu130'), read from the package's
    ``version.py`` without running it."""
    source = open(os.path.join(_package_folder(), "version.py"), encoding="utf-8").read()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    from importlib.metadata import version as installed_version

    return installed_version("torchvision")
