"""Detections kept per image in evaluation: the data YAML's ``max_det`` (AI-TOD: 1500) and its effect."""

import math
from pathlib import Path

import pytest
import torch

import val
from models.yolo import Model
from utils.training.checkpoints import save_checkpoint
from utils.dataset.data_config import check_dataset
from utils.errors import UserError
from utils.files import yaml_load
from utils.metrics import box_iou
from utils.ops import non_max_suppression
from utils.size_metrics import SizeBandStats

ROOT = Path(__file__).resolve().parents[1]
N_OBJECTS = 150  # more than COCO's 100 detections per image


def grid_of_tiny_objects(n=N_OBJECTS, side=6.0, pitch=20.0, columns=15):
    """(n, 4) xyxy boxes of ``side`` px (AI-TOD 'very tiny', area < 64) on a grid, none overlapping."""
    k = torch.arange(n, dtype=torch.float32)
    x1, y1 = (k % columns) * pitch + 2, (k // columns) * pitch + 2
    return torch.stack((x1, y1, x1 + side, y1 + side), 1)


def raw_predictions(boxes, nc=2):
    """Detect-style (1, n, 5 + nc) rows: centre xywh, objectness, class scores (class 0), confidences
    decreasing so the ones ranked beyond 100 are the later boxes."""
    xywh = torch.cat(((boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]), 1)
    conf = torch.linspace(0.95, 0.5, len(boxes))[:, None]
    cls = torch.cat((torch.ones(len(boxes), 1), torch.zeros(len(boxes), nc - 1)), 1)
    return torch.cat((xywh, conf, cls), 1)[None]


def test_ai_tod_yaml_sets_1500_and_bad_values_are_one_error(tmp_path):
    assert yaml_load(ROOT / "data" / "AI-TOD.yaml")["max_det"] == 1500
    (tmp_path / "images").mkdir()
    for value, ok in (('"1500"', False), ("0", False), ("true", False), ("2.5", False), ("120", True)):
        yaml_file = tmp_path / "d.yaml"
        yaml_file.write_text(f"path: {tmp_path}\ntrain: images\nval: images\nnames: [a]\nmax_det: {value}\n")
        if ok:
            assert check_dataset(yaml_file)["max_det"] == 120
        else:
            with pytest.raises(UserError, match="'max_det' must be a positive whole number") as e:
                check_dataset(yaml_file)
            assert "\n" not in str(e.value)


def test_flag_wins_then_yaml_then_300():
    assert val.detections_per_image(None, {"max_det": 1500}) == 1500
    assert val.detections_per_image(50, {"max_det": 1500}) == 50
    assert val.detections_per_image(None, {}) == 300
    assert val.parse_opt(["--data", "d.yaml", "--weights", "w.pt"]).max_det is None


def test_more_than_100_detections_per_image_are_kept_and_counted_by_size_band():
    boxes = grid_of_tiny_objects()
    assert box_iou(boxes, boxes).fill_diagonal_(0).max() == 0
    labels = torch.cat((torch.zeros(len(boxes), 1), boxes), 1)
    bands = {}
    for max_det in (1500, 100):
        kept = non_max_suppression(raw_predictions(boxes), conf_thres=0.001, iou_thres=0.6, max_det=max_det)[0]
        assert len(kept) == min(max_det, N_OBJECTS)
        stats = SizeBandStats()
        stats.add(kept, labels)
        bands[max_det] = stats.compute()
    full, capped = bands[1500], bands[100]
    assert full["very_tiny"]["instances"] == capped["very_tiny"]["instances"] == N_OBJECTS
    assert full["very_tiny"]["ar"] == pytest.approx(1.0)
    assert full["very_tiny"]["map50"] == pytest.approx(1.0, abs=0.01)
    assert capped["very_tiny"]["ar"] == pytest.approx(100 / N_OBJECTS)  # the cap, not the model, limits recall
    assert full["small"]["ar"] == pytest.approx(1.0)  # COCO small holds the same boxes
    assert all(math.isnan(full[k]["map"]) for k in ("tiny", "aitod_small", "aitod_medium", "medium", "large"))


@pytest.fixture
def trained_tiny(tiny_cfg, tmp_path):
    """A checkpoint of the tiny test model for the shapes data set's 4 classes."""
    torch.manual_seed(0)
    model = Model(tiny_cfg, nc=4)
    path = tmp_path / "tiny.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": ["circle", "square", "triangle", "cross"],
                     "model": model.state_dict(), "ema": None, "epoch": 0, "best_fitness": 0.0}, path)
    return path


@pytest.mark.slow
def test_validation_uses_the_data_yaml_max_det(trained_tiny, shapes_data, tmp_path, monkeypatch):
    seen = []
    real_nms = val.non_max_suppression

    def recording_nms(*args, **kwargs):
        seen.append(kwargs["max_det"])
        return real_nms(*args, **kwargs)

    monkeypatch.setattr(val, "non_max_suppression", recording_nms)
    data = check_dataset(shapes_data) | {"max_det": 1500}
    val.run(data, weights=str(trained_tiny), batch_size=8, imgsz=64, device="cpu", workers=0, project=tmp_path,
            name="v", plots=False)
    assert seen and set(seen) == {1500}
    seen.clear()
    val.run(data, weights=str(trained_tiny), batch_size=8, imgsz=64, device="cpu", workers=0, project=tmp_path,
            name="v2", plots=False, max_det=7)
    assert set(seen) == {7}


def _crowded_yaml(shapes_data, tmp_path, max_det=None):
    """The shapes data set's YAML, with ``max_det`` when given; returns (yaml, largest label count in val)."""
    yaml_file = tmp_path / "crowded.yaml"
    yaml_file.write_text(shapes_data.read_text() + (f"max_det: {max_det}\n" if max_det else ""))
    labels = Path(yaml_load(yaml_file)["path"]) / "labels" / "val"
    return yaml_file, max(len(f.read_text().splitlines()) for f in labels.glob("*.txt"))


def test_val_warns_once_when_images_hold_more_labels_than_max_det(trained_tiny, shapes_data, tmp_path, log_lines):
    """Recall cannot pass max_det / labels on an image; val.py used to report such a capped recall in silence."""
    yaml_file, most = _crowded_yaml(shapes_data, tmp_path)
    assert most >= 2
    val.run(str(yaml_file), weights=str(trained_tiny), batch_size=8, imgsz=64, device="cpu", workers=0,
            project=tmp_path, name="capped", plots=False, max_det=most - 1)
    warnings = [m for m in log_lines if "max_det" in m and "WARNING" in m]
    assert len(warnings) == 1, log_lines
    assert f"max_det {most - 1} " in warnings[0] and f"the most: {most} in " in warnings[0]
    assert f"raise --max-det (or the data YAML's max_det) to {most} or more" in warnings[0]
    log_lines.clear()
    val.run(str(yaml_file), weights=str(trained_tiny), batch_size=8, imgsz=64, device="cpu", workers=0,
            project=tmp_path, name="enough", plots=False, max_det=most)
    assert not [m for m in log_lines if "max_det" in m and "WARNING" in m]


@pytest.mark.slow
def test_training_warns_once_for_all_its_validations(shapes_data, tiny_cfg, tmp_path, log_lines):
    from tests.support.training_runs import train_run

    yaml_file, most = _crowded_yaml(shapes_data, tmp_path, max_det=1)
    train_run(tmp_path, yaml_file, tiny_cfg, epochs=2, noplots=True)  # validates after both epochs, then best.pt
    warnings = [m for m in log_lines if "max_det" in m and "WARNING" in m]
    assert len(warnings) == 1 and f"set max_det in the data YAML to {most} or more" in warnings[0], log_lines
