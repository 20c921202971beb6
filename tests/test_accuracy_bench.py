"""The small-object benchmark's pieces: size-band AP, model variants and the tiny-shapes generator."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "scripts"))

from benchmarks.accuracy_bands import SIZE_BANDS, band_ap, band_image_stats, box_side  # noqa: E402
from benchmarks.accuracy_variants import swap_modules, variant_yaml  # noqa: E402
from make_tiny_shapes import MAX_SIDE, MIN_SIDE, make_tiny_shapes  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.files import yaml_load  # noqa: E402

TINY_BAND = SIZE_BANDS["very tiny <8"]


def test_box_side_is_sqrt_area():
    torch.testing.assert_close(box_side(torch.tensor([[0.0, 0.0, 4.0, 9.0], [5.0, 5.0, 3.0, 9.0]])),
                               torch.tensor([6.0, 0.0]))


def test_band_ap_counts_only_in_band_labels_and_ignores_out_of_band_detections():
    labels = torch.tensor([[0, 10, 10, 16, 16], [0, 50, 50, 70, 70.0]])  # 6 px (very tiny) and 20 px (small)
    exact = torch.tensor([[10, 10, 16, 16, 0.9, 0], [50, 50, 70, 70, 0.8, 0.0]])
    stats = [band_image_stats(exact, labels, TINY_BAND)]
    ap50, ap, n = band_ap(stats)
    assert n == 1 and ap50 == pytest.approx(1.0, abs=0.02) and ap == pytest.approx(1.0, abs=0.02)
    assert len(stats[0][1]) == 1  # the 20-px detection matched the out-of-band label: ignored

    spurious = torch.cat((torch.tensor([[100, 100, 104, 104, 0.95, 0.0]]), exact))  # in-band false positive first
    ap50_fp, _, _ = band_ap([band_image_stats(spurious, labels, TINY_BAND)])
    assert ap50_fp < 0.9


def test_band_ap_without_labels_or_detections():
    labels = torch.tensor([[1, 0, 0, 30, 30.0]])
    ap50, ap, n = band_ap([band_image_stats(torch.zeros((0, 6)), labels, TINY_BAND)])
    assert n == 0 and math.isnan(ap50) and math.isnan(ap)
    ap50, _, n = band_ap([band_image_stats(torch.zeros((0, 6)), labels, SIZE_BANDS["small 16-32"])])
    assert (ap50, n) == (0.0, 1)


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
