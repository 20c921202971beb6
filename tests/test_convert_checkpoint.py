"""utils/foreign_checkpoint.py: foreign pickled checkpoints converted without running their code."""

import argparse
import importlib.util
import os
import pickle
from copy import deepcopy
from pathlib import Path

import pytest
import torch
from torch import nn

import models.common
import models.yolo
import train
from models.experimental import attempt_load
from models.ffca import FFM_Concat2, FFM_Concat3
from models.yolo import Model
from utils.training.checkpoints import load_checkpoint, save_checkpoint
from convert_checkpoint import main
from utils.foreign_checkpoint import Placeholder, convert, match_weights, read_foreign_checkpoint
from utils.errors import UserError
from utils.files import yaml_load

ROOT = Path(__file__).resolve().parents[1]


def pickled_model_checkpoint(cfg, path, names=("a", "b")):
    """A YOLOv5-style checkpoint: whole model objects (fp16) pickled by torch.save, as upstream writes them."""
    torch.manual_seed(0)
    model = Model(cfg, nc=len(names)).eval()
    model.names = list(names)
    torch.save({"epoch": -1, "best_fitness": None, "model": deepcopy(model).half(), "ema": None,
                "optimizer": None, "opt": {"weights": ""}}, path)
    return model


@pytest.mark.slow
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


@pytest.mark.slow
def test_payload_never_runs(tiny_cfg, tmp_path, hostile_pickle):
    payload, marker = hostile_pickle
    src = tmp_path / "evil.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    ckpt = torch.load(src, weights_only=False)
    torch.save({**ckpt, "opt": payload, "ema": payload}, src)
    obj = read_foreign_checkpoint(src)
    assert not marker.exists()
    assert isinstance(obj["opt"], Placeholder) and obj["opt"].qualname.endswith(".open")
    with pytest.raises(UserError, match="no pickled model"):
        convert(src, tmp_path / "out.pt", Model)  # the payload sits where the EMA model should be
    assert not marker.exists()
    torch.load(src, weights_only=False)  # the ordinary unpickler does run it: the test can fail
    assert marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["top level", "layer row"])
def test_payload_inside_the_model_yaml_is_refused(tiny_cfg, tmp_path, hostile_pickle, capsys, where):
    """A model YAML dict holding a pickled object (not plain YAML data): one line, exit 2, nothing runs or is
    written."""
    payload, marker = hostile_pickle
    src, dst = tmp_path / "evil.pt", tmp_path / "out.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    ckpt = torch.load(src, weights_only=False)
    if where == "top level":
        ckpt["model"].yaml["extra"] = payload
    else:
        ckpt["model"].yaml["head"][0][3] = [payload]
    torch.save(ckpt, src)
    with pytest.raises(SystemExit) as e:
        main([str(src), str(dst)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR:") and "\n" not in err, err
    assert str(src) in err and "io.open" in err and "model YAML" in err
    assert not marker.exists() and not dst.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["evil.pt"]
    torch.load(src, weights_only=False)  # the ordinary unpickler does run it: the test can fail
    assert marker.exists()


@pytest.mark.slow
def test_ffm_pickled_by_this_project_keeps_the_fixed_arithmetic(tiny_cfg, tmp_path, log_lines):
    src = tmp_path / "ffm.pt"
    torch.manual_seed(0)
    model = Model(tiny_cfg).eval()
    with torch.no_grad():
        model.model[10].w[0] = 2.0  # layer 10 is an FFM_Concat2 in tests/models/tiny.yaml
    torch.save({"model": model, "ema": None}, src)
    ckpt = convert(src, tmp_path / "out.pt", Model)
    assert ckpt["converted_from"]["ffm_arithmetic"] == {"fixed": [10, 13, 16, 19]}
    assert [line for line in log_lines if "FFM arithmetic" in line] == [
        f"{src}: FFM arithmetic kept: fixed (this project's, mean-1 per-channel weights) in layers "
        "[10, 13, 16, 19] (docs/export.md)"]
    x = torch.rand(1, 3, 64, 96)
    torch.testing.assert_close(attempt_load(tmp_path / "out.pt", fuse=False)(x)[0], model(x)[0])


# ----------------------------------------------------------------------------- FFCA-YOLO authors' checkpoints
# Published facts about the authors' code (github.com/yemu1138178251/FFCA-YOLO): their train.py pickles
# the whole model, an instance of models.yolo.DetectionModel (YOLOv5 v7 layout, ``names`` a dict);
# FFM_Concat2/3 live in models.common with attributes d, Channel1.., w (ones at init) and epsilon 1e-4;
# forward: weight = w / (sum(w) + epsilon), input k multiplied as weight_k * x_k.view(N, H, W, C_k) and
# viewed back to (N, C_k, H, W), then concatenated on dim d.
def authors_ffm_reference(xs, w, epsilon=1e-4):
    """The authors' FFM, written out element-wise: flat element j of each image's C_k*H*W block of input
    k is multiplied by that input's normalised weight number ``j mod C_k``."""
    weight = w / (w.sum() + epsilon)
    out, start = [], 0
    for x in xs:
        c = x.shape[1]
        cycle = weight[start + torch.arange(x[0].numel()) % c]
        out.append((x.flatten(1) * cycle).view(x.shape))
        start += c
    return torch.cat(out, 1)


class AuthorsFFM(nn.Module):
    """Stand-in for the authors' FFM_Concat2/3 (pickled as models.common.FFM_Concat2/3)."""

    def __init__(self, channels, w):
        super().__init__()
        self.d = 1
        for k, c in enumerate(channels, 1):
            setattr(self, f"Channel{k}", c)
        self.w = nn.Parameter(w.clone())
        self.epsilon = 0.0001

    def forward(self, xs):
        return authors_ffm_reference(xs, self.w)


class AuthorsModel(nn.Module):
    """Stand-in for the authors' models.yolo.DetectionModel: ``yaml``, ``names``, ``model``, ``save``."""

    def __init__(self, yaml, names, layers, save):
        super().__init__()
        self.yaml, self.names, self.model, self.save = yaml, names, layers, save

    def forward(self, x):
        outputs = []
        for layer in self.model:
            if layer.f != -1:
                x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
            x = layer(x)
            outputs.append(x if layer.i in self.save else None)
        return x


AUTHORS_CLASSES = {
    (models.common, "FFM_Concat2"): type("FFM_Concat2", (AuthorsFFM,), {"__module__": "models.common"}),
    (models.common, "FFM_Concat3"): type("FFM_Concat3", (AuthorsFFM,), {"__module__": "models.common"}),
    (models.yolo, "DetectionModel"): type("DetectionModel", (AuthorsModel,), {"__module__": "models.yolo"}),
}


def authors_checkpoint(cfg, path, ffm_weights, monkeypatch):
    """Write a checkpoint as the authors' train.py does (whole fp32 model pickled) and return that model
    in eval mode. Its BatchNorms hold statistics of its own activations (authors' FFM scale) and
    random affine parameters; ``ffm_weights(n)`` gives each FFM layer's ``w``."""
    torch.manual_seed(0)
    ours = Model(cfg, nc=2)
    layers = ours.model
    for i, layer in enumerate(layers):
        if isinstance(layer, (FFM_Concat2, FFM_Concat3)):
            name = type(layer).__name__
            stand_in = AUTHORS_CLASSES[(models.common, name)](layer.channels, ffm_weights(sum(layer.channels)))
            stand_in.i, stand_in.f, stand_in.type, stand_in.np = layer.i, layer.f, f"models.common.{name}", layer.np
            layers[i] = stand_in
    model = AUTHORS_CLASSES[(models.yolo, "DetectionModel")](yaml_load(cfg) | {"ch": 3}, {0: "a", 1: "b"},
                                                            layers, ours.save)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batches
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.uniform_(bn.bias, -0.2, 0.2)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(4, 3, 64, 96))
    model.eval()
    with monkeypatch.context() as patch:
        for (module, name), cls in AUTHORS_CLASSES.items():
            patch.setattr(module, name, cls, raising=False)
        torch.save({"epoch": 99, "best_fitness": 0.5, "model": model, "ema": model, "optimizer": None}, path)
    return model


@pytest.mark.parametrize("ffm_weights", [lambda n: torch.full((n,), 1.7), lambda n: torch.rand(n) * 1.8 + 0.2],
                         ids=["equal", "unequal"])
@pytest.mark.slow
def test_authors_checkpoint_converts_to_the_authors_outputs(ffm_weights, tiny_cfg, tmp_path, monkeypatch, log_lines):
    src, dst = tmp_path / "authors.pt", tmp_path / "converted.pt"
    authors = authors_checkpoint(tiny_cfg, src, ffm_weights, monkeypatch)
    assert read_foreign_checkpoint(src)["model"].state["_modules"]["model"].state["_modules"]["10"].qualname == \
        "models.common.FFM_Concat2"
    ckpt = convert(src, dst, Model)
    assert ckpt["converted_from"]["ffm_arithmetic"] == {"authors": [10, 13, 16, 19]}
    assert [row[3] for row in ckpt["model_cfg"]["head"] if row[2].startswith("FFM")] == [[1, "authors"]] * 4
    assert [line for line in log_lines if "FFM arithmetic" in line] == [
        f"{src}: FFM arithmetic kept: authors' (w / sum(w), applied through .view(N, H, W, C)) in layers "
        "[10, 13, 16, 19], so outputs equal the authors' code (docs/export.md)"]
    converted = attempt_load(dst, fuse=False)  # rebuilt from the stored YAML, as train/val/export do
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        ref = authors(x)[0]
        out = converted(x)[0]
        fixed = Model({**ckpt["model_cfg"], "head": [[*r[:3], [1]] if r[2].startswith("FFM") else r
                                                     for r in ckpt["model_cfg"]["head"]]}, nc=2).eval()
        fixed.load_state_dict(converted.state_dict())
        fixed_out = fixed(x)[0]
    assert (out - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert (fixed_out - ref).abs().max() > 0.1 * ref.abs().max()  # the fixed FFM would not reproduce it
    finetuned = train.build_model(argparse.Namespace(cfg="", weights=str(dst)), {}, 2, ["a", "b"], "cpu", None)
    assert {layer.arithmetic for layer in finetuned.model if hasattr(layer, "arithmetic")} == {"authors"}
    with torch.no_grad():
        assert (finetuned.eval()(x)[0] - ref).abs().max() <= 1e-5 * ref.abs().max()  # train.py --weights


@pytest.mark.slow
def test_fixed_ffm_option_keeps_the_weights_and_switches_every_ffm_row(tiny_cfg, tmp_path, monkeypatch, log_lines):
    """--fixed-ffm: the same tensors, FFM rows [1, fixed], the switch logged and recorded; outputs then differ."""
    src = tmp_path / "authors.pt"
    authors = authors_checkpoint(tiny_cfg, src, lambda n: torch.rand(n) * 1.8 + 0.2, monkeypatch)
    kept = convert(src, tmp_path / "kept.pt", Model)
    main([str(src), str(tmp_path / "fixed.pt"), "--fixed-ffm"])
    fixed = load_checkpoint(tmp_path / "fixed.pt")
    assert [row[3] for row in fixed["model_cfg"]["head"] if row[2].startswith("FFM")] == [[1, "fixed"]] * 4
    assert fixed["converted_from"]["ffm_switched_to_fixed"] == [10, 13, 16, 19]
    assert kept["converted_from"]["ffm_switched_to_fixed"] == []
    assert fixed["model"].keys() == kept["model"].keys()
    assert all(torch.equal(fixed["model"][k], kept["model"][k]) for k in kept["model"])
    warned = [line for line in log_lines if "--fixed-ffm" in line]
    assert len(warned) == 1 and "[10, 13, 16, 19]" in warned[0] and f"--weights {tmp_path / 'fixed.pt'}" in warned[0]
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        ref = authors(x)[0]
        out = attempt_load(tmp_path / "fixed.pt", fuse=False)(x)[0]
    assert (out - ref).abs().max() > 0.1 * ref.abs().max()


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


def test_this_projects_own_checkpoint_needs_no_conversion(tmp_path, capsys, tiny_cfg):
    """best.pt from train.py (and a file convert_checkpoint.py wrote) is already plain: say so, write nothing."""
    src, converted = tmp_path / "upstream.pt", tmp_path / "converted.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    main([str(src), str(converted)])
    model = Model(tiny_cfg, nc=2)
    best = tmp_path / "best.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 2, "names": ["a", "b"], "model": None,
                     "ema": model.state_dict(), "epoch": 3, "best_fitness": 0.1}, best)
    for own in (best, converted):
        with pytest.raises(SystemExit) as e:
            main([str(own), str(tmp_path / "again.pt")])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and "\n" not in err, err
        assert f"{own}: already a checkpoint of this project" in err and "needs no conversion" in err
        assert f"--weights {own}" in err and "YOLOv5/FFCA-YOLO checkpoint?" not in err
    assert not (tmp_path / "again.pt").exists()


def test_destination_folder_or_unwritable_destination_exits_2(tmp_path, capsys, tiny_cfg, monkeypatch):
    src, folder = tmp_path / "ok.pt", tmp_path / "out"
    pickled_model_checkpoint(tiny_cfg, src)
    folder.mkdir()
    with pytest.raises(SystemExit) as e:
        main([str(src), str(folder)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR:") and "\n" not in err
    assert str(folder) in err and "is a folder" in err and not any(folder.iterdir())

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "new.pt"))

    monkeypatch.setattr("utils.foreign_checkpoint.save_checkpoint", full_disk)
    with pytest.raises(SystemExit) as e:
        main([str(src), str(tmp_path / "new.pt")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR:") and "\n" not in err
    assert "new.pt" in err and "No space left" in err


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


def test_loading_a_pickled_checkpoint_names_the_conversion_that_makes_it_load(tiny_cfg, tmp_path):
    src = tmp_path / "yolov5-like.pt"
    pickled_model_checkpoint(tiny_cfg, src)
    with pytest.raises(UserError) as refused:
        load_checkpoint(src)
    command = str(refused.value).split("python convert_checkpoint.py ", 1)[1].split()
    assert command == [str(src), str(tmp_path / "yolov5-like-converted.pt")]
    main(command)
    assert load_checkpoint(command[1])["model"]
