"""train.main's set-up order: the environment determinism needs is in place before CUDA can start."""

import os
from types import SimpleNamespace

import pytest
import torch

import train


class Stop(Exception):
    pass


@pytest.mark.parametrize("mode, expected", [("scoped", ":4096:8"), ("strict", ":4096:8"), ("off", None)])
def test_cublas_workspace_is_exported_before_the_device_is_selected(monkeypatch, tiny_cfg, shapes_data, tmp_path,
                                                                    mode, expected):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = {}

    def select_device(*args, **kwargs):
        seen["value"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        raise Stop

    monkeypatch.setattr(train, "select_device", select_device)
    opt = train.parse_opt(["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--project", str(tmp_path),
                           "--deterministic", mode])
    with pytest.raises(Stop):
        train.main(opt, argv=[])
    assert seen["value"] == expected


def test_default_mode_is_scoped_and_off_must_be_asked_for():
    assert train.parse_opt([]).deterministic == "scoped"
    assert train.parse_opt(["--deterministic"]).deterministic == "scoped"
    assert train.parse_opt(["--deterministic", "off"]).deterministic == "off"


def test_progress_text_is_refreshed_only_at_the_interval_and_the_last_batch():
    from utils.training.hooks import ProgressHook

    descriptions = []
    hook = ProgressHook(every=10)
    hook.bar = SimpleNamespace(set_description=descriptions.append, update=lambda n: None, close=lambda: None)
    imgs, targets = torch.zeros(2, 3, 64, 64), torch.zeros(5, 6)
    for i in range(25):
        loop = SimpleNamespace(batch=(i, imgs, targets, []), nb=25, epoch=1, opt=SimpleNamespace(epochs=3),
                               progress=SimpleNamespace(mloss=torch.tensor([0.1, 0.2, 0.3])), interrupted=False)
        hook.after_step(loop)
    assert len(descriptions) == 4, "batches 0, 10, 20 and the last (24)"
    assert "1/2" in descriptions[0] and "0.2" in descriptions[0]
