"""NMS before/after in one process: the per-image reference (:func:`reference_nms`) against utils.ops, alternating.

    python -m benchmarks.speed.bench_nms              # 16 images x 4032 predictions (yolov5n at 256 px), 3 classes
    python -m benchmarks.speed.bench_nms --reps 9 --threads 1

Prints the median of per-repetition time ratios (reference / current) at val.py's and detect.py's settings.
A benchmark, not a test: run it on an idle machine.
"""

import statistics
import sys
import time

import torch
import torchvision

from utils.ops import non_max_suppression, xywh2xyxy
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

SETTINGS = {"val": {"conf_thres": 0.001, "iou_thres": 0.6, "multi_label": True},
            "detect": {"conf_thres": 0.25, "iou_thres": 0.45, "max_det": 1000}}


def reference_nms(prediction, conf_thres, iou_thres, classes=None, agnostic=False, multi_label=False, labels=(),
                  max_det=300, max_nms=30000):
    """The per-image NMS that the vectorised one replaced: (bs, n, 5 + nc) -> bs tensors (k, 6) [xyxy, conf, cls].

    The A/B baseline of this benchmark; tests/test_ops.py holds utils.ops.non_max_suppression to its outputs.
    """
    bs, nc = prediction.shape[0], prediction.shape[2] - 5
    multi_label &= nc > 1
    output = [torch.zeros((0, 6))] * bs
    for xi, x in enumerate(prediction):
        if labels is not None and len(labels) and len(labels[xi]):
            lb = labels[xi]
            forced = torch.zeros((len(lb), 5 + nc))
            forced[:, :4] = lb[:, 1:5]
            forced[:, 4] = 1.0
            forced[torch.arange(len(lb)), lb[:, 0].long() + 5] = 1.0
            x = torch.cat((x, forced), 0)
        x = x[x[:, 4] > conf_thres]
        scores = x[:, 5:] * x[:, 4:5]
        box = xywh2xyxy(x[:, :4])
        if multi_label:
            i, j = (scores > conf_thres).nonzero(as_tuple=False).T
            det = torch.cat((box[i], scores[i, j, None], j[:, None].float()), 1)
        else:
            conf, j = scores.max(1, keepdim=True)
            det = torch.cat((box, conf, j.float()), 1)[conf.view(-1) > conf_thres]
        if classes is not None:
            det = det[(det[:, 5:6] == torch.tensor(classes)).any(1)]
        if not len(det):
            continue
        det = det[det[:, 4].argsort(descending=True)[:max_nms]]
        offsets = torch.zeros_like(det[:, 5]) if agnostic else det[:, 5]
        keep = torchvision.ops.batched_nms(det[:, :4], det[:, 4], offsets.long(), iou_thres)
        output[xi] = det[keep[:max_det]]
    return output


def random_prediction(generator, bs, n, nc, size=256.0):
    """(bs, n, 5 + nc) predictions: boxes spread over a ``size`` image, objectness skewed low as in practice."""
    pred = torch.rand((bs, n, 5 + nc), generator=generator)
    pred[..., :2] *= size
    pred[..., 2:4] = pred[..., 2:4] * size / 4 + 1
    pred[..., 4] = pred[..., 4] ** 3
    return pred


RULES = OptionRules(positive=("reps", "threads", "images", "predictions", "nc"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_nms", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--predictions", type=int, default=4032)
    parser.add_argument("--nc", type=int, default=3)
    args = parse_checked(parser, RULES, argv)
    torch.set_num_threads(args.threads)
    pred = random_prediction(torch.Generator().manual_seed(0), args.images, args.predictions, args.nc)
    for name, kwargs in SETTINGS.items():
        ratios, current = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            reference_nms(pred, **kwargs)
            t1 = time.perf_counter()
            non_max_suppression(pred, **kwargs)
            t2 = time.perf_counter()
            ratios.append((t1 - t0) / (t2 - t1))
            current.append((t2 - t1) / args.images * 1e3)
        print(f"{name}: reference / current = {statistics.median(ratios):.2f}x "
              f"(current {statistics.median(current):.2f} ms per image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
