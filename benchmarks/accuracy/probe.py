"""Where a trained detector stands, per detection level: located boxes versus learned confidence.

For a checkpoint and a data set's validation images (square, at the size they were generated,
no letterbox), every raw prediction of every level is compared with the labels, before NMS:

- ``located``: share of labels that some prediction of the level overlaps at IoU > 0.5, and the
  median of each label's best IoU. On a dense level (stride 4) the anchors alone overlap most
  labels from initialisation on; compare with an ``epoch0.pt`` (``train.py --save-period``)
  before reading it as learned box regression.
- ``obj@hit`` / ``obj bg``: mean objectness of the best-scoring prediction with IoU > 0.5 against
  the median objectness of all other slots: has objectness learned to tell objects from background?
  Equal values mean the level's objectness is still at its prior.
- ``cls@hit``: mean best class probability of the same predictions.
- ``precision@100``: share of the 100 most confident predictions of all levels with IoU > 0.5.

    python -m benchmarks.accuracy.probe runs/train/exp/weights/last.pt --data datasets/glyphs.yaml
"""

from __future__ import annotations

import statistics

import cv2
import numpy as np
import torch

from models.backends import load_backend
from utils.dataset.data_config import check_dataset
from utils.dataset.image_io import img2label_paths
from utils.converters.sources import list_images
from utils.metrics import box_iou
from utils.ops import xywh2xyxy
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

HIT_IOU = 0.5


def load_pair(image_path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(1, 3, h, w)`` float image in [0, 1] and ``(n, 4)`` xyxy pixel labels."""
    im = cv2.imread(image_path)[:, :, ::-1]
    h, w = im.shape[:2]
    x = torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1)[None].float() / 255
    rows = np.loadtxt(img2label_paths([image_path])[0], ndmin=2).reshape(-1, 5)
    boxes = xywh2xyxy(torch.from_numpy(rows[:, 1:]).float()) * torch.tensor([w, h, w, h])
    return x, boxes


def level_slices(raw: list[torch.Tensor]) -> list[slice]:
    """Row ranges of each level in the concatenated eval output ``(bs, sum(na*ny*nx), no)``."""
    out, start = [], 0
    for r in raw:
        n = r.shape[1] * r.shape[2] * r.shape[3]
        out.append(slice(start, start + n))
        start += n
    return out


def probe_image(pred: torch.Tensor, levels: list[slice], labels: torch.Tensor, acc: dict) -> None:
    """Add one image's per-level figures to ``acc``; ``pred`` is ``(N, 5 + nc)`` decoded xywh."""
    for li, rows in enumerate(levels):
        p = pred[rows]
        iou = box_iou(labels, xywh2xyxy(p[:, :4]))  # (labels, slots)
        hit = (iou > HIT_IOU).any(0)
        conf = p[:, 4] * p[:, 5:].max(1).values
        level = acc.setdefault(li, {"best_iou": [], "obj_hit": [], "cls_hit": [], "obj_bg": []})
        level["best_iou"] += iou.max(1).values.tolist()
        level["obj_bg"].append(float(p[~hit, 4].median()))
        if hit.any():
            best = conf.masked_fill(~hit, -1).argmax()
            level["obj_hit"].append(float(p[best, 4]))
            level["cls_hit"].append(float(p[best, 5:].max()))
    acc.setdefault("conf", []).append(pred[:, 4] * pred[:, 5:].max(1).values)
    ious = torch.cat([box_iou(labels, xywh2xyxy(pred[rows, :4])).max(0).values for rows in levels])
    acc.setdefault("hit", []).append(ious > HIT_IOU)


def report(acc: dict, strides: list[int]) -> str:
    """Per-level table plus the precision of the 100 most confident predictions."""
    lines = ["level  stride  located  median best IoU  obj@hit  obj bg  cls@hit"]
    for li, stride in enumerate(strides):
        lv = acc[li]
        best = np.array(lv["best_iou"])
        mean = (lambda v: f"{statistics.fmean(v):.4f}" if v else "  -   ")
        lines.append(f"{li:>5}  {stride:>6}  {np.mean(best > HIT_IOU):>7.2f}  {np.median(best):>15.3f}  "
                     f"{mean(lv['obj_hit'])}  {statistics.fmean(lv['obj_bg']):.4f}  {mean(lv['cls_hit'])}")
    conf, hit = torch.cat(acc["conf"]), torch.cat(acc["hit"])
    top = conf.argsort(descending=True)[:100]
    lines.append(f"precision@100 over all levels: {hit[top].float().mean():.3f}")
    return "\n".join(lines)


def run(weights: str, data: str, max_images: int) -> str:
    backend = load_backend(weights, fuse=False)
    model = backend.model.eval()
    val_dir = check_dataset(data)["val"]
    acc: dict = {}
    for path in list_images(val_dir)[:max_images]:
        x, labels = load_pair(str(path))
        with torch.no_grad():
            pred, raw = model(x)
        probe_image(pred[0], level_slices(raw), labels, acc)
    return report(acc, [int(s) for s in backend.stride.tolist()])


RULES = OptionRules(positive=("max_images",), files=("data", "weights"))


@exit_on_user_error
def main(argv=None) -> None:
    p = parser_for("benchmarks.accuracy.probe", description=__doc__.splitlines()[0])
    p.add_argument("weights", help="a .pt checkpoint")
    p.add_argument("--data", required=True, help="data YAML whose val images were generated square")
    p.add_argument("--max-images", type=int, default=32)
    opt = parse_checked(p, RULES, argv)
    torch.set_num_threads(1)
    print(run(opt.weights, opt.data, opt.max_images))


if __name__ == "__main__":
    main()
