"""The hyps this project adds (utils/extra_hyps.py): fall-backs for old hyp files, checks, NWD's constant C."""

import argparse
import math

import numpy as np
import pytest
import torch
import yaml

import train
from tests.conftest import ROOT
from utils.determinism.op_audit import detection_loss
from utils.errors import UserError
from utils.extra_hyps import EXTRA_HYP, mean_object_size, resolve_nwd_constant, with_extra_hyp

HYPS = sorted((ROOT / "data" / "hyps").glob("*.yaml"))


@pytest.mark.parametrize("path", HYPS, ids=lambda p: p.name)
def test_every_shipped_hyp_states_every_new_key_with_a_comment(path):
    text = path.read_text()
    hyp = yaml.safe_load(text)
    for key in EXTRA_HYP:
        assert key in hyp, f"{path.name} lacks {key}"
        line = next(line for line in text.splitlines() if line.startswith(f"{key}:"))
        assert "#" in line, f"{path.name}: {key} has no comment"
    assert with_extra_hyp(hyp, path.name) == hyp, "the shipped values pass the checks unchanged"
    assert hyp["nwd"] == 0 and hyp["nwd_assign"] == 0 and hyp["copy_paste_small"] == 0, "new options are off"


def test_missing_keys_take_the_old_behaviour():
    filled = with_extra_hyp({"lr0": 0.01}, "x")
    assert filled == {"lr0": 0.01, "min_box_px": 2.0, "nwd": 0.0, "nwd_assign": 0, "nwd_c": 0.0,
                      "copy_paste_small": 0.0, "obj_balance_by_stride": 0}


@pytest.mark.parametrize("key, value", [("nwd", -0.1), ("nwd", 1.01), ("nwd_assign", 0.5), ("nwd_assign", True),
                                        ("min_box_px", -1), ("copy_paste_small", 2), ("nwd_c", "big"),
                                        ("min_box_px", math.nan)])
def test_bad_values_name_the_source_and_key(key, value):
    with pytest.raises(UserError, match=f"--hyp h.yaml: {key}="):
        with_extra_hyp({key: value}, "--hyp h.yaml")


def test_load_hyp_accepts_an_old_file_and_rejects_a_bad_value(tmp_path):
    scratch = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({k: v for k, v in scratch.items() if k not in EXTRA_HYP}))
    hyp = train.load_hyp(argparse.Namespace(hyp=str(old), label_smoothing=0.0))
    assert hyp["min_box_px"] == 2.0 and hyp["nwd"] == 0.0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**scratch, "nwd": 2.0}))
    with pytest.raises(UserError, match=f"--hyp {bad}: nwd=2.0"):
        train.load_hyp(argparse.Namespace(hyp=str(bad), label_smoothing=0.0))


def test_mean_object_size_is_in_pixels_at_the_training_size():
    # image 1: 200 x 100 px shown at 100 px long side (scale 0.5); box 0.1 x 0.2 -> 20 x 20 px -> 10 px
    # image 2: 50 x 50 px enlarged to 100 (scale 2); boxes 0.2 x 0.2 -> 10 px -> 20 px, and 0.1 x 0.4 -> 5 x 20 -> 20 px
    labels = [np.array([[0, 0.5, 0.5, 0.1, 0.2]]), np.array([[1, 0.5, 0.5, 0.2, 0.2], [0, 0.3, 0.3, 0.1, 0.4]]),
              np.zeros((0, 5))]
    shapes = np.array([[200, 100], [50, 50], [64, 64]])
    assert mean_object_size(labels, shapes, 100) == pytest.approx((10 + 20 + 20) / 3)
    assert math.isnan(mean_object_size([np.zeros((0, 5))], shapes[:1], 100))


def test_resolve_nwd_constant_sets_records_and_keeps(tmp_path):
    labels, shapes = [np.array([[0, 0.5, 0.5, 0.1, 0.1]])], np.array([[64, 64]])
    off = with_extra_hyp({}, "x")
    assert resolve_nwd_constant(off, labels, shapes, 128) == off, "NWD off: C stays 0"
    record = tmp_path / "hyp.yaml"
    resolved = resolve_nwd_constant({**off, "nwd": 0.5}, labels, shapes, 128, record)
    assert resolved["nwd_c"] == pytest.approx(12.8)
    assert yaml.safe_load(record.read_text()) == resolved
    given = {**off, "nwd_assign": 1, "nwd_c": 3.0}
    assert resolve_nwd_constant(given, labels, shapes, 128)["nwd_c"] == 3.0, "a set C (or a resumed one) is kept"
    with pytest.raises(UserError, match="nwd_c"):
        resolve_nwd_constant({**off, "nwd": 1.0}, [np.zeros((0, 5))], shapes, 128)


def test_determinism_audit_runs_a_loss_with_nwd_before_c_is_known():
    from tests.support.loss_inputs import HYP, TINY_CFG
    from models.yolo import Model

    model = Model(dict(TINY_CFG))
    images = torch.zeros((2, 3, 64, 64))
    loss_fn = detection_loss({**HYP, "nwd": 0.5, "nwd_assign": 1, "nwd_c": 0.0})(model, images)
    assert torch.isfinite(loss_fn(model(images))).all()
