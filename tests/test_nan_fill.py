"""Deterministic modes skip PyTorch's NaN fill of new tensors: proven not to change what training computes.

``torch.use_deterministic_algorithms(True)`` also fills every uninitialised tensor with NaN, so that a
kernel reading memory it never wrote poisons the result. Our modes turn the fill off for speed; these
runs train with it on and off and must end bit-identical, which can only hold if no kernel on the
training path reads uninitialised memory.
"""

import pytest
import torch

from tests.support.run_outputs import assert_identical
from tests.support.training_runs import train_run
from utils import torch_utils


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
