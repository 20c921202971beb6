"""AutoAnchor: recall maths, deterministic k-means, and in-place anchor replacement on a model."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from utils.autoanchor import (
    anchor_ratio_metric,
    anchor_stats,
    check_anchor_order_stride_units,
    check_anchors,
    kmean_anchors,
    kmeans,
)
from utils.errors import UserError


class FakeDetect(nn.Module):
    """The parts of Detect that AutoAnchor touches: anchors buffer (stride units), stride, nl, na."""

    def __init__(self, anchors_px, strides):
        super().__init__()
        self.stride = torch.tensor(strides, dtype=torch.float32)
        anchors = torch.tensor(anchors_px, dtype=torch.float32).view(len(strides), -1, 2)
        self.nl, self.na = anchors.shape[:2]
        self.register_buffer("anchors", anchors / self.stride.view(-1, 1, 1))


class FakeModel(nn.Module):
    """A model exposing ``yaml`` and ``model[-1]`` like models/yolo.Model."""

    def __init__(self, yaml_anchors, anchors_px, strides=(8, 16, 32)):
        super().__init__()
        self.yaml = {"anchors": yaml_anchors, "nc": 1}
        self.model = nn.Sequential(nn.Identity(), FakeDetect(anchors_px, strides))


def make_dataset(box_sizes_px, n_images=40, imgsz=640, seed=1):
    """Square 640-px images, each holding boxes drawn from ``box_sizes_px`` (normalised labels)."""
    rng = np.random.default_rng(seed)
    sizes = np.asarray(box_sizes_px, dtype=np.float64)
    labels = []
    for _ in range(n_images):
        picks = sizes[rng.integers(len(sizes), size=8)] * rng.uniform(0.95, 1.05, size=(8, 2))
        xy = rng.uniform(0.3, 0.7, size=(8, 2))
        labels.append(np.column_stack([np.zeros(8), xy, picks / imgsz]).astype(np.float32))
    return SimpleNamespace(shapes=np.full((n_images, 2), imgsz), labels=labels)


YOLOV5_P3_P5 = [[10, 13], [16, 30], [33, 23], [30, 61], [62, 45], [59, 119], [116, 90], [156, 198], [373, 326]]


def test_ratio_metric_and_bpr_on_hand_made_sizes():
    wh = np.array([[10.0, 10.0], [40.0, 40.0], [100.0, 10.0]])
    x, best = anchor_ratio_metric(wh, np.array([[10.0, 10.0], [20.0, 20.0]]))
    np.testing.assert_allclose(x, [[1.0, 0.5], [0.25, 0.5], [0.1, 0.2]])
    np.testing.assert_allclose(best, [1.0, 0.5, 0.2])
    # thr=4 means a fit must beat 1/4: the 40x40 box fits 10x10 at exactly 0.25, which is not enough
    bpr, aat = anchor_stats(wh, np.array([[10.0, 10.0]]), thr=4.0)
    assert bpr == pytest.approx(1 / 3) and aat == pytest.approx(1 / 3)
    bpr, aat = anchor_stats(wh, np.array([[10.0, 10.0], [40.0, 40.0]]), thr=4.0)
    assert bpr == pytest.approx(2 / 3) and aat == pytest.approx(2 / 3)
    bpr, _ = anchor_stats(wh, np.array([[10.0, 10.0], [40.0, 40.0]]), thr=10.0)
    assert bpr == pytest.approx(1.0)


def test_kmeans_finds_separated_clusters_and_repeats_under_seed():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = np.concatenate([c + rng.normal(0, 0.3, size=(50, 2)) for c in centres])
    found = kmeans(points, 3, np.random.default_rng(5))
    again = kmeans(points, 3, np.random.default_rng(5))
    np.testing.assert_array_equal(again, found)
    nearest = np.abs(found[:, None, :] - centres[None]).sum(2).argmin(1)
    assert sorted(nearest) == [0, 1, 2]  # one centroid per cluster
    np.testing.assert_allclose(found, centres[nearest], atol=0.2)


@pytest.mark.slow
def test_kmean_anchors_deterministic_and_sorted():
    dataset = make_dataset(YOLOV5_P3_P5, n_images=400)  # 3,200 boxes
    first = kmean_anchors(dataset, n=9, img_size=640, gen=1000, seed=3, verbose=False)
    second = kmean_anchors(dataset, n=9, img_size=640, gen=1000, seed=3, verbose=False)
    other = kmean_anchors(dataset, n=9, img_size=640, gen=50, seed=4, verbose=False)
    assert first.shape == (9, 2) and first.dtype == np.float32
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)
    area = first.prod(1)
    assert (np.diff(area) >= 0).all()
    wh = np.concatenate([lab[:, 3:5] * 640 for lab in dataset.labels])
    assert anchor_stats(wh, first.astype(np.float64), thr=4.0)[0] > 0.99


def test_kmean_anchors_drops_tiny_boxes_and_rejects_empty_data():
    dataset = make_dataset([[1.0, 1.0], [20.0, 20.0], [60.0, 60.0]], n_images=30)
    anchors = kmean_anchors(dataset, n=2, gen=100, seed=0, verbose=False)
    assert (anchors >= 2.0).all()  # the 1-px boxes do not drag an anchor below the 2-px floor
    empty = SimpleNamespace(shapes=np.full((2, 2), 640), labels=[np.zeros((0, 5), np.float32)] * 2)
    with pytest.raises(UserError, match="no labels"):
        kmean_anchors(empty, n=3, verbose=False)


def test_placeholder_anchors_are_replaced_in_stride_units_and_ordered():
    dataset = make_dataset(YOLOV5_P3_P5, n_images=60)
    placeholder = [list(range(6))] * 3  # what the model builder makes from `anchors: 3`
    model = FakeModel(3, placeholder)
    assert check_anchors(dataset, model, thr=4.0, imgsz=640, seed=7) is True
    detect = model.model[-1]
    pixels = (detect.anchors * detect.stride.view(-1, 1, 1)).view(-1, 2).numpy()
    expected = kmean_anchors(dataset, n=9, img_size=640, gen=1000, seed=7, verbose=False)
    np.testing.assert_allclose(pixels, expected, rtol=1e-5)
    level_area = detect.anchors.prod(-1).mean(-1) * detect.stride ** 2
    assert (level_area[1:] > level_area[:-1]).all()  # small anchors on the fine (stride 8) level
    # the configuration now carries the fitted pixel anchors, so a rebuilt model keeps them
    np.testing.assert_allclose(np.array(model.yaml["anchors"]).reshape(-1, 2), expected, atol=0.01)


def test_wrapped_model_is_unwrapped():
    dataset = make_dataset(YOLOV5_P3_P5, n_images=20)
    model = FakeModel(3, [list(range(6))] * 3)
    before = model.model[-1].anchors.clone()
    assert check_anchors(dataset, nn.DataParallel(model), seed=0) is True
    assert not torch.equal(model.model[-1].anchors, before)


def test_real_model_with_placeholder_anchors(tiny_cfg):
    if not tiny_cfg.is_file():
        pytest.skip(f"{tiny_cfg} not written yet")
    from models.yolo import Model
    from utils.files import yaml_load

    model = Model(dict(yaml_load(tiny_cfg), anchors=3), nc=1)
    detect = model.model[-1]
    dataset = make_dataset([[s, s] for s in (3, 6, 12, 24, 48, 96, 150, 200, 300)], n_images=20)
    assert check_anchors(dataset, model, imgsz=640, seed=0) is True
    pixels = (detect.anchors * detect.stride.view(-1, 1, 1)).view(-1, 2)
    assert (pixels.prod(1).diff() >= 0).all()
    rebuilt = Model(model.yaml, nc=1)
    torch.testing.assert_close(rebuilt.model[-1].anchors, detect.anchors, atol=0.01, rtol=0)


def test_good_anchors_are_left_unchanged():
    dataset = make_dataset(YOLOV5_P3_P5, n_images=40)
    model = FakeModel([sum(YOLOV5_P3_P5[i:i + 3], []) for i in (0, 3, 6)], YOLOV5_P3_P5)
    before = model.model[-1].anchors.clone()
    assert check_anchors(dataset, model, thr=4.0, imgsz=640, seed=0) is False
    assert torch.equal(model.model[-1].anchors, before)


def test_poor_anchors_are_improved():
    dataset = make_dataset([[200, 200], [300, 250], [400, 380]], n_images=30)
    tiny = [[2, 2], [3, 3], [4, 4]] * 3
    model = FakeModel([sum(tiny[i:i + 3], []) for i in (0, 3, 6)], tiny)
    before = model.model[-1].anchors.clone()
    assert check_anchors(dataset, model, seed=0) is True
    assert not torch.equal(model.model[-1].anchors, before)


def test_anchor_order_follows_descending_strides():
    detect = FakeDetect([[1, 1], [1, 1]], strides=[32, 8])
    stride = detect.stride.view(-1, 1, 1)
    detect.anchors[:] = torch.tensor([[[10.0, 10.0]], [[100.0, 100.0]]]) / stride  # stride units, as Detect holds them
    assert check_anchor_order_stride_units(detect) is True
    pixels = detect.anchors * stride
    assert pixels[0, 0, 0] == 100 and pixels[1, 0, 0] == 10
    assert check_anchor_order_stride_units(detect) is False  # already consistent: untouched
