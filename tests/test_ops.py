"""Box helpers, image-size rounding and NMS (utils/ops.py)."""

import numpy as np
import pytest
import torch

from benchmarks.speed.bench_nms import random_prediction, reference_nms
from utils import ops
from utils.errors import UserError
from utils.ops import (check_img_size, clip_boxes, make_divisible, non_max_suppression, scale_boxes, xywh2xyxy,
                       xywhn2xyxy, xyxy2xywh, xyxy2xywhn)


@pytest.fixture
def warnings_logged(monkeypatch):
    """Messages passed to LOGGER.warning during the test."""
    messages = []
    monkeypatch.setattr(ops.LOGGER, "warning", lambda msg, *a, **k: messages.append(msg))
    return messages


def test_xywh_xyxy_round_trip_tensor_and_numpy():
    xywh = np.array([[50.0, 40.0, 20.0, 10.0], [5.0, 5.0, 10.0, 10.0]])
    xyxy = xywh2xyxy(xywh)
    assert np.allclose(xyxy, [[40, 35, 60, 45], [0, 0, 10, 10]])
    assert np.allclose(xyxy2xywh(xyxy), xywh)
    tensor = torch.tensor(xywh)
    assert isinstance(xywh2xyxy(tensor), torch.Tensor)
    assert torch.allclose(xyxy2xywh(xywh2xyxy(tensor)), tensor)
    assert np.allclose(xywh, [[50.0, 40.0, 20.0, 10.0], [5.0, 5.0, 10.0, 10.0]]), "input must not change"


def test_normalised_conversions_with_padding_and_clip():
    xywhn = np.array([[0.5, 0.5, 0.2, 0.4]])
    xyxy = xywhn2xyxy(xywhn, w=200, h=100, padw=3, padh=7)
    assert np.allclose(xyxy, [[80 + 3, 30 + 7, 120 + 3, 70 + 7]])
    assert np.allclose(xyxy2xywhn(xywhn2xyxy(xywhn, 200, 100), 200, 100), xywhn)
    outside = np.array([[-10.0, -10.0, 110.0, 50.0]])
    assert np.allclose(xyxy2xywhn(outside, w=100, h=100, clip=True), [[0.5, 0.25, 1.0, 0.5]])


def test_clip_boxes_tensor_and_numpy():
    boxes = torch.tensor([[-5.0, -5.0, 300.0, 90.0]])
    clip_boxes(boxes, (80, 200))
    assert boxes.tolist() == [[0.0, 0.0, 200.0, 80.0]]
    arr = np.array([[10.0, -1.0, 250.0, 20.0]])
    assert np.allclose(clip_boxes(arr, (80, 200)), [[10, 0, 200, 20]])


def test_scale_boxes_inverts_letterbox():
    # original 100 x 200 (h, w) letterboxed into 64 x 64: gain 0.32, 16 px padding top and bottom
    original = torch.tensor([[20.0, 10.0, 60.0, 50.0]])
    letterboxed = original * 0.32 + torch.tensor([0.0, 16.0, 0.0, 16.0])
    restored = scale_boxes((64, 64), letterboxed.clone(), (100, 200))
    assert torch.allclose(restored, original, atol=1e-4)
    explicit = scale_boxes((64, 64), letterboxed.clone(), (100, 200), ratio_pad=((0.32, 0.32), (0.0, 16.0)))
    assert torch.allclose(explicit, original, atol=1e-4)


def test_make_divisible_and_check_img_size(warnings_logged):
    assert make_divisible(100, 32) == 128
    assert make_divisible(64, torch.tensor([8.0, 16.0, 32.0])) == 64
    assert check_img_size(640, 32) == 640
    assert warnings_logged == []
    assert check_img_size(100, 32) == 128
    assert len(warnings_logged) == 1 and "100" in warnings_logged[0] and "128" in warnings_logged[0]
    assert check_img_size([100, 64], 32) == [128, 64]
    assert check_img_size(32, 32, floor=64) == 64
    assert check_img_size(np.int64(64), 32) == 64 and check_img_size((64, np.int32(96)), 32) == [64, 96]


@pytest.mark.parametrize("bad", ["big", "640", 0, -32, 64.0, True, [64, 0], ["64"], [], None])
def test_check_img_size_refuses_what_is_not_a_positive_int_size(bad):
    """From Python code a string was split into digits ("640" -> [32, 32, 0]) and 0 passed on to cv2."""
    with pytest.raises(UserError, match=r"^--imgsz .*: expected a positive integer or a list of them$"):
        check_img_size(bad, 32)


def _prediction(rows, nc):
    """(1, n, 5 + nc) prediction from rows (x, y, w, h, obj, cls, cls_prob)."""
    pred = torch.zeros((1, len(rows), 5 + nc))
    for i, (x, y, w, h, obj, cls, p) in enumerate(rows):
        pred[0, i, :5] = torch.tensor([x, y, w, h, obj])
        pred[0, i, 5 + cls] = p
    return pred


def test_nms_suppresses_overlaps_of_same_class_only():
    pred = _prediction([(50, 50, 20, 20, 0.9, 0, 1.0),   # kept
                        (52, 50, 20, 20, 0.8, 0, 1.0),   # same class, IoU 0.82 -> removed
                        (51, 50, 20, 20, 0.7, 1, 1.0),   # other class -> kept
                        (150, 150, 20, 20, 0.6, 0, 1.0)],  # far away -> kept
                       nc=2)
    det = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45)[0]
    assert det.shape == (3, 6)
    assert torch.allclose(det[:, 4], torch.tensor([0.9, 0.7, 0.6]))
    assert det[:, 5].tolist() == [0.0, 1.0, 0.0]
    assert torch.allclose(det[0, :4], torch.tensor([40.0, 40.0, 60.0, 60.0]))

    agnostic = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45, agnostic=True)[0]
    assert torch.allclose(agnostic[:, 4], torch.tensor([0.9, 0.6]))


def test_nms_classes_filter_conf_threshold_and_max_det():
    pred = _prediction([(20 + 40 * i, 50, 20, 20, 0.9 - 0.1 * i, i % 2, 1.0) for i in range(6)], nc=2)
    assert len(non_max_suppression(pred, conf_thres=0.25)[0]) == 6
    only_class_1 = non_max_suppression(pred, conf_thres=0.25, classes=[1])[0]
    assert only_class_1[:, 5].tolist() == [1.0, 1.0, 1.0]
    confident = non_max_suppression(pred, conf_thres=0.55)[0]
    assert len(confident) == 4 and confident[:, 4].min() > 0.55
    top2 = non_max_suppression(pred, conf_thres=0.25, max_det=2)[0]
    assert torch.allclose(top2[:, 4], torch.tensor([0.9, 0.8]))


def test_nms_score_is_objectness_times_class_and_multi_label():
    pred = _prediction([(50, 50, 20, 20, 0.5, 0, 0.8)], nc=2)
    pred[0, 0, 6] = 0.6  # the same box is also class 1
    single = non_max_suppression(pred, conf_thres=0.1)[0]
    assert single.shape == (1, 6) and abs(single[0, 4].item() - 0.4) < 1e-6 and single[0, 5] == 0
    multi = non_max_suppression(pred, conf_thres=0.1, multi_label=True)[0]
    assert sorted(multi[:, 5].tolist()) == [0.0, 1.0]
    assert sorted(round(v, 4) for v in multi[:, 4].tolist()) == [0.3, 0.4]


def test_nms_batch_tuple_input_and_empty_images():
    confident = _prediction([(50, 50, 20, 20, 0.9, 0, 1.0)], 1)
    pred = torch.cat((confident, _prediction([(50, 50, 20, 20, 0.01, 0, 1.0)], 1)))
    out = non_max_suppression((pred, None), conf_thres=0.25)
    assert len(out) == 2 and out[0].shape == (1, 6) and out[1].shape == (0, 6)


def test_nms_hybrid_labels_become_detections():
    pred = _prediction([(150, 150, 20, 20, 0.9, 0, 1.0)], nc=2)
    labels = [torch.tensor([[1.0, 50.0, 50.0, 10.0, 10.0]])]
    det = non_max_suppression(pred, conf_thres=0.25, labels=labels)[0]
    assert len(det) == 2
    forced = det[det[:, 5] == 1]
    assert torch.allclose(forced[0], torch.tensor([45.0, 45.0, 55.0, 55.0, 1.0, 1.0]))


def test_nms_result_does_not_depend_on_the_clock(monkeypatch, warnings_logged):
    """A clock that jumps an hour per reading (a machine under heavy load) changes nothing."""
    import time
    pred = _prediction([(50, 50, 20, 20, 0.9, 0, 1.0), (150, 150, 20, 20, 0.8, 0, 1.0)], nc=1).repeat(16, 1, 1)
    expected = non_max_suppression(pred, conf_thres=0.25)
    hour = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(time, "time", lambda: float(next(hour)))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(hour)))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(hour)))
    got = non_max_suppression(pred, conf_thres=0.25)
    assert [len(o) for o in got] == [2] * 16
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert not warnings_logged


@pytest.mark.parametrize("kwargs, flag", [({"conf_thres": 1.5}, "--conf-thres"), ({"iou_thres": -0.1}, "--iou-thres"),
                                          ({"max_det": 0}, "--max-det"), ({"conf_thres": "0.5"}, "--conf-thres '0.5'"),
                                          ({"iou_thres": None}, "--iou-thres None"),
                                          ({"conf_thres": float("nan")}, "--conf-thres nan"),
                                          ({"max_det": 2.5}, "--max-det 2.5"), ({"max_det": True}, "--max-det True")])
def test_nms_rejects_bad_thresholds(kwargs, flag):
    with pytest.raises(UserError, match=flag):
        non_max_suppression(torch.zeros((1, 3, 7)), **kwargs)


@pytest.mark.parametrize("classes, shown", [([2], "--classes 2"), ([0, -1], "--classes 0 -1"), (["cat"], "--classes cat"),
                                             ([0.5], "--classes 0.5"), ([True], "--classes True"), ([], "(none)"),
                                             (5, "--classes 5")])
def test_nms_rejects_a_class_filter_the_model_cannot_match(classes, shown):
    """A class index outside 0..nc-1 (or not an index) would silently keep nothing: one line instead."""
    pred = _prediction([(50, 50, 20, 20, 0.9, 1, 1.0)], nc=2)
    with pytest.raises(UserError) as err:
        non_max_suppression(pred, conf_thres=0.25, classes=classes)
    assert shown in str(err.value) and "the model has 2 classes" in str(err.value) and "0 to 1" in str(err.value)


def test_nms_class_filter_takes_one_index_numpy_indices_and_a_tuple():
    pred = _prediction([(50, 50, 20, 20, 0.9, 1, 1.0), (150, 50, 20, 20, 0.8, 0, 1.0)], nc=2)
    for classes in (1, np.int64(1), (1,), np.array([1])):
        assert non_max_suppression(pred, conf_thres=0.25, classes=classes)[0][:, 5].tolist() == [1.0]


@pytest.mark.parametrize("seed, bs, n, nc, kwargs", [
    (0, 4, 3000, 3, {"conf_thres": 0.001, "iou_thres": 0.6, "multi_label": True}),   # val.py's settings
    (1, 3, 2000, 1, {"conf_thres": 0.25, "iou_thres": 0.45}),                       # detect.py's settings
    (2, 2, 1500, 5, {"conf_thres": 0.01, "iou_thres": 0.5, "agnostic": True, "max_det": 50}),
    (3, 2, 1500, 4, {"conf_thres": 0.05, "iou_thres": 0.3, "classes": [1, 3], "max_det": 1000}),
    (4, 2, 4000, 2, {"conf_thres": 0.001, "iou_thres": 0.7, "multi_label": True, "max_det": 5, "max_nms": 700}),
    (5, 3, 400, 3, {"conf_thres": 0.001, "iou_thres": 0.9, "multi_label": True, "max_det": 300}),
])
def test_nms_matches_per_image_reference(seed, bs, n, nc, kwargs):
    generator = torch.Generator().manual_seed(seed)
    pred = random_prediction(generator, bs, n, nc)
    pred[bs - 1, :, 4] = 0.0  # one image without candidates
    expected = reference_nms(pred, **kwargs)
    got = non_max_suppression(pred, **kwargs)
    assert [len(d) for d in got] == [len(d) for d in expected]
    assert any(len(d) for d in expected)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def _rows_sorted(det):
    """``det`` (n, 6) rows in lexicographic order."""
    for column in reversed(range(det.shape[1])):
        det = det[det[:, column].argsort(stable=True)]
    return det


def test_nms_hybrid_labels_match_reference():
    generator = torch.Generator().manual_seed(7)
    pred = random_prediction(generator, 3, 800, 3)
    labels = [torch.tensor([[2.0, 30.0, 40.0, 12.0, 9.0], [0.0, 200.0, 100.0, 20.0, 30.0]]), torch.zeros((0, 5)),
              torch.tensor([[1.0, 128.0, 128.0, 50.0, 40.0]])]
    kwargs = {"conf_thres": 0.001, "iou_thres": 0.6, "multi_label": True, "labels": labels}
    got, expected = non_max_suppression(pred, **kwargs), reference_nms(pred, **kwargs)
    for g, e in zip(got, expected):  # label rows tie at confidence 1.0, so compare as sets of rows
        assert torch.equal(_rows_sorted(g), _rows_sorted(e))
    assert (got[2][:, 4] == 1.0).sum() == 1 and (got[0][:, 4] == 1.0).sum() == 2


def test_yolo_label_lines_normalise_to_the_original_image_with_optional_confidence():
    from utils.ops import yolo_label_lines

    det = torch.tensor([[10.0, 20.0, 30.0, 60.0, 0.5, 2.0]])  # xyxy, conf, cls in a 100 x 200 (h x w) image
    assert yolo_label_lines(det, (100, 200, 3), save_conf=False) == ["2 0.1 0.4 0.1 0.4\n"]
    assert yolo_label_lines(det, (100, 200), save_conf=True) == ["2 0.1 0.4 0.1 0.4 0.5\n"]
    assert yolo_label_lines(det[:0], (100, 200), save_conf=False) == []
