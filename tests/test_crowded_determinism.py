"""Crowded small-object data: where `off` stops being reproducible, `strict` and the default stay bit-identical.

The loss's ``pi[b, a, gj, gi]`` backward accumulates with ``index_put_``; without the determinism
flag PyTorch's CPU kernel adds in parallel once enough elements are indexed, which crowded images
(hundreds of tiny objects) reach and sparse ones do not.
"""

import hashlib

import cv2
import numpy as np
import pytest
import torch

import train
from models.yolo import Model
from tests.support.run_outputs import weights_checksum
from utils.files import yaml_load
from utils.loss import ComputeLoss
from utils.torch_utils import temporary_determinism

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

HYP = yaml_load(train.DEFAULT_HYP)


def crowded_targets(batch_size: int, per_image: int, nc: int, seed: int = 0) -> torch.Tensor:
    """(n, 6) targets [image, class, x, y, w, h]: ``per_image`` objects of 4-12 px in a 128-px image."""
    rng = np.random.default_rng(seed)
    n = batch_size * per_image
    image = np.repeat(np.arange(batch_size), per_image)
    cls = rng.integers(0, nc, n)
    xy = rng.uniform(0.05, 0.95, (n, 2))
    wh = rng.uniform(4, 12, (n, 2)) / 128
    return torch.tensor(np.column_stack((image, cls, xy, wh)), dtype=torch.float32)


def loss_gradient_hash(model, images, targets) -> str:
    """SHA-256 of every parameter gradient after one loss backward (DropPath's masks reseeded)."""
    torch.manual_seed(1)
    model.zero_grad()
    loss, _ = ComputeLoss(model, {**HYP, "label_smoothing": 0.0})(model(images), targets)
    loss.backward()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.grad.numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_crowded_loss_backward_is_bit_identical_with_the_flag(tiny_cfg):
    torch.manual_seed(0)
    model = Model(str(tiny_cfg), nc=4)
    images = torch.rand(16, 3, 128, 128)
    targets = crowded_targets(16, 40, nc=4)
    with temporary_determinism(True):
        hashes = {loss_gradient_hash(model, images, targets) for _ in range(6)}
    assert len(hashes) == 1
    assert len(targets) >= 640  # crowded enough for the parallel accumulation path


def write_crowded_dataset(root, n_train=8, n_val=4, per_image=150, size=128, seed=0):
    """A YOLO data set of ``size``-px images, each with ``per_image`` filled 4-10 px boxes."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for k in range(n):
            im = rng.integers(60, 200, (size, size, 3), dtype=np.uint8)
            rows = []
            for _ in range(per_image):
                cls, w, h = int(rng.integers(0, 2)), int(rng.integers(4, 11)), int(rng.integers(4, 11))
                x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
                im[y:y + h, x:x + w] = (255, 40, 40) if cls else (40, 40, 255)
                rows.append(f"{cls} {(x + w / 2) / size:.6f} {(y + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
            cv2.imwrite(str(root / "images" / split / f"{k}.png"), im)
            (root / "labels" / split / f"{k}.txt").write_text("\n".join(rows) + "\n")
    yaml_file = root / "crowded.yaml"
    yaml_file.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [blue, red]\n")
    return yaml_file


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "warn", None])  # None: the default, scoped (strict when the audit is clean)
def test_crowded_reruns_are_bit_identical(tmp_path, tiny_cfg, mode):
    data = write_crowded_dataset(tmp_path / "data")
    extra = {} if mode is None else {"deterministic": mode}
    runs = []
    for name in ("first", "second"):
        train.run(data=str(data), cfg=str(tiny_cfg), imgsz=128, batch_size=8, epochs=1, device="cpu", workers=0,
                  noplots=True, noautoanchor=True, project=str(tmp_path), name=name, exist_ok=True,
                  save_interval=0, **extra)
        runs.append(weights_checksum(tmp_path / name))
    assert runs[0] == runs[1]
