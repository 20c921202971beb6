"""Python API (models.Detector) and hubconf.py."""

import csv

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

import detect
from models import Detector, Detections
from tests.conftest import ROOT
from tests.support.checkpoints import write_tiny_checkpoint
from utils.errors import UserError

OPTIONS = {"imgsz": 64, "conf": 0.1, "iou": 0.45}


@pytest.fixture(scope="module")
def tiny_pt(tmp_path_factory, tiny_cfg):
    return write_tiny_checkpoint(tiny_cfg, tmp_path_factory.mktemp("api") / "tiny.pt")


@pytest.fixture(scope="module")
def image_path(shapes_data):
    return sorted((shapes_data.parent / "shapes" / "images" / "val").glob("*.jpg"))[0]


def test_paths_arrays_and_pil_images_give_the_same_detections(tiny_pt, image_path):
    detector = Detector(tiny_pt, **OPTIONS)
    rgb = cv2.imread(str(image_path))[..., ::-1].copy()
    by_path = detector(image_path)
    by_array, by_pil = detector([rgb, Image.fromarray(rgb)])
    assert isinstance(by_path, Detections) and len(by_path) > 0
    for other in (by_array, by_pil):
        assert np.array_equal(other.boxes, by_path.boxes) and np.array_equal(other.classes, by_path.classes)
    h, w = rgb.shape[:2]
    assert by_path.boxes[:, [0, 2]].max() <= w and by_path.boxes[:, [1, 3]].max() <= h and by_path.boxes.min() >= 0
    assert by_path.labels[0] in ("circle", "square", "triangle", "cross")


def test_detector_matches_detect_py_in_original_pixels(tiny_pt, image_path, tmp_path):
    run_dir = detect.run(str(tiny_pt), str(image_path), imgsz=64, conf_thres=0.1, save_csv=True, nosave=True,
                         project=tmp_path)
    with open(run_dir / "predictions.csv") as f:
        rows = sorted((int(r["class"]), *(float(r[k]) for k in ("x1", "y1", "x2", "y2"))) for r in csv.DictReader(f))
    det = Detector(tiny_pt, **OPTIONS)(str(image_path))
    ours = sorted((int(c), *b) for c, b in zip(det.classes, det.boxes.round().tolist()))
    assert len(ours) == len(rows) > 0
    assert np.abs(np.subtract(ours, rows)).max() <= 1.0


def test_options_filter_and_limit(tiny_pt, image_path):
    detector = Detector(tiny_pt, **OPTIONS)
    everything = detector(image_path)
    assert len(detector(image_path, max_det=3)) == 3
    assert len(detector(image_path, conf=0.99)) == 0
    only = detector(image_path, classes=[int(everything.classes[0])])
    assert len(only) > 0 and set(only.classes.tolist()) == {int(everything.classes[0])}
    gray = detector(np.zeros((40, 90), np.uint8))
    assert gray.boxes.shape[1] == 4


@pytest.mark.parametrize("image, message", [
    (np.zeros((32, 32, 3), np.float32), "must be uint8"),
    (np.zeros((32, 32, 2), np.uint8), "1, 3 or 4 channels"),
    ("missing.jpg", "not a readable image file"),
    (42, "expected paths, numpy arrays or PIL images"),
])
def test_bad_images_raise_one_line_user_errors(tiny_pt, image, message):
    with pytest.raises(UserError, match=message):
        Detector(tiny_pt, **OPTIONS)(image)


def test_options_set_as_attributes_apply_to_later_calls_as_in_yolov5_hub(tiny_pt, image_path):
    detector = Detector(tiny_pt, **OPTIONS)
    assert len(detector(image_path)) > 3
    detector.max_det = 3
    assert detector.options["max_det"] == 3 and len(detector(image_path)) == 3
    detector.conf = 0.99
    assert detector.conf == 0.99 and len(detector(image_path)) == 0
    assert len(detector(image_path, conf=OPTIONS["conf"])) == 3  # a call's own option still wins


def test_a_class_filter_outside_the_models_classes_is_a_user_error(tiny_pt, image_path):
    detector = Detector(tiny_pt, **OPTIONS)
    nc = len(detector.names)
    with pytest.raises(UserError, match=rf"^Detector: classes=\[{nc}\]: the model has {nc} classes; give class "
                                        rf"indices from 0 to {nc - 1}, or leave classes out to keep all$"):
        detector(image_path, classes=[nc])
    with pytest.raises(UserError, match=rf"^Detector: classes={nc}: "):  # shown as written, not as a list
        detector(image_path, classes=nc)
    detector.classes = 0  # one index, as YOLOv5's hub model takes it
    assert set(detector(image_path).classes.tolist()) <= {0}


@pytest.mark.parametrize("option, value, limit", [("conf", 2, "a number between 0.0 and 1.0"),
                                                  ("iou", "0.5", "a number between 0.0 and 1.0"),
                                                  ("max_det", 0, "a positive integer")])
def test_a_bad_threshold_is_named_as_the_keyword_the_caller_wrote(tiny_pt, image_path, option, value, limit):
    """Not detect.py's flag (``--conf-thres``): the caller of the Python API never wrote one."""
    detector = Detector(tiny_pt, **OPTIONS)
    expected = rf"^Detector: {option}={value!r}: must be {limit}$"
    with pytest.raises(UserError, match=expected):
        detector(image_path, **{option: value})
    setattr(detector, option, value)
    with pytest.raises(UserError, match=expected):
        detector(image_path)


def test_unknown_option_is_a_user_error(tiny_pt, image_path):
    with pytest.raises(UserError, match="unknown option"):
        Detector(tiny_pt, **OPTIONS)(image_path, confidence=0.5)


@pytest.mark.slow
def test_torch_hub_custom_loads_a_local_checkpoint(tiny_pt, image_path):
    detector = torch.hub.load(str(ROOT), "custom", path=str(tiny_pt), source="local", **OPTIONS)
    assert isinstance(detector, Detector)
    assert np.array_equal(detector(image_path).boxes, Detector(tiny_pt, **OPTIONS)(image_path).boxes)


def test_size_per_call_letterboxes_as_a_detector_of_that_size_would(tiny_pt, image_path):
    """YOLOv5's ``model(im, size=96)``: the same detections as a Detector built with ``imgsz=96``."""
    small, large = Detector(tiny_pt, **OPTIONS), Detector(tiny_pt, **{**OPTIONS, "imgsz": 96})
    for size in (96, (96, 96), 90):  # 90 rounds up to the stride, silently as in YOLOv5
        by_call = small(image_path, size=size)
        assert np.array_equal(by_call.boxes, large(image_path).boxes)
    assert not np.array_equal(small(image_path).boxes, large(image_path).boxes)
    assert small.imgsz == [64, 64]  # a call's size does not change the Detector
    assert all(np.array_equal(a.boxes, b.boxes) for a, b in zip(small([image_path] * 2, size=96),
                                                                [large(image_path)] * 2))


@pytest.mark.parametrize("size", [0, -32, (64,), (64, 64, 3), 64.0, True, "640"])
def test_a_bad_size_is_one_user_error_line(tiny_pt, image_path, size):
    with pytest.raises(UserError, match=r"^Detector: size=.*: give a positive int or \(height, width\)$"):
        Detector(tiny_pt, **OPTIONS)(image_path, size=size)
    with pytest.raises(UserError, match=r"^Detector: imgsz=.*: give a positive int or \(height, width\)$"):
        Detector(tiny_pt, **{**OPTIONS, "imgsz": size})


def test_hub_model_names_build_untrained_models_as_yolov5_pretrained_false():
    import hubconf

    model = hubconf.ffca_yolo_n(pretrained=False, classes=3)
    assert model.nc == 3 and model.model[-1].no == 3 + 5 and model.training
    reference = yaml_model("ffca-yolo-n", 3)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    assert hubconf.yolov5n(pretrained=False, classes=1, channels=1).model[0].conv.in_channels == 1
    with pytest.raises(UserError, match=r"^yolov5s: no pretrained weights are downloaded here; pass pretrained=False"):
        hubconf.yolov5s()
    for bad in ({"classes": 0}, {"classes": "5"}, {"channels": -1}, {"classes": True}):
        (name, value), = bad.items()
        with pytest.raises(UserError, match=rf"^ffca_yolo_n: {name}={value!r}: give a positive int$"):
            hubconf.ffca_yolo_n(pretrained=False, **bad)
    # torch.hub.list's rule: every public callable of hubconf.py is an entry point
    names = {n for n in dir(hubconf) if callable(getattr(hubconf, n)) and not n.startswith("_")}
    assert names == {"custom", "yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x", "ffca_yolo", "ffca_yolo_n",
                     "l_ffca_yolo"}


def yaml_model(name: str, nc: int):
    from models.yolo import Model

    return Model(ROOT / "models" / f"{name}.yaml", nc=nc)


def test_detect_finds_a_bare_data_yaml_name_for_class_names(tiny_pt, tmp_path, monkeypatch):
    """``detect.py --data toy.yaml`` from any folder reads the repository's data/toy.yaml, as YOLOv5."""
    import utils.options

    (tmp_path / "repo" / "data").mkdir(parents=True)
    (tmp_path / "repo" / "data" / "toy.yaml").write_text("names: [a, b, c, d]\n")
    monkeypatch.setattr(utils.options, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    backend = detect.load_backend(tiny_pt)
    assert detect.class_names(backend, "toy.yaml") == ["a", "b", "c", "d"] != backend.names
    with pytest.raises(UserError, match=r"^absent\.yaml: file not found$"):
        detect.class_names(backend, "absent.yaml")


@pytest.mark.parametrize("shape, imgsz", [((4, 8000), 64), ((8000, 4), 64), ((2, 4000), 640)])
def test_a_strip_thinner_than_one_pixel_at_the_input_size_is_padded_not_a_cv2_error(tiny_pt, shape, imgsz):
    strip = np.full((*shape, 3), 128, np.uint8)  # scaled to imgsz, its short side rounds to 0 px
    found = Detector(tiny_pt, imgsz=imgsz, conf=0.001)(strip)
    assert isinstance(found, Detections) and len(found) > 0
    h, w = shape
    assert found.boxes.min() >= 0 and found.boxes[:, [0, 2]].max() <= w and found.boxes[:, [1, 3]].max() <= h
