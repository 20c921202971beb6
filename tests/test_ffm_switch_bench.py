"""benchmarks/accuracy/ffm_switch.py: the switch keeps every tensor, and the report reads the curves right."""

import torch

from benchmarks.accuracy.ffm_switch import recovery_epoch, report, switch_to_fixed
from models.yolo import Model
from tests.support.authors_ffm import AUTHORS_CFG, ffm_arithmetic
from utils.training.checkpoints import load_checkpoint, save_checkpoint


def test_switch_to_fixed_keeps_the_tensors_and_changes_only_the_ffm_rows(tmp_path):
    model = Model(AUTHORS_CFG, nc=4)
    src = tmp_path / "src.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": list("abcd"), "model": model.state_dict(),
                     "ema": None, "epoch": 5, "best_fitness": 0.1}, src)
    switched = load_checkpoint(switch_to_fixed(src, tmp_path / "fixed.pt"))
    assert ffm_arithmetic(switched["model_cfg"]) == ["fixed"] * 4
    assert ffm_arithmetic(load_checkpoint(src)["model_cfg"]) == ["authors"] * 4  # the source is untouched
    assert {k: v for k, v in switched["model_cfg"].items() if k != "head"} == \
        {k: v for k, v in model.yaml.items() if k != "head"}
    assert all(torch.equal(switched["model"][k], v) for k, v in model.state_dict().items())
    assert switched["epoch"] == 5 and switched["names"] == list("abcd")


def test_recovery_epoch_and_report():
    fixed = [(0.10, 0.02), (0.30, 0.05), (0.50, 0.09)]
    control = [(0.40, 0.06), (0.50, 0.07), (0.55, 0.08)]
    assert recovery_epoch(fixed, 0.05) == 2 and recovery_epoch(control, 0.05) == 1
    assert recovery_epoch(control, 0.09) is None
    lines = report((0.45, 0.09), (0.01, 0.001), fixed, control)
    assert lines[0] == "source (authors' arithmetic): mAP50 0.4500, mAP50-95 0.0900"
    assert lines[1] == "switched to fixed, before training: mAP50 0.0100, mAP50-95 0.0010"
    assert lines[4:7] == ["| 1 | 0.1000 | 0.0200 | 0.4000 | 0.0600 |", "| 2 | 0.3000 | 0.0500 | 0.5000 | 0.0700 |",
                          "| 3 | 0.5000 | 0.0900 | 0.5500 | 0.0800 |"]
    assert lines[-2:] == ["fixed: reaches the source's mAP50-95 0.0900 at epoch 3",
                          "control: reaches the source's mAP50-95 0.0900 at epoch - (not within 3)"]
