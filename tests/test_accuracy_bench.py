"""The small-object benchmark's pieces: model variants and the tiny-shapes generator."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "scripts"))

from benchmarks.accuracy_variants import swap_modules, variant_yaml  # noqa: E402
from make_tiny_shapes import MAX_SIDE, MIN_SIDE, make_tiny_shapes  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.files import yaml_load  # noqa: E402


def test_ablations_keep_layer_indices(tmp_path):
    base = yaml_load(ROOT / "models" / "ffca-yolo-n.yaml")
    concat = swap_modules(base, {"FFM_Concat2": "Concat", "FFM_Concat3": "Concat"})
    assert [r[0] for r in concat["head"]] == [r[0] for r in base["head"]]
    assert {r[2] for r in concat["head"]} & {"FFM_Concat2", "FFM_Concat3"} == set()
    for name in ("ffca-yolo-n-noSCAM", "ffca-yolo-n-noFEM", "ffca-yolo-n-concat", "yolov5n-p2"):
        model = Model(variant_yaml(name, tmp_path), nc=4)
        assert model.stride.tolist() == [4.0, 8.0, 16.0]
    with pytest.raises(KeyError, match="unknown variant"):
        variant_yaml("yolov9", tmp_path)


def test_tiny_shapes_sizes_and_refuses_to_overwrite(tmp_path):
    yaml_file = make_tiny_shapes(tmp_path / "tiny", n_train=4, n_val=2, seed=3)
    labels = np.concatenate([np.loadtxt(f, ndmin=2) for f in (tmp_path / "tiny" / "labels" / "train").glob("*.txt")])
    sides = np.sqrt(labels[:, 3] * labels[:, 4]) * 160
    assert len(labels) >= 4 * 3 and sides.min() >= MIN_SIDE * 0.5 and sides.max() <= MAX_SIDE * 1.5
    assert "names: [circle, square, triangle, cross]" in yaml_file.read_text()
    with pytest.raises(FileExistsError):
        make_tiny_shapes(tmp_path / "tiny", n_train=1, n_val=1)
