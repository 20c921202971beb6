"""Deterministic modes skip PyTorch's NaN fill of new tensors: proven not to change what training computes.

``torch.use_deterministic_algorithms(True)`` also fills every uninitialised tensor with NaN, so that a
kernel reading memory it never wrote poisons the result. Our modes turn the fill off for speed; these
runs train with it on and off and must end bit-identical, which can only hold if no kernel on the
training path reads uninitialised memory. The control shows that the comparison can fail: the same two runs
of a model with a layer that reads a tensor it never wrote end with different weights.
"""

import pytest
import torch

from models import yolo
from models.common import SPPF
from tests.conftest import TINY_CFG
from tests.support.run_outputs import assert_identical
from tests.support.training_runs import train_run
from utils import torch_utils

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


class SPPFReadingUnwritten(SPPF):
    """SPPF plus a small term taken from ``torch.empty_like``: a layer that reads memory it did not write."""

    def forward(self, x):
        y = super().forward(x)
        # Without the fill, the unwritten tensor most likely gets this freed block back (0.25, not a NaN left
        # by an earlier filled run); with it, NaN everywhere. Either way finite after nan_to_num, so both train.
        primer = torch.full_like(y, 0.25)
        del primer
        unwritten = torch.empty_like(y)
        return y + torch.nan_to_num(unwritten, nan=0.5, posinf=0.5, neginf=0.5).clamp(-1, 1) * 0.01


@pytest.mark.slow
def test_training_is_bit_identical_with_and_without_the_nan_fill(shapes_data, tiny_cfg, tmp_path, monkeypatch):
    skipped = train_run(tmp_path, shapes_data, tiny_cfg, name="skipped", epochs=1, noplots=True, noval=True)
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    monkeypatch.setattr(torch_utils, "NAN_FILL_UNINITIALIZED", True)
    filled = train_run(tmp_path, shapes_data, tiny_cfg, name="filled", epochs=1, noplots=True, noval=True)
    assert torch.utils.deterministic.fill_uninitialized_memory is True
    assert_identical(skipped, filled)


def test_scoped_mode_skips_the_fill_and_reports_it():
    torch_utils.configure_determinism("scoped", seed=0)
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert torch_utils.determinism_state()["fill_uninitialized_memory"] is False


@pytest.mark.slow
def test_a_layer_reading_unwritten_memory_fails_the_comparison(shapes_data, tmp_path, monkeypatch):
    monkeypatch.setitem(yolo._REGISTRY, "SPPFReadingUnwritten", yolo.ModuleSpec(SPPFReadingUnwritten, "in_out"))
    cfg = tmp_path / "tiny_reading_unwritten.yaml"
    cfg.write_text(TINY_CFG.read_text().replace("SPPF, [16, 5]", "SPPFReadingUnwritten, [16, 5]"))
    assert "SPPFReadingUnwritten" in cfg.read_text()
    skipped = train_run(tmp_path, shapes_data, cfg, name="skipped", epochs=1, noplots=True, noval=True)
    monkeypatch.setattr(torch_utils, "NAN_FILL_UNINITIALIZED", True)
    filled = train_run(tmp_path, shapes_data, cfg, name="filled", epochs=1, noplots=True, noval=True)
    with pytest.raises(AssertionError):
        assert_identical(skipped, filled)
