"""COCO JSON for --save-json: image ids from file names, ground truth from YOLO labels, prediction rows,
and the official pycocotools bbox evaluation with its summary at any ``maxDets``."""

import json
from pathlib import Path

import numpy as np

from utils.errors import UserError
from utils.files import atomic_write_bytes
from utils.logging import LOGGER
from utils.ops import xyxy2xywh


def coco_image_ids(im_files):
    """{file path str: COCO image id}: int stems when every stem is a number, else the stems themselves."""
    stems = [Path(f).stem for f in im_files]
    if len(set(stems)) != len(stems):
        duplicate = next(s for s in stems if stems.count(s) > 1)
        raise UserError(f"--save-json: several images are named '{duplicate}'; COCO image ids come from file "
                        "names, so give every image of the split a unique name")
    numeric = all(s.isnumeric() for s in stems)
    return {str(f): int(s) if numeric else s for f, s in zip(im_files, stems)}


def coco_ground_truth(im_files, shapes, labels, names):
    """COCO ground-truth dict from YOLO labels.

    ``shapes`` (N, 2) original (w, h); ``labels`` list of (n, 5) [cls, x, y, w, h] normalised.
    Category ids are class indices; boxes are [x_min, y_min, w, h] in original pixels.
    """
    ids = coco_image_ids(im_files)
    images, annotations = [], []
    for f, (w, h), lb in zip(im_files, shapes, labels):
        image_id = ids[str(f)]
        images.append({"id": image_id, "file_name": Path(f).name, "width": int(w), "height": int(h)})
        for cls, x, y, bw, bh in np.asarray(lb, dtype=np.float64).reshape(-1, 5):
            box = [(x - bw / 2) * w, (y - bh / 2) * h, bw * w, bh * h]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls),
                                "bbox": [round(v, 3) for v in box], "area": box[2] * box[3], "iscrowd": 0})
    categories = [{"id": i, "name": str(n)} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_predictions(det, image_id):
    """COCO result rows from (n, 6) [x1, y1, x2, y2, conf, cls] detections in original pixels."""
    det = det.detach().cpu().double()
    boxes = xyxy2xywh(det[:, :4])
    boxes[:, :2] -= boxes[:, 2:] / 2  # centre -> top-left corner
    return [{"image_id": image_id, "category_id": int(c), "bbox": [round(v, 3) for v in b],
             "score": round(float(s), 5)} for b, s, c in zip(boxes.tolist(), det[:, 4], det[:, 5])]


def coco_evaluate(gt_json, pred_json, max_det=100):
    """Official COCO bbox evaluation -> (mAP50-95, mAP50), or None when pycocotools is not installed.

    ``max_det`` replaces pycocotools' cap of 100 detections per image (``maxDets`` 1, 10, max_det).
    """
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        LOGGER.warning("pycocotools is not installed; skipping the official COCO evaluation "
                       "(pip install pycocotools)")
        return None
    gt = COCO(str(gt_json))
    if not json.loads(Path(pred_json).read_text()):
        LOGGER.warning(f"{pred_json}: no predictions to evaluate")
        return 0.0, 0.0
    evaluator = COCOeval(gt, gt.loadRes(str(pred_json)), "bbox")
    evaluator.params.maxDets = [1, 10, int(max_det)]
    evaluator.evaluate()
    evaluator.accumulate()
    stats = coco_summary(evaluator)  # not evaluator.summarize(): its first AP line assumes maxDets 100
    return stats[0], stats[1]


def coco_summary(evaluator):
    """pycocotools' 12 summary figures from an accumulated COCOeval, each at its own ``maxDets``; logs them.

    Returns [AP, AP50, AP75, AP small, medium, large, AR@maxDets[0], [1], [2], AR small, medium, large].
    """
    precision, recall = evaluator.eval["precision"], evaluator.eval["recall"]  # (T, R, K, A, M), (T, K, A, M)
    max_dets = evaluator.params.maxDets

    def mean(x):
        return float(x[x > -1].mean()) if (x > -1).any() else -1.0

    rows = [("Precision", "(AP)", "0.50:0.95", 0, -1, mean(precision[..., 0, -1])),
            ("Precision", "(AP)", "0.50", 0, -1, mean(precision[0, ..., 0, -1])),
            ("Precision", "(AP)", "0.75", 0, -1, mean(precision[5, ..., 0, -1]))]
    rows += [("Precision", "(AP)", "0.50:0.95", a, -1, mean(precision[..., a, -1])) for a in (1, 2, 3)]
    rows += [("Recall", "(AR)", "0.50:0.95", 0, m, mean(recall[..., 0, m])) for m in (0, 1, 2)]
    rows += [("Recall", "(AR)", "0.50:0.95", a, -1, mean(recall[..., a, -1])) for a in (1, 2, 3)]
    for kind, short, iou, a, m, value in rows:
        LOGGER.info(f" Average {kind:<9} {short} @[ IoU={iou:<9} | area={evaluator.params.areaRngLbl[a]:>6s} | "
                    f"maxDets={max_dets[m]:>3d} ] = {value:0.3f}")
    return [row[-1] for row in rows]


def save_and_evaluate(jdict, dataset, names, nc, single_cls, save_dir, weights, max_det=100):
    """Write ``<weights stem>_predictions.json`` (``jdict``: :func:`coco_predictions` rows) and the matching
    ground_truth_coco.json of ``dataset`` (its ``im_files``, ``shapes``, ``labels``) into ``save_dir``;
    return pycocotools' (mAP50-95, mAP50), or None without pycocotools."""
    stem = Path(weights[0] if isinstance(weights, (list, tuple)) else weights).stem if weights else "model"
    pred_json = save_dir / f"{stem}_predictions.json"
    gt_json = save_dir / "ground_truth_coco.json"
    labels = [np.column_stack((np.zeros(len(lb)), lb[:, 1:])) if single_cls else lb for lb in dataset.labels]
    gt = coco_ground_truth(dataset.im_files, dataset.shapes, labels, [names.get(i, str(i)) for i in range(nc)])
    atomic_write_bytes(gt_json, json.dumps(gt).encode())
    atomic_write_bytes(pred_json, json.dumps(jdict).encode())
    LOGGER.info(f"\nEvaluating pycocotools mAP... saving {pred_json}")
    result = coco_evaluate(gt_json, pred_json, max_det)
    if result is not None:
        LOGGER.info(f"pycocotools: mAP50-95 {result[0]:.4f}, mAP50 {result[1]:.4f}")
    return result
