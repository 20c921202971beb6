"""P2 baselines (models/yolov5n-p2.yaml, yolov5s-p2.yaml): parse, stride-4 level, audit clean, CLI summary."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.yolo import Model
from utils.determinism.op_audit import audit_model

ROOT = Path(__file__).resolve().parents[1]
P2 = ["yolov5n-p2", "yolov5s-p2"]
WIDTH = {"yolov5n-p2": 0.25, "yolov5s-p2": 0.50}


@pytest.mark.slow
@pytest.mark.parametrize("name", P2)
def test_p2_model_detects_at_strides_4_to_32(name):
    model = Model(ROOT / "models" / f"{name}.yaml", nc=3)
    assert model.stride.tolist() == [4.0, 8.0, 16.0, 32.0]
    detect = model.model[-1]
    assert detect.nl == 4 and detect.na == 3 and detect.anchors.shape == (4, 3, 2)
    assert model.model[2].cv1.conv.in_channels == int(128 * WIDTH[name])  # width multiple applied
    model.train()
    outputs = model(torch.zeros(1, 3, 64, 64))
    assert [tuple(o.shape[2:4]) for o in outputs] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert all(o.shape[-1] == 3 + 5 for o in outputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", P2)
def test_p2_model_audits_clean(name):
    report = audit_model(Model(ROOT / "models" / f"{name}.yaml"), imgsz=64)
    assert report.clean, report.findings
    assert report.op_counts["backward"] > 0  # the backward pass really ran


@pytest.mark.slow
def test_p2_larger_than_its_p3_baseline():
    """The P2 head adds parameters over yolov5n; the summary line states them (the README's figure)."""
    n, n_p2 = (sum(p.numel() for p in Model(ROOT / "models" / f"{m}.yaml").parameters())
               for m in ("yolov5n", "yolov5n-p2"))
    assert n < n_p2 < 1.1 * n
    run = subprocess.run([sys.executable, "models/yolo.py", "--cfg", "models/yolov5n-p2.yaml"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert f"{n_p2} parameters" in run.stdout
