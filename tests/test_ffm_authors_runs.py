"""A converted FFCA-YOLO checkpoint (FFM rows in the authors' arithmetic) through train.py --weights,
--resume and val.py: the arithmetic survives every step, resume is bit-exact, val.py matches the live model."""

import copy
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import detect
import train
import val
from models.backends import load_backend
from models.yolo import Model
from tests.support.authors_ffm import AUTHORS_CFG, ffm_arithmetic
from tests.support.run_outputs import results_rows
from utils.dataset.data_config import check_dataset
from utils.training.checkpoints import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["circle", "square", "triangle", "cross"]


def authors_model(seed: int = 0) -> Model:
    """The tiny model in the authors' FFM arithmetic, as a converted checkpoint holds it: unequal FFM weights
    and BatchNorm statistics of its own (authors-scale) activations; objectness raised on the coarsest level
    and anchor k leaning to class k, so it detects something on any image."""
    torch.manual_seed(seed)
    model = Model(AUTHORS_CFG, nc=len(NAMES))
    with torch.no_grad():
        for layer in model.model:
            if hasattr(layer, "arithmetic"):
                layer.w.copy_(torch.rand_like(layer.w) * 1.8 + 0.2)
        model.train()
        for _ in range(3):
            model(torch.rand(4, 3, 64, 64))
        head = model.model[-1]
        bias = head.m[-1].bias.view(head.na, -1)
        bias[:, 4] += 6.0
        for k in range(head.na):
            bias[k, 5 + k] += 6.0
    return model.eval()


def write_converted(model: Model, path: Path) -> Path:
    """A checkpoint laid out as utils/foreign_checkpoint.py writes one (fp32 weights, no EMA, epoch -1)."""
    save_checkpoint({"model_cfg": model.yaml, "nc": len(NAMES), "names": NAMES, "model": model.state_dict(),
                     "ema": None, "epoch": -1, "best_fitness": None,
                     "converted_from": {"ffm_arithmetic": {"authors": [10, 13, 16, 19]}}}, path)
    return path


def with_fixed_ffm(model: Model) -> Model:
    """The same weights in this project's fixed FFM arithmetic."""
    cfg = copy.deepcopy(model.yaml)
    cfg["head"] = [[*row[:3], [1]] if str(row[2]).startswith("FFM") else row for row in cfg["head"]]
    fixed = Model(cfg, nc=len(NAMES))
    fixed.load_state_dict(model.state_dict())
    return fixed.eval()


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, shapes_data) -> Path:
    """train.py --weights converted.pt for 2 epochs with --save-period 1 (the run folder)."""
    tmp = tmp_path_factory.mktemp("authors")
    weights = write_converted(authors_model(), tmp / "converted.pt")
    train.run(weights=str(weights), cfg="", data=str(shapes_data), epochs=2, imgsz=64, batch_size=8, workers=0,
              device="cpu", project=str(tmp), name="run", exist_ok=True, save_period=1, noplots=True)
    return tmp / "run"


@pytest.mark.slow
def test_resume_of_a_converted_model_is_bit_exact_and_keeps_the_authors_arithmetic(finetuned, tmp_path):
    for name in ("epoch0.pt", "last.pt"):
        assert ffm_arithmetic(load_checkpoint(finetuned / "weights" / name)["model_cfg"]) == ["authors"] * 4, name
    copy_dir = tmp_path / "copy"
    (copy_dir / "weights").mkdir(parents=True)
    for f in ("hyp.yaml", "opt.yaml", "results.csv"):
        (copy_dir / f).write_bytes((finetuned / f).read_bytes())
    (copy_dir / "weights" / "last.pt").write_bytes((finetuned / "weights" / "epoch0.pt").read_bytes())
    train.run(resume=str(copy_dir / "weights" / "last.pt"))
    expected = (finetuned / "weights" / "sha256.txt").read_text().split()[0]
    assert (copy_dir / "weights" / "sha256.txt").read_text().split()[0] == expected
    assert results_rows(copy_dir) == results_rows(finetuned)
    assert ffm_arithmetic(load_checkpoint(copy_dir / "weights" / "last.pt")["model_cfg"]) == ["authors"] * 4


def self_labelled_set(model: Model, root: Path) -> Path:
    """Eight 64-px noise images labelled with ``model``'s own detections (detect.py, conf 0.5): a set on
    which the model scores well above zero, so a changed arithmetic shows in the metrics."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(8):
        cv2.imwrite(str(images / f"{i}.png"), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    found = detect.run(None, str(images), imgsz=(64,), model=copy.deepcopy(model), conf_thres=0.5, max_det=10,
                       save_txt=True, nosave=True, project=root, name="detect")
    for i in range(8):
        predicted = Path(found) / "labels" / f"{i}.txt"
        (labels / f"{i}.txt").write_text(predicted.read_text() if predicted.exists() else "")
    data_yaml = root / "self.yaml"
    data_yaml.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {NAMES}\n")
    return data_yaml


@pytest.mark.slow
def test_val_of_a_converted_checkpoint_matches_the_model_in_memory(tmp_path):
    model = authors_model(seed=1)
    data_yaml = self_labelled_set(model, tmp_path / "data")
    weights = write_converted(model, tmp_path / "converted.pt")
    options = dict(batch_size=8, imgsz=64, half=False, plots=False, max_det=30)
    from_file = val.run(str(data_yaml), weights=str(weights), device="cpu", workers=0,
                        project=str(tmp_path), name="val", **options)
    data = check_dataset(data_yaml)
    in_memory = val.run(data, model=copy.deepcopy(model), save_dir=tmp_path / "live", **options)
    fixed = val.run(data, model=with_fixed_ffm(model), save_dir=tmp_path / "fixed", **options)
    assert in_memory.map50 > 0.2, "the model should score on its own detections"
    # val.py fuses the loaded model and runs it channels-last, which moves scores in their last bits; with more
    # than one thread that can reorder near-tied detections, so metrics are compared with a small tolerance and
    # the arithmetic itself on the raw outputs
    assert np.allclose(from_file.metrics[:4], in_memory.metrics[:4], atol=0.05)
    assert np.allclose(from_file.maps, in_memory.maps, atol=0.05)
    assert not np.allclose(fixed.metrics[:4], in_memory.metrics[:4], atol=1e-3)
    images = torch.rand((2, 3, 64, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        loaded = load_backend(str(weights))(images)[0]
        reference = copy.deepcopy(model).eval()(images)[0]
        changed = with_fixed_ffm(model)(images)[0]
    file_error, arithmetic_effect = (loaded - reference).abs().max(), (changed - reference).abs().max()
    assert file_error < arithmetic_effect / 100  # the file computes the authors' arithmetic, not the fixed one
