"""train.main's set-up order: the environment determinism needs is in place before CUDA can start."""

import os

import pytest

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
