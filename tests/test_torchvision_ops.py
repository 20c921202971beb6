"""utils/torchvision_ops.py: torchvision's NMS and version without importing the torchvision package (seconds
per process), with the same answers as the package's own functions."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision

from utils import torchvision_ops

ROOT = Path(__file__).resolve().parents[1]


def random_boxes(n, groups, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 600
    wh = torch.rand(n, 2, generator=g) * 80 + 2
    scores = torch.rand(n, generator=g)
    if ties:  # many equal scores: the order among them must match too
        scores = (scores * 5).round() / 5
    return torch.cat((xy, xy + wh), 1), scores, torch.randint(0, groups, (n,), generator=g)


@pytest.mark.parametrize("n, groups, ties", [(0, 1, False), (1, 1, False), (300, 1, False), (300, 7, False),
                                             (300, 7, True), (999, 3, False), (1001, 3, False), (3000, 20, True)])
def test_batched_nms_keeps_what_torchvision_keeps_in_the_same_order(n, groups, ties):
    for seed in range(3):
        boxes, scores, labels = random_boxes(n, groups, seed, ties)
        for iou in (0.3, 0.45, 0.7):
            ours = torchvision_ops.batched_nms(boxes, scores, labels, iou)
            assert torch.equal(ours, torchvision.ops.batched_nms(boxes, scores, labels, iou)), (n, groups, seed, iou)
    assert ours.dtype == torch.int64


def test_nms_drops_the_overlapping_lower_score():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]])
    assert torchvision_ops.nms(boxes, torch.tensor([0.5, 0.9, 0.1]), 0.5).tolist() == [1, 2]


def test_version_is_the_packages_own():
    assert torchvision_ops.version() == torchvision.__version__


def test_training_validation_and_detection_never_import_the_torchvision_package():
    code = ("import sys, train, val, detect; from utils.ops import non_max_suppression; import torch; "
            "non_max_suppression(torch.rand(1, 50, 9)); "
            "print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
