"""utils/convert_checkpoint.py: foreign pickled checkpoints converted without running their code."""

import importlib.util
import os
import pickle
from copy import deepcopy
from pathlib import Path

import pytest
import torch

from models.experimental import attempt_load
from models.yolo import Model
from utils.training.checkpoints import load_checkpoint
from convert_checkpoint import main
from utils.convert_checkpoint import Placeholder, convert, match_weights, read_foreign_checkpoint
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def pickled_model_checkpoint(cfg, path, names=("a", "b")):
    """A YOLOv5-style checkpoint: whole model objects (fp16) pickled by torch.save, as upstream writes them."""
    torch.manual_seed(0)
    model = Model(cfg, nc=len(names)).eval()
    model.names = list(names)
    torch.save({"epoch": -1, "best_fitness": None, "model": deepcopy(model).half(), "ema": None,
                "optimizer": None, "opt": {"weights": ""}}, path)
    return model


class MarkerPayload:
    """Unpickling this object runs ``open(marker, 'w')``: a stand-in for a malicious payload."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_converted_model_computes_what_the_pickled_model_computes(tiny_cfg, tmp_path):
    src, dst = tmp_path / "upstream.pt", tmp_path / "converted.pt"
    model = pickled_model_checkpoint(tiny_cfg, src)
    ckpt = convert(src, dst, Model)
    assert ckpt["converted_from"]["tensors"] == len(model.state_dict())
    assert load_checkpoint(dst)["names"] == ["a", "b"]  # plain data: weights_only loading works
    converted = attempt_load(dst, fuse=False)
    x = torch.rand(2, 3, 64, 96)
    ref = model.half().float()(x)[0]
    assert (converted(x)[0] - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_payload_never_runs(tiny_cfg, tmp_path):
    marker = tmp_path / "marker.txt"
    src = tmp_path / "evil.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    ckpt = torch.load(src, weights_only=False)
    torch.save({**ckpt, "opt": MarkerPayload(marker), "ema": MarkerPayload(marker)}, src)
    obj = read_foreign_checkpoint(src)
    assert not marker.exists()
    assert isinstance(obj["opt"], Placeholder) and obj["opt"].qualname.endswith(".open")
    with pytest.raises(UserError, match="no pickled model"):
        convert(src, tmp_path / "out.pt", Model)  # the payload sits where the EMA model should be
    assert not marker.exists()
    torch.load(src, weights_only=False)  # the ordinary unpickler does run it: the test can fail
    assert marker.exists()


def test_ffm_weights_that_differ_within_an_input_are_reported(tiny_cfg, tmp_path, log_lines):
    src = tmp_path / "ffm.pt"
    torch.manual_seed(0)
    model = Model(tiny_cfg).eval()
    with torch.no_grad():
        model.model[10].w[0] = 2.0  # layer 10 is an FFM_Concat2 in tests/models/tiny.yaml
    torch.save({"model": model, "ema": None}, src)
    ckpt = convert(src, tmp_path / "out.pt", Model)
    assert ckpt["converted_from"]["ffm_unequal_layers"] == [10]
    assert any("FFM layers [10]" in line for line in log_lines)


def test_match_weights_by_order_and_shape_within_a_layer():
    expected = {"model.0.a.weight": torch.zeros(2, 3), "model.0.b.weight": torch.zeros(4)}
    renamed = {"model.0.x.weight": torch.ones(2, 3), "model.0.y.weight": torch.full((4,), 2.0)}
    matched = match_weights(expected, renamed, "f.pt")
    assert matched["model.0.a.weight"].sum() == 6 and matched["model.0.b.weight"].sum() == 8
    with pytest.raises(UserError, match="unused"):
        match_weights(expected, {**renamed, "model.1.extra": torch.ones(1)}, "f.pt")
    with pytest.raises(UserError, match="unfilled"):
        match_weights(expected, {"model.0.x.weight": torch.ones(3, 2), "model.0.y.weight": torch.ones(4)}, "f.pt")


def test_bad_files_exit_2_with_one_line(tmp_path, capsys, tiny_cfg):
    not_zip = tmp_path / "plain.pt"
    not_zip.write_bytes(pickle.dumps({"model": 1}))
    weights_only = tmp_path / "plain_dict.pt"
    torch.save({"model": {"w": torch.ones(1)}}, weights_only)
    src = tmp_path / "ok.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    cases = [([str(tmp_path / "missing.pt"), "o.pt"], "checkpoint not found"),
             ([str(not_zip), "o.pt"], "not a zip-format torch checkpoint"),
             ([str(weights_only), "o.pt"], "no pickled model"),
             ([str(src), str(src)], "must differ from the source")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and message in err and "\n" not in err
    assert src.stat().st_size > 0 and not (Path(os.getcwd()) / "o.pt").exists()


@pytest.mark.skipif(importlib.util.find_spec("yolov5") is None,
                    reason="optional: pip install yolov5==7.0.14 to test a checkpoint written by upstream code")
def test_real_upstream_yolov5_checkpoint(tmp_path):
    import yolov5
    from yolov5.models.yolo import Model as UpstreamModel

    upstream = UpstreamModel(str(Path(yolov5.__file__).parent / "models" / "yolov5n.yaml"), nc=3).eval()
    upstream.names = {0: "x", 1: "y", 2: "z"}
    src = tmp_path / "yolov5n_upstream.pt"
    torch.save({"epoch": -1, "model": deepcopy(upstream).half(), "ema": None, "optimizer": None}, src)
    convert(src, tmp_path / "converted.pt", Model)
    converted = attempt_load(tmp_path / "converted.pt", fuse=False)
    x = torch.rand(1, 3, 128, 160)
    ref = upstream.half().float()(x)[0]
    assert converted.names == ["x", "y", "z"]
    assert (converted(x)[0] - ref).abs().max() <= 1e-4 * ref.abs().max()
