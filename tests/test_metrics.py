"""IoU, matching, AP, confusion matrix and plots (utils/metrics.py, utils/plots.py)."""

import json
import math

import numpy as np
import pytest
import torch

from utils.errors import UserError
from utils.metrics import (ConfusionMatrix, ap_per_class, bbox_iou, box_iou, compute_ap, fitness,
                           match_predictions)


def test_box_iou_known_values():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[5.0, 0.0, 15.0, 10.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    iou = box_iou(a, b)
    assert iou.shape == (1, 3)
    assert torch.allclose(iou, torch.tensor([[1 / 3, 1.0, 0.0]]), atol=1e-6)


def test_bbox_iou_variants_ordering_and_formats():
    a_xyxy = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b_xyxy = torch.tensor([[5.0, 2.0, 15.0, 14.0]])
    a_xywh, b_xywh = torch.tensor([[5.0, 5.0, 10.0, 10.0]]), torch.tensor([[10.0, 8.0, 10.0, 12.0]])
    iou = bbox_iou(a_xyxy, b_xyxy, xywh=False)
    assert torch.allclose(iou, bbox_iou(a_xywh, b_xywh), atol=1e-6)
    assert math.isclose(iou.item(), 40 / (100 + 120 - 40), rel_tol=1e-5)
    giou = bbox_iou(a_xywh, b_xywh, GIoU=True).item()
    # enclosing box 15 x 14 = 210, union 180
    assert math.isclose(giou, iou.item() - (210 - 180) / 210, rel_tol=1e-5)
    diou = bbox_iou(a_xywh, b_xywh, DIoU=True).item()
    assert math.isclose(diou, iou.item() - (5 ** 2 + 3 ** 2) / (15 ** 2 + 14 ** 2), rel_tol=1e-5)
    ciou = bbox_iou(a_xywh, b_xywh, CIoU=True).item()
    assert ciou < diou < iou.item()
    same = bbox_iou(a_xywh, a_xywh, CIoU=True)
    assert torch.allclose(same, torch.ones(1, 1), atol=1e-5)
    far = bbox_iou(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([[9.0, 9.0, 10.0, 10.0]]), xywh=False, GIoU=True)
    assert far.item() < -0.9


def test_match_predictions_iou_half_edge_and_coco_greedy_order():
    labels = torch.tensor([[0.0, 0.0, 0.0, 10.0, 10.0]])
    exactly_half = torch.tensor([[0.0, 0.0, 10.0, 20.0, 0.9, 0.0]])  # IoU 100/200
    correct = match_predictions(exactly_half, labels)
    assert correct.shape == (1, 10)
    assert correct[0].tolist() == [True] + [False] * 9
    just_below = torch.tensor([[0.0, 0.0, 10.0, 20.2, 0.9, 0.0]])  # IoU 100/202
    assert not match_predictions(just_below, labels).any()

    # the more confident detection takes the label even though the other overlaps more
    dets = torch.tensor([[0.0, 0.0, 10.0, 12.0, 0.9, 0.0],   # IoU 0.833
                         [0.0, 0.0, 10.0, 10.0, 0.5, 0.0],   # IoU 1.0, but lower confidence
                         [0.0, 0.0, 10.0, 10.0, 0.95, 1.0]])  # wrong class
    correct = match_predictions(dets, labels)
    assert correct[0].tolist() == [True] * 7 + [False] * 3
    assert correct[1].tolist() == [False] * 7 + [True] * 3  # free again above IoU 0.833
    assert not correct[2].any()


def _ap_single_class(order_is_correct, n_labels):
    """AP at IoU 0.5 for detections ranked by confidence; ``order_is_correct`` lists TP flags in rank order."""
    n = len(order_is_correct)
    tp = np.repeat(np.array(order_is_correct, dtype=bool)[:, None], 10, 1)
    conf = np.linspace(0.9, 0.1, n)
    *_, ap, classes, _ = ap_per_class(tp, conf, np.zeros(n), np.zeros(n_labels))
    assert classes.tolist() == [0]
    return ap[0, 0]


def test_ap_perfect_none_and_ranked_false_positive():
    assert _ap_single_class([True, True], 2) == pytest.approx(1.0)
    assert _ap_single_class([False, False], 2) == 0.0
    assert _ap_single_class([True, True, False], 2) == pytest.approx(1.0)  # FP ranked last costs nothing
    # confident FP first: precision 1/2 then 2/3 -> envelope 2/3 at every recall point
    assert _ap_single_class([False, True, True], 2) == pytest.approx(2 / 3)
    # FP in the middle: precision 1 up to recall 0.5 (51 of 101 points), 2/3 afterwards
    assert _ap_single_class([True, False, True], 2) == pytest.approx((51 + 50 * 2 / 3) / 101)
    # one of two labels never found: recall stops at 0.5
    assert _ap_single_class([True], 2) == pytest.approx(51 / 101)


def test_ap_per_class_multiclass_outputs_and_no_predictions():
    tp = np.array([[True] * 10, [True] * 10, [False] * 10])
    conf = np.array([0.9, 0.8, 0.7])
    pred_cls = np.array([0, 1, 1])
    target_cls = np.array([0, 1, 2])
    tp_out, fp_out, p, r, f1, ap, classes, curves = ap_per_class(tp, conf, pred_cls, target_cls, names=["a", "b"])
    assert classes.tolist() == [0, 1, 2]
    assert ap.shape == (3, 10)
    assert ap[:, 0].tolist() == pytest.approx([1.0, 1.0, 0.0])  # class 2 has a label and no prediction
    assert r.tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert tp_out.tolist() == [1.0, 1.0, 0.0]
    assert curves.names == ["a", "b", "2"]  # a class without a name keeps its id
    assert curves.precision.shape == curves.recall.shape == curves.f1.shape == (3, 1000)
    assert len(curves.pr) == 3 and curves.pr[2].shape == curves.recall_points.shape == (101,)
    assert curves.pr[0][-1] == 1.0 and not curves.pr[2].any()
    assert np.array_equal(curves.ap, ap)

    empty = ap_per_class(np.zeros((0, 10), bool), np.zeros(0), np.zeros(0), np.array([0, 0]))
    assert empty[5].shape == (1, 10) and not empty[5].any()


def test_compute_ap_matches_hand_envelope():
    ap, sampled = compute_ap(np.array([0.25, 0.5, 0.5, 1.0]), np.array([1.0, 1.0, 0.67, 0.8]))
    assert sampled.shape == (101,)
    assert sampled[50] == 1.0 and sampled[51] == pytest.approx(0.8)
    assert ap == pytest.approx((51 + 50 * 0.8) / 101)


@pytest.mark.slow
def test_confusion_matrix_counts(tmp_path):
    cm = ConfusionMatrix(nc=2, conf=0.25, iou_thres=0.45)
    labels = torch.tensor([[0.0, 0, 0, 10, 10], [1.0, 50, 50, 60, 60], [1.0, 100, 100, 110, 110]])
    dets = torch.tensor([[0.0, 0, 10, 10, 0.9, 0],       # correct class 0
                         [50.0, 50, 60, 60, 0.8, 0],     # class 1 predicted as 0
                         [200.0, 200, 210, 210, 0.9, 1],  # spurious
                         [100.0, 100, 110, 110, 0.1, 1]])  # below conf: label counts as missed
    cm.process_batch(dets, labels)
    expected = np.array([[1, 1, 0],
                         [0, 0, 1],
                         [0, 1, 0]])
    assert np.array_equal(cm.matrix, expected)
    tp, fp = cm.tp_fp()
    assert tp.tolist() == [1, 0] and fp.tolist() == [1, 1]
    cm.process_batch(None, labels[:1])
    assert cm.matrix[2, 0] == 1
    from utils.plots import plot_confusion_matrix
    plot_confusion_matrix(cm.matrix, ["a", "b"], tmp_path / "confusion_matrix.png")
    assert (tmp_path / "confusion_matrix.png").stat().st_size > 1000


def test_fitness_weights():
    rows = np.array([[0.9, 0.9, 0.5, 0.3, 1, 2, 3], [0, 0, 1.0, 0.0, 0, 0, 0]])
    assert fitness(rows).tolist() == pytest.approx([0.05 + 0.27, 0.1])


@pytest.mark.slow
def test_ap_curves_are_data_and_plots_draw_them(tmp_path):
    from utils.plots import plot_ap_curves
    tp = np.array([[True] * 10, [False] * 10])
    before = set(tmp_path.iterdir())
    curves = ap_per_class(tp, np.array([0.9, 0.4]), np.array([0, 1]), np.array([0, 1]), names=["cat", "dog"])[-1]
    assert set(tmp_path.iterdir()) == before and curves.names == ["cat", "dog"]  # computing draws nothing
    plot_ap_curves(curves, tmp_path, prefix="val_")
    for name in ("PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"):
        assert (tmp_path / f"val_{name}").stat().st_size > 1000


@pytest.mark.slow
def test_plot_results_and_labels(tmp_path):
    from utils.plots import plot_labels, plot_results
    csv = tmp_path / "results.csv"
    csv.write_text("epoch, train/box_loss, metrics/mAP_0.5\n0, 0.1, 0.2\n1, 0.08, 0.3\n2, 0.07, 0.35\n")
    plot_results(csv)
    assert (tmp_path / "results.png").stat().st_size > 1000
    with pytest.raises(UserError, match="missing.csv"):
        plot_results(tmp_path / "missing.csv")
    rng = np.random.default_rng(0)
    labels = np.column_stack((rng.integers(0, 3, 50), rng.uniform(0.1, 0.9, (50, 2)), rng.uniform(0.02, 0.2, (50, 2))))
    plot_labels(labels, names=["a", "b", "c"], save_dir=tmp_path)
    assert (tmp_path / "labels.jpg").stat().st_size > 1000


def test_annotator_draws_ascii_and_unicode_offline():
    from utils.plots import Annotator, colors
    im = np.zeros((64, 96, 3), np.uint8)
    annotator = Annotator(im.copy(), line_width=1)
    annotator.box_label([10, 20, 50, 60], "car 0.9", color=colors(3, bgr=True))
    drawn = annotator.result()
    assert drawn[20, 30].any() and not drawn[40, 30].any()  # edge coloured, inside untouched
    pil = Annotator(im.copy(), pil=True)
    pil.box_label([10, 20, 50, 60], "Straße", color=colors(1))
    assert pil.result().shape == (64, 96, 3) and pil.result().any()
    assert colors(0) != colors(1) and colors(0, bgr=True) == colors(0)[::-1]


def test_plot_images_mosaic(tmp_path):
    from PIL import Image

    from utils.plots import plot_images
    images = torch.zeros((3, 3, 64, 64), dtype=torch.uint8)
    labels = torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.5], [2, 1, 0.3, 0.3, 0.2, 0.2]])
    plot_images(images, labels, paths=["a.jpg", "b.jpg", "c.jpg"], fname=tmp_path / "batch.jpg", names=["x", "y"])
    mosaic = np.asarray(Image.open(tmp_path / "batch.jpg"))
    assert mosaic.shape == (128, 128, 3)
    predictions = np.array([[1, 0, 32, 32, 20, 20, 0.9]])
    plot_images(images, predictions, fname=tmp_path / "pred.jpg", names=["x", "y"])
    assert (tmp_path / "pred.jpg").is_file()


def _synthetic_dataset(rng, n_images=24, nc=3, size=(320, 240)):
    """Labels (normalised cls/xywh arrays) per image and predictions (n, 6) xyxy/conf/cls in pixels."""
    w, h = size
    labels, predictions = [], []
    for _ in range(n_images):
        n = rng.integers(0, 6)
        cls = rng.integers(0, nc, n)
        wh = rng.uniform(0.05, 0.3, (n, 2))
        xy = rng.uniform(wh / 2, 1 - wh / 2)
        lb = np.column_stack((cls, xy, wh)).astype(np.float32)
        labels.append(lb)
        boxes = np.column_stack(((xy - wh / 2) * (w, h), (xy + wh / 2) * (w, h)))
        dets = []
        for box, c in zip(boxes, cls):
            kind = rng.choice(["correct", "shifted", "duplicate", "wrong_class", "missed"])
            bw, bh = box[2] - box[0], box[3] - box[1]
            if kind == "missed":
                continue
            jitter = rng.normal(0, 0.02, 4) * (bw, bh, bw, bh)
            shifted = box + np.array([0.25 * bw, 0.1 * bh, 0.25 * bw, 0.1 * bh])
            if kind == "correct":
                dets.append([*(box + jitter), rng.uniform(0.3, 1.0), c])
            elif kind == "shifted":
                dets.append([*shifted, rng.uniform(0.1, 1.0), c])
            elif kind == "duplicate":
                dets.append([*(box + jitter), rng.uniform(0.5, 1.0), c])
                dets.append([*(box - jitter), rng.uniform(0.05, 0.6), c])
            else:
                dets.append([*(box + jitter), rng.uniform(0.1, 1.0), (c + 1) % nc])
        for _ in range(rng.integers(0, 3)):  # background false positives
            x1, y1 = rng.uniform(0, w - 40), rng.uniform(0, h - 40)
            dets.append([x1, y1, x1 + 30, y1 + 30, rng.uniform(0.01, 0.7), rng.integers(0, nc)])
        predictions.append(torch.tensor(np.array(dets, dtype=np.float32).reshape(-1, 6)))
    return labels, predictions


def test_map_agrees_with_pycocotools(tmp_path):
    pytest.importorskip("pycocotools")
    from utils import coco_eval
    from utils.ops import xywhn2xyxy

    rng = np.random.default_rng(7)
    size = (320, 240)
    labels, predictions = _synthetic_dataset(rng, size=size)
    im_files = [tmp_path / f"{i:06d}.jpg" for i in range(len(labels))]
    names = ["a", "b", "c"]

    stats = []
    for lb, det in zip(labels, predictions):
        gt = torch.tensor(np.column_stack((lb[:, 0], xywhn2xyxy(lb[:, 1:], *size))), dtype=torch.float32)
        stats.append((match_predictions(det, gt), det[:, 4].numpy(), det[:, 5].numpy(), lb[:, 0]))
    tp, conf, pred_cls, target_cls = (np.concatenate(x, 0) for x in zip(*stats))
    ap = ap_per_class(tp, conf, pred_cls, target_cls)[5]
    own_map50, own_map = ap[:, 0].mean(), ap.mean()

    gt_json = coco_eval.coco_ground_truth(im_files, np.array([size] * len(labels)), labels, names)
    ids = coco_eval.coco_image_ids(im_files)
    assert ids[str(im_files[3])] == 3
    pred_json = [row for f, det in zip(im_files, predictions) for row in coco_eval.coco_predictions(det, ids[str(f)])]
    (tmp_path / "gt.json").write_text(json.dumps(gt_json))
    (tmp_path / "pred.json").write_text(json.dumps(pred_json))
    coco_map, coco_map50 = coco_eval.coco_evaluate(tmp_path / "gt.json", tmp_path / "pred.json")

    assert 0.2 < own_map < 0.9, "the data set should be neither trivial nor hopeless"
    assert abs(own_map - coco_map) < 0.01
    assert abs(own_map50 - coco_map50) < 0.01


def test_coco_image_ids_are_numbers_or_stems_and_refuse_twin_names(tmp_path):
    from utils.coco_eval import coco_image_ids

    assert coco_image_ids([tmp_path / "000007.jpg", tmp_path / "12.png"]) == {str(tmp_path / "000007.jpg"): 7,
                                                                              str(tmp_path / "12.png"): 12}
    assert coco_image_ids([tmp_path / "7.jpg", tmp_path / "b.jpg"]) == {str(tmp_path / "7.jpg"): "7",
                                                                       str(tmp_path / "b.jpg"): "b"}
    with pytest.raises(UserError, match="several images are named 'a'"):
        coco_image_ids([tmp_path / "x" / "a.jpg", tmp_path / "y" / "a.png"])


def test_plot_val_study(tmp_path):
    from utils.plots import plot_val_study
    rows = np.array([[size, 0.5, 0.5, 0.4 + size / 1e4, 0.2 + size / 1e4, 0, 0, 0, 1.0, size / 100, 0.5]
                     for size in (256, 384, 512)])
    study = tmp_path / "study_data_w.txt"
    np.savetxt(study, rows)
    plot_val_study([study], tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 1000
