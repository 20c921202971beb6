"""Model zoo, YAML parser, FFCA-YOLO modules and the Detect head (CPU, small inputs)."""

import logging
import math
import os
import re
import subprocess
import sys
from copy import deepcopy
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from models.common import C3, Conv, fuse_conv_and_bn
from models.ffca import (FEM, SCAM, C3_Faster, DropPath, FasterBlock, FFM_Concat2, FFM_Concat3, _shareable,
                         global_avg_pool, global_max_pool, shared_input_convs)
from models.yolo import (Detect, DetectionModel, Model, parse_model, register_module,
                         layer_table, resolve_arg)
from models.yolo import main as yolo_main
from utils.autoanchor import check_anchor_order_stride_units
from utils.errors import UserError
from utils.files import yaml_load
from utils.logging import LOGGER

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
TINY = ROOT / "tests" / "models" / "tiny.yaml"
SHIPPED = ["yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x", "ffca-yolo", "l-ffca-yolo", "ffca-yolo-n"]
COCO_ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]

_BUILT: dict = {}
REUSED = {("yolov5n", None), ("yolov5s", None), ("ffca-yolo", None), ("l-ffca-yolo", None), ("ffca-yolo-n", None)}


def built(name: str, nc: int | None = None) -> DetectionModel:
    """Shipped models that several tests use are built once (builds dominate this file's run time);
    the large ones are built when asked and not kept, to spare the shared machine's memory."""
    key = (name, nc)
    if key in _BUILT:
        return _BUILT[key]
    model = Model(MODELS / f"{name}.yaml", nc=nc)
    if key in REUSED:
        _BUILT[key] = model
    return model


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def randomise_bn(model: nn.Module, seed: int = 0) -> None:
    """Give every BatchNorm non-trivial statistics and affine parameters, so fusing is really tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)


class LogCapture(logging.Handler):
    """Collects LOGGER messages (the project logger does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True, scope="module")
def single_intra_op_thread():
    """One intra-op thread: on the shared 2-core machine, OpenMP threads competing with other
    jobs made this file several times slower; restored afterwards for the other test files."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def log_capture():
    handler = LogCapture()
    LOGGER.addHandler(handler)
    yield handler
    LOGGER.removeHandler(handler)


def tiny_dict() -> dict:
    return yaml_load(TINY)


# ----------------------------------------------------------------------------- model zoo
@pytest.mark.parametrize("name, nc, expected", [
    ("yolov5n", None, 1_872_157),
    ("yolov5s", None, 7_235_389),
    ("yolov5m", None, 21_190_557),
    ("ffca-yolo", None, 7_293_159),
    ("l-ffca-yolo", None, 5_213_511),
    ("ffca-yolo", 2, 7_135_209),
    ("l-ffca-yolo", 2, 5_055_561),
])
@pytest.mark.slow
def test_parameter_counts_match_published_models(name, nc, expected):
    assert n_params(built(name, nc)) == expected


@pytest.mark.parametrize("name, gflops", [("ffca-yolo", 53.6), ("l-ffca-yolo", 39.5)])
def test_ffca_gflops_at_640(name, gflops):
    _, params, _, measured = built(name).info(imgsz=640)
    assert params == n_params(built(name))
    assert measured == pytest.approx(gflops, abs=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_yaml_forward_shapes(name):
    model = built(name)
    cfg = yaml_load(MODELS / f"{name}.yaml")
    assert cfg["nc"] == 80
    detect = model.model[-1]
    expected_strides = [4.0, 8.0, 16.0] if "ffca" in name else [8.0, 16.0, 32.0]
    assert model.stride.tolist() == expected_strides
    with torch.no_grad():
        for h, w in ((32, 64), (64, 32)):  # small and rectangular: ny != nx both ways
            x = torch.rand(1, 3, h, w)
            model.train()
            train_out = model(x)
            model.eval()
            pred, raw = model(x)
            shapes = [(1, 3, h // int(s), w // int(s), 85) for s in expected_strides]
            assert [tuple(t.shape) for t in train_out] == shapes
            assert [tuple(t.shape) for t in raw] == shapes
            assert tuple(pred.shape) == (1, sum(3 * h * w for _, _, h, w, _ in shapes), 85)
            assert 0 <= pred[..., 4:].min() and pred[..., 4:].max() <= 1
    assert detect.anchors.shape == (3, 3, 2)
    model.train()


def test_yolov5_anchors_are_stored_in_stride_units():
    detect = built("yolov5s").model[-1]
    pixels = detect.anchors * detect.stride.view(-1, 1, 1)
    assert torch.allclose(pixels, torch.tensor(COCO_ANCHORS, dtype=torch.float32).view(3, 3, 2))
    assert "model.24.anchors" in built("yolov5s").state_dict()


def test_placeholder_anchors_grow_with_stride_and_keep_yaml_count():
    model = built("ffca-yolo")
    detect = model.model[-1]
    assert model.yaml["anchors"] == 3 and detect.placeholder
    pixel_area = (detect.anchors * detect.stride.view(-1, 1, 1)).prod(-1).mean(-1)
    assert torch.all(pixel_area[1:] > pixel_area[:-1])
    assert torch.all(detect.anchors > 0)
    assert not check_anchor_order_stride_units(detect)


def test_check_anchor_order_stride_units_moves_reversed_pixel_anchors_back():
    detect = deepcopy(built("yolov5n").model[-1])
    stride = detect.stride.view(-1, 1, 1)
    original = detect.anchors.clone()
    detect.anchors[:] = (original * stride).flip(0) / stride
    assert check_anchor_order_stride_units(detect)
    torch.testing.assert_close(detect.anchors, original)
    assert not check_anchor_order_stride_units(detect)


def test_yaml_anchors_listed_large_to_small_are_reordered():
    cfg = tiny_dict()
    cfg["anchors"] = cfg["anchors"][::-1]
    detect = Model(cfg).model[-1]
    pixels = detect.anchors * detect.stride.view(-1, 1, 1)
    assert pixels.view(3, 6).tolist() == tiny_dict()["anchors"]


def test_detect_bias_priors():
    model = built("yolov5n")
    detect = model.model[-1]
    for conv, s in zip(detect.m, detect.stride.tolist()):
        # Bias before the priors is uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)); the prior shifts it.
        bound = 1 / math.sqrt(conv.in_channels)
        b = conv.bias.detach().view(3, 85)
        obj_prior = math.log(8 / (640 / s) ** 2)
        cls_prior = math.log(0.6 / (80 - 0.99999))
        assert torch.all((b[:, 4] - obj_prior).abs() <= bound + 1e-6)
        assert torch.all((b[:, 5:] - cls_prior).abs() <= bound + 1e-6)


def test_detect_decodes_cell_centres_and_anchor_sizes():
    detect = Detect(nc=2, anchors=[[10, 20, 30, 40], [50, 60, 70, 80]], ch=[4, 8])
    detect.stride.copy_(torch.tensor([8.0, 16.0]))
    detect.anchors /= detect.stride.view(-1, 1, 1)
    for conv in detect.m:
        nn.init.zeros_(conv.weight)
        nn.init.zeros_(conv.bias)
    detect.eval()
    pred, raw = detect([torch.rand(1, 4, 4, 6), torch.rand(1, 8, 2, 3)])
    assert [tuple(r.shape) for r in raw] == [(1, 2, 4, 6, 7), (1, 2, 2, 3, 7)]
    assert tuple(pred.shape) == (1, 2 * 24 + 2 * 6, 7)
    first = pred[0, : 2 * 24].view(2, 4, 6, 7)
    # zero logits: sigmoid 0.5 -> box centred on its cell, size = anchor, scores 0.5
    assert torch.allclose(first[1, 2, 5, :2], torch.tensor([(5 + 0.5) * 8, (2 + 0.5) * 8]))
    assert torch.allclose(first[1, 2, 5, 2:4], torch.tensor([30.0, 40.0]))
    second = pred[0, 2 * 24:].view(2, 2, 3, 7)
    assert torch.allclose(second[0, 1, 2, :4], torch.tensor([2.5 * 16, 1.5 * 16, 50.0, 60.0]))
    assert torch.all(pred[..., 4:] == 0.5)
    detect.train()
    assert [tuple(t.shape) for t in detect([torch.rand(1, 4, 4, 6), torch.rand(1, 8, 2, 3)])] == \
        [(1, 2, 4, 6, 7), (1, 2, 2, 3, 7)]


def test_model_yaml_is_a_plain_copy_and_nc_override_is_logged(log_capture):
    cfg = tiny_dict()
    model = Model(cfg, nc=5)
    cfg["backbone"].clear()
    assert model.yaml["backbone"], "model.yaml must not share lists with the caller's dict"
    assert model.yaml["nc"] == model.nc == 5 and model.model[-1].no == 10
    assert model.names == ["0", "1", "2", "3", "4"]
    assert yaml.safe_load(yaml.safe_dump(model.yaml)) == model.yaml
    assert any("nc=2" in m and "nc=5" in m for m in log_capture.messages)
    rebuilt = Model(model.yaml, nc=model.nc)
    rebuilt.load_state_dict(model.state_dict())


def test_anchor_override_with_count_gives_placeholders():
    model = Model(TINY, anchors=4.0)  # hyperparameter files give the count as a float
    assert model.model[-1].anchors.shape == (3, 4, 2) and model.model[-1].placeholder
    assert model.yaml["anchors"] == 4
    unchanged = Model(TINY, anchors=0)
    assert unchanged.yaml["anchors"] == tiny_dict()["anchors"] and not unchanged.model[-1].placeholder


def test_input_channels_argument():
    model = Model(TINY, ch=1)
    assert model.yaml["ch"] == 1 and model.model[0].conv.in_channels == 1
    assert tuple(model(torch.rand(1, 1, 32, 64))[2].shape) == (1, 3, 2, 4, 7)


def test_build_does_not_touch_rng_or_bn_statistics():
    torch.manual_seed(123)
    parse_model(tiny_dict(), ch=[3])
    after_layers_only = torch.rand(3)
    torch.manual_seed(123)
    model = Model(TINY)
    # The stride probe runs in eval mode: no DropPath draws, no BatchNorm statistic updates.
    assert torch.equal(torch.rand(3), after_layers_only)
    bn = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(m.running_mean == 0) and torch.all(m.running_var == 1) for m in bn)
    assert all(int(m.num_batches_tracked) == 0 for m in bn)
    assert model.training


@pytest.mark.slow
def test_fused_model_matches_unfused():
    torch.manual_seed(0)
    for model in (Model(TINY), deepcopy(built("ffca-yolo-n"))):
        randomise_bn(model)
        model.eval()
        x = torch.rand(2, 3, 64, 32)
        with torch.no_grad():
            expected, _ = model(x)
            fused = deepcopy(model).fuse()
            got, _ = fused(x)
        assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
        assert all(m.act.inplace for m in fused.modules() if isinstance(m, Conv) and isinstance(m.act, nn.SiLU))
        assert not any(m.inplace for m in model.modules() if isinstance(m, nn.SiLU)), "only the fused copy"
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fuse_conv_and_bn_with_bias_and_groups():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, 2, 1, groups=4, bias=True)
    bn = nn.BatchNorm2d(12)
    randomise_bn(bn)
    bn.eval()
    x = torch.randn(2, 8, 9, 9)
    torch.testing.assert_close(fuse_conv_and_bn(conv, bn)(x), bn(conv(x)), atol=1e-5, rtol=1e-5)


def test_info_logs_summary_line(log_capture):
    model = Model(TINY)
    layers, params, grads, gflops = model.info(imgsz=64)
    assert params == n_params(model) == grads and layers == len(list(model.modules()))
    assert gflops > 0
    assert model.info(imgsz=128)[3] == pytest.approx(4 * gflops)
    pattern = rf"^tiny summary: {layers} layers, (?:{params:,}|{params}) parameters, [\d,]+ gradients, [\d.]+ GFLOPs$"
    assert any(re.match(pattern, m) for m in log_capture.messages), log_capture.messages


def test_layer_table_lists_every_layer():
    model = Model(TINY)
    lines = layer_table(model).splitlines()
    assert len(lines) == 1 + len(model.model)
    assert lines[0].split() == ["from", "n", "params", "module", "arguments"]
    assert lines[17].split()[:5] == ["16", "[-1,", "11,", "5]", "1"]
    assert "models.ffca.FFM_Concat3" in lines[17] and "[[8, 8, 8], 1]" in lines[17]
    assert int(lines[22].split()[3]) == n_params(model.model[21])


@pytest.mark.slow
def test_cli_script_prints_table_and_summary():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ok = subprocess.run([sys.executable, "models/yolo.py", "--cfg", str(TINY), "--imgsz", "128"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "arguments" in ok.stdout and "models.yolo.Detect" in ok.stdout
    assert re.search(r"tiny summary: \d+ layers, [\d,]+ parameters, [\d,]+ gradients, [\d.]+ GFLOPs", ok.stdout)


@pytest.mark.parametrize("argv, fragment", [
    (["--cfg", "missing.yaml"], "missing.yaml: file not found"),
    (["--cfg", str(TINY), "--nc", "0"], "--nc must be a positive int, got 0"),
    (["--cfg", str(TINY), "--imgsz", "-5"], "--imgsz must be a positive int, got -5"),
])
def test_cli_bad_input_is_one_error_line_and_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as info:
        yolo_main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and err.count("\n") == 1 and fragment in err


# ----------------------------------------------------------------------------- parser errors
def build_error(cfg) -> str:
    with pytest.raises(UserError) as info:
        Model(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_module_names_row_and_value(tmp_path):
    cfg = tiny_dict()
    cfg["head"][3][2] = "Foo"
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(cfg))
    message = build_error(path)
    assert message.startswith(f"{path}: head row 3 (layer 11): unknown module 'Foo'")
    assert "register_module" in message and "SCAM" in message


@pytest.mark.parametrize("name", ["nn.NotAThing", "nn.functional", "nn.init", "__import__('os').getcwd", "eval"])
def test_strings_are_never_evaluated(name):
    cfg = tiny_dict()
    cfg["backbone"][1][2] = name
    assert f"backbone row 1 (layer 1): unknown module {name!r}" in build_error(cfg)


@pytest.mark.parametrize("section, index, row, fragment", [
    ("backbone", 1, [-1, 1, "Conv"], "expected [from, number, module, args]"),
    ("backbone", 1, "Conv", "expected [from, number, module, args]"),
    ("backbone", 2, [5, 1, "C3", [16]], "'from' index 5 does not name an earlier layer"),
    ("backbone", 0, [-2, 1, "Conv", [8, 3, 2]], "'from' index -2 does not name an earlier layer"),
    ("head", 2, [[-1, "x"], 1, "FFM_Concat2", [1]], "'from' must be an int or a list of ints"),
    ("head", 2, [[], 1, "FFM_Concat2", [1]], "'from' must be an int or a list of ints"),
    ("backbone", 1, [-1, 1, "Conv", 16], "args must be a list, got 16"),
    ("backbone", 2, [-1, 0, "C3", [16]], "repeats must be a positive int, got 0"),
    ("backbone", 2, [-1, "3", "C3", [16]], "repeats must be a positive int, got '3'"),
    ("backbone", 2, [-1, 1.5, "C3", [16]], "repeats must be a positive int, got 1.5"),
    ("backbone", 2, [-1, True, "C3", [16]], "repeats must be a positive int, got True"),
    ("backbone", 1, [-1, 1, "Conv", []], "first argument must be the output channels"),
    ("backbone", 1, [-1, 1, "Conv", ["wide", 3]], "first argument must be the output channels"),
    ("backbone", 1, [-1, 1, "Conv", [16, 3, 2, None, 1, 1, True, 9]], "could not be built"),
    ("backbone", 1, [-1, 1, 7, [16]], "unknown module 7"),
    ("head", 16, [[21, 22, 23], 1, "Detect", [0, "anchors"]], "Detect nc must be a positive int"),
    ("head", 16, [[21, 22], 1, "Detect", ["nc", "anchors"]], "anchors must be an int or 2 lists"),
    ("head", 16, [[21, 22, 23], 1, "Detect", ["nc", [[1, 2, 3]] * 3]], "anchors must be lists of positive"),
    ("head", 2, [[-1, 5], 1, "FFM_Concat3", [1]], "FFM_Concat3 fuses 3 inputs, got 2"),
    ("head", 2, [[-1, 5], 1, "FFM_Concat2", [2]], "dimension must be 1"),
    ("head", 2, [[-1, 5], 1, "FFM_Concat2", [1, "author"]], "arithmetic must be one of ('fixed', 'authors')"),
])
@pytest.mark.slow
def test_malformed_rows_name_row_and_value(section, index, row, fragment):
    cfg = tiny_dict()
    cfg[section][index] = row
    layer = index + (len(cfg["backbone"]) if section == "head" else 0)
    message = build_error(cfg)
    assert message.startswith(f"model dict: {section} row {index} (layer {layer}): "), message
    assert fragment in message, message


@pytest.mark.parametrize("key", ["nc", "backbone", "head"])
def test_missing_top_level_keys(key):
    cfg = tiny_dict()
    del cfg[key]
    assert f"missing top-level key '{key}'" in build_error(cfg)


@pytest.mark.parametrize("key, value, fragment", [
    ("nc", 0, "nc must be a positive int"),
    ("nc", "two", "nc must be a positive int"),
    ("width_multiple", -1, "width_multiple must be a positive number"),
    ("depth_multiple", "deep", "depth_multiple must be a positive number"),
    ("head", [], "'head' must be a non-empty list"),
    ("ch", "rgb", "ch (input channels) must be a positive int, got 'rgb'"),
])
def test_bad_top_level_values(key, value, fragment):
    cfg = tiny_dict()
    cfg[key] = value
    assert fragment in build_error(cfg)


def test_missing_anchors_key_and_missing_detect():
    cfg = tiny_dict()
    del cfg["anchors"]
    assert "needs a top-level 'anchors' key" in build_error(cfg)
    cfg = tiny_dict()
    cfg["head"] = cfg["head"][:-1]
    assert "last head row must be a Detect layer" in build_error(cfg)


def test_mismatched_feature_sizes_fail_the_probe_clearly():
    cfg = tiny_dict()
    cfg["head"][2] = [[-1, 1], 1, "FFM_Concat2", [1]]  # an upsampled /8 map with a /4 map
    message = build_error(cfg)
    assert message.startswith("model dict: a 128x128 probe forward failed") and "'from' indices" in message


def test_bad_cfg_paths(tmp_path):
    assert "file not found" in build_error(tmp_path / "nope.yaml")
    (tmp_path / "m.txt").write_text("nc: 1")
    assert "must be a .yaml file" in build_error(tmp_path / "m.txt")
    (tmp_path / "broken.yaml").write_text("backbone: [\n")
    assert "not valid YAML" in build_error(tmp_path / "broken.yaml")


def test_resolve_arg_names_and_literals():
    cfg = {"nc": 7, "anchors": 3}
    assert resolve_arg(["None", 2, "nearest", "nc", "anchors", "False", "True", [1, "nc"]], cfg) == \
        [None, 2, "nearest", 7, 3, False, True, [1, 7]]
    assert resolve_arg("os.system('x')", cfg) == "os.system('x')"


def test_parse_model_returns_layers_and_save_list():
    layers, save = parse_model(tiny_dict(), ch=[3])
    assert [layer.i for layer in layers] == list(range(25))
    assert layers[10].f == [-1, 5] and 5 in save and 3 in save and 14 in save
    assert all(layer.np == n_params(layer) for layer in layers)


# ----------------------------------------------------------------------------- registry
@register_module(style="same")
class ToyChannelGate(nn.Module):
    """Test attention module: scales channels by a learned sigmoid gate; shape kept."""

    def __init__(self, c1: int, init: float = 0.0):
        super().__init__()
        self.logit = nn.Parameter(torch.full((c1,), init))

    def forward(self, x):
        return x * self.logit.sigmoid().view(1, -1, 1, 1)


def test_custom_registered_module_builds_and_runs():
    cfg = tiny_dict()
    cfg["head"][13] = [14, 1, "ToyChannelGate", [2.0]]  # replaces SCAM on the P2 output
    model = Model(cfg)
    gate = model.model[21]
    assert isinstance(gate, ToyChannelGate) and gate.logit.shape == (8,)
    assert torch.all(gate.logit == 2.0)
    out = model(torch.rand(1, 3, 64, 64))
    assert tuple(out[0].shape) == (1, 3, 16, 16, 7)


def test_register_module_rejects_bad_registrations():
    with pytest.raises(TypeError):
        register_module(len)
    with pytest.raises(ValueError, match="style"):
        register_module(ToyChannelGate, name="ToyOther", style="sideways")
    with pytest.raises(ValueError, match="reserved"):
        register_module(ToyChannelGate, name="nn.Toy")

    class Impostor(nn.Module):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_module(Impostor, name="ToyChannelGate")


def test_nn_modules_resolve_from_torch_nn():
    cfg = tiny_dict()
    cfg["backbone"].insert(2, [-1, 1, "nn.BatchNorm2d", []])
    cfg["backbone"].insert(3, [-1, 1, "nn.Identity", []])
    shift = {k: k + 2 if k >= 2 else k for k in range(40)}

    def remap(f):
        return [remap(x) for x in f] if isinstance(f, list) else (shift[f] if f >= 0 else f)

    for row in cfg["backbone"][4:] + cfg["head"]:
        row[0] = remap(row[0])
    model = Model(cfg)
    assert isinstance(model.model[2], nn.BatchNorm2d) and model.model[2].num_features == 16
    assert model.stride.tolist() == [4.0, 8.0, 16.0]


# ----------------------------------------------------------------------------- FFCA modules
def test_fem_structure_parameters_and_output():
    torch.manual_seed(0)
    c1, c2 = 64, 32
    fem = FEM(c1, c2)
    i, mid = c1 // 8, (c1 // 8 // 2) * 3
    convs = [(m.conv.in_channels, m.conv.out_channels, m.conv.kernel_size, m.conv.dilation[0])
             for m in fem.branch_b]
    assert convs == [(c1, i, (1, 1), 1), (i, mid, (1, 3), 1), (mid, 2 * i, (3, 1), 1), (2 * i, 2 * i, (3, 3), 5)]
    convs = [(m.conv.kernel_size, m.conv.dilation[0]) for m in fem.branch_c]
    assert convs == [((1, 1), 1), ((3, 1), 1), ((1, 3), 1), ((3, 3), 5)]
    assert all(m.conv.bias is None and isinstance(m.bn, nn.BatchNorm2d) for m in fem.modules() if isinstance(m, Conv))
    weights = (c1 * 2 * i + 2 * i * 2 * i * 9
               + 2 * (c1 * i + i * mid * 3 + mid * 2 * i * 3 + 2 * i * 2 * i * 9)
               + 6 * i * c2 + c1 * c2)
    bn = 2 * (2 * i + 2 * i + 2 * (i + mid + 2 * i + 2 * i) + c2 + c2)
    assert n_params(fem) == weights + bn
    relu_flags = [isinstance(m.act, nn.ReLU) for m in fem.branch_b]
    assert relu_flags == [True, True, True, False]
    assert not isinstance(fem.project.act, nn.ReLU) and not isinstance(fem.shortcut.act, nn.ReLU)

    randomise_bn(fem)
    fem.eval()
    x = torch.randn(2, c1, 12, 10)
    with torch.no_grad():
        out = fem(x)
        cat = torch.cat([fem.branch_a(x), fem.branch_b(x), fem.branch_c(x)], 1)
        manual = torch.relu(0.1 * fem.project(cat) + fem.shortcut(x))
    assert out.shape == (2, c2, 12, 10)
    assert torch.all(out >= 0)
    torch.testing.assert_close(out, manual)


def test_fem_dilated_branches_see_five_pixels_away():
    torch.manual_seed(0)
    fem = FEM(16, 16).eval()
    with torch.no_grad():
        base = fem.branch_b(torch.zeros(1, 16, 21, 21))
        impulse = torch.zeros(1, 16, 21, 21)
        impulse[..., 10, 10] = 1.0
        change = (fem.branch_b(impulse) - base).abs().sum(1)[0]
    # 1x3 + 3x1 reach one pixel, the dilation-5 3x3 adds 5: rows 10 +- (0, 1, 5, 6) respond
    rows = sorted(torch.nonzero(change.sum(1) > 1e-7).flatten().tolist())
    assert rows == [4, 5, 6, 9, 10, 11, 14, 15, 16]


def test_fem_rejects_too_few_channels():
    with pytest.raises(ValueError, match="at least 16 input channels"):
        FEM(8, 8)


def buggy_view_fusion(xs, weight):
    """The widely copied FFM forward that applies weights through .view(N, H, W, C) (wrong)."""
    out, start = [], 0
    for x in xs:
        n, c, h, w = x.shape
        out.append((weight[start:start + c] * x.view(n, h, w, c)).view(n, c, h, w))
        start += c
    return torch.cat(out, 1)


@pytest.mark.parametrize("cls, channels", [(FFM_Concat2, [3, 5]), (FFM_Concat3, [2, 4, 3])])
def test_ffm_weights_multiply_their_own_channels(cls, channels):
    torch.manual_seed(0)
    ffm = cls(channels)
    with torch.no_grad():
        ffm.w.copy_(torch.arange(1.0, sum(channels) + 1))
    xs = [torch.randn(2, c, 4, 6) for c in channels]
    out = ffm(xs)
    cat = torch.cat(xs, 1)
    total = ffm.w.detach().sum() + 1e-4
    for c in range(sum(channels)):
        torch.testing.assert_close(out[:, c], cat[:, c] * (c + 1) * sum(channels) / total)
    assert not torch.allclose(out, buggy_view_fusion(xs, ffm.normalised_weights().detach()))
    assert n_params(ffm) == sum(channels)


def test_ffm_uniform_weights_and_input_checks():
    ffm = FFM_Concat2([2, 2])
    xs = [torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3)]
    torch.testing.assert_close(ffm(xs), torch.full((1, 4, 3, 3), 4 / (4 + 1e-4)))  # equal weights: a plain concat
    with pytest.raises(ValueError, match=r"built for channels \[2, 2\], got \[2, 3\]"):
        ffm([torch.ones(1, 2, 3, 3), torch.ones(1, 3, 3, 3)])
    with pytest.raises(ValueError, match="fuses 2 inputs"):
        FFM_Concat2([1, 2, 3])


def test_ffm_keeps_the_next_batchnorm_normalising_at_initialisation():
    """FFM weights sum to 1 upstream, scaling each channel by 1/C: the next BatchNorm's input variance
    then falls below its eps and its output starts near 0.09 std instead of 1 (docs/research/)."""
    torch.manual_seed(0)
    model = Model(ROOT / "models" / "ffca-yolo-n.yaml", nc=4).train()
    ffm_ids = [layer.i for layer in model.model if isinstance(layer, (FFM_Concat2, FFM_Concat3))]
    assert len(ffm_ids) == 4
    stds = []
    hooks = [model.model[i + 1].cv1.bn.register_forward_hook(lambda m, i, o: stds.append(float(o.detach().std())))
             for i in ffm_ids]
    model(torch.rand(4, 3, 64, 64))
    for h in hooks:
        h.remove()
    assert len(stds) == 4 and min(stds) > 0.5, stds
    for i in ffm_ids:
        torch.testing.assert_close(model.model[i].normalised_weights().mean().item(), 1.0, atol=1e-5, rtol=0)


def test_global_pools_equal_adaptive_pools_exactly():
    torch.manual_seed(0)
    for shape in [(2, 16, 7, 9), (1, 3, 1, 1), (3, 32, 20, 20)]:
        x = torch.randn(shape)
        assert torch.equal(global_avg_pool(x), nn.AdaptiveAvgPool2d(1)(x).flatten(1))
        assert torch.equal(global_max_pool(x), nn.AdaptiveMaxPool2d(1)(x).flatten(1))


def reference_scam(scam: SCAM, x: torch.Tensor) -> torch.Tensor:
    """SCAM as published (with adaptive pools and 4-D matmuls), for comparison."""
    n, c, h, w = x.shape
    avg = nn.AdaptiveAvgPool2d(1)(x).softmax(1).view(n, 1, 1, c)
    mx = nn.AdaptiveMaxPool2d(1)(x).softmax(1).view(n, 1, 1, c)
    k = scam.key(x).view(n, 1, -1, 1).softmax(2)
    v = scam.value(x).view(n, 1, c, -1)
    y = torch.matmul(v, k).view(n, c, 1, 1)
    y_avg = torch.matmul(avg, v).view(n, 1, h, w)
    y_max = torch.matmul(mx, v).view(n, 1, h, w)
    gate = scam.gate(torch.cat((y_avg, y_max), 1)).sigmoid()
    return x + scam.context_proj(y) * gate


def test_scam_matches_published_formula_without_adaptive_pools():
    torch.manual_seed(0)
    scam = SCAM(12, init="published")  # a zero context conv would make the branch, and the check, vanish
    randomise_bn(scam)
    scam.eval()
    x = torch.randn(2, 12, 5, 7)
    with torch.no_grad():
        torch.testing.assert_close(scam(x), reference_scam(scam, x))
    assert not any(isinstance(m, (nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d)) for m in scam.modules())
    proj = scam.context_proj[0]
    assert proj.bias is None and isinstance(scam.context_proj[1], nn.SiLU)
    assert n_params(scam) == (12 + 2) + (12 * 12 + 24) + 12 * 12 + (2 + 2)


def test_scam_backward_is_deterministic_and_finite():
    torch.manual_seed(0)
    scam = SCAM(8, init="published")
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    grads = []
    for _ in range(2):
        x.grad = None
        scam(x).square().sum().backward()
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1]) and torch.isfinite(grads[0]).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scam_cuda_backward_under_deterministic_algorithms():
    scam = SCAM(16).cuda()
    x = torch.randn(2, 16, 20, 20, device="cuda", requires_grad=True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        scam(x).sum().backward()
        with pytest.raises(RuntimeError):
            nn.AdaptiveMaxPool2d(1)(x).sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)


def test_c3_faster_blocks_and_parameters():
    c3f = C3_Faster(32, 32, n=2, shortcut=False)
    assert isinstance(c3f, C3) and all(isinstance(b, FasterBlock) for b in c3f.m) and len(c3f.m) == 2
    c_ = 16
    block = c3f.m[0]
    assert (block.partial_conv.in_channels, block.partial_conv.out_channels) == (c_ // 4, c_ // 4)
    assert block.partial_conv.bias is None and block.mlp[1].bias is None
    assert isinstance(block.mlp[0], Conv) and block.mlp[0].conv.out_channels == 2 * c_
    per_block = (c_ // 4) ** 2 * 9 + (c_ * 2 * c_ + 2 * 2 * c_) + 2 * c_ * c_
    c3_convs = 2 * (32 * c_ + 2 * c_) + (2 * c_ * 32 + 2 * 32)
    assert n_params(c3f) == c3_convs + 2 * per_block


def test_faster_block_partial_mixing_residual_and_drop_path():
    torch.manual_seed(0)
    block = FasterBlock(8)
    x = torch.randn(64, 8, 5, 5)
    with torch.no_grad():
        block.mlp[1].weight.zero_()
        assert torch.equal(block(x), x)  # residual only when the MLP outputs zero
        nn.init.normal_(block.mlp[1].weight)
        block.eval()
        out = block(x)
        assert torch.equal(out, block(x))
        # Only channels 0..1 are spatially mixed: a change in channel 5 at one pixel stays at that pixel.
        x2 = x.clone()
        x2[:, 5, 2, 2] += 1.0
        moved = (block(x2) - out).abs().sum(1)
        assert torch.all(moved[:, 2, 2] > 0)
        moved[:, 2, 2] = 0
        assert torch.count_nonzero(moved) == 0
        x3 = x.clone()
        x3[:, 0, 2, 2] += 1.0
        assert (block(x3) - out).abs().sum((0, 1))[1, 1] > 0
        block.train()
        dropped = (block(x) == x).flatten(1).all(1)
    assert 0 < dropped.sum() < 20  # DropPath 0.1 over 64 samples


def test_conv_autopad_keeps_size_for_tuple_and_dilated_kernels():
    x = torch.randn(1, 4, 11, 13)
    assert Conv(4, 6, (1, 3))(x).shape == (1, 6, 11, 13)
    assert Conv(4, 6, 3, d=5)(x).shape == (1, 6, 11, 13)
    assert Conv(4, 6, 3, 2)(x).shape == (1, 6, 6, 7)


# ------------------------------------------------ FFCA fast paths keep the module-by-module maths
def reference_fem(fem: FEM, x: torch.Tensor) -> torch.Tensor:
    """FEM as written before its four 1x1 input convs were merged: every Conv module by module."""
    branches = torch.cat((fem.branch_a(x), fem.branch_b(x), fem.branch_c(x)), 1)
    return torch.relu(fem.scale * fem.project(branches) + fem.shortcut(x))


def reference_c3_faster(c3f: C3_Faster, x: torch.Tensor) -> torch.Tensor:
    """C3_Faster as written before its cv1/cv2 were merged and DropPath joined the residual add."""
    y = c3f.cv1(x)
    for block in c3f.m:
        mixed, rest = y.split([block.c_partial, y.shape[1] - block.c_partial], 1)
        y = y + block.drop_path(block.mlp(torch.cat((block.partial_conv(mixed), rest), 1)))
    return c3f.cv3(torch.cat((y, c3f.cv2(x)), 1))


def forward_backward(fn, module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """Seeded forward + backward of ``fn(module, x)``: output, input and parameter gradients, buffers."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # DropPath draws the same masks in both runs
    out = fn(module, x)
    out.backward(grad)
    result = {"out": out.detach(), "x.grad": x.grad}
    result.update({f"{k}.grad": p.grad if p.grad is not None else torch.zeros_like(p)
                   for k, p in module.named_parameters()})
    result.update(dict(module.named_buffers()))
    return result


FAST_PATH_CASES = [
    (lambda: FEM(32, 24), reference_fem, (3, 32, 11, 9)),
    (lambda: SCAM(12, init="published"), reference_scam, (3, 12, 7, 10)),
    (lambda: C3_Faster(16, 24, n=2), reference_c3_faster, (8, 16, 6, 5)),
]


@pytest.mark.parametrize("make, reference, shape", FAST_PATH_CASES)
def test_ffca_fast_paths_equal_module_by_module_maths_in_float64(make, reference, shape):
    """Outputs, input and parameter gradients and updated BatchNorm statistics agree to float64
    rounding with the module-by-module formula, in training and in eval mode."""
    torch.manual_seed(0)
    module = make().double()
    randomise_bn(module)
    x = torch.randn(shape, dtype=torch.float64)
    for train in (True, False):
        fast, slow = deepcopy(module).train(train), deepcopy(module).train(train)
        with torch.no_grad():
            grad = torch.randn_like(deepcopy(module)(x))
        got = forward_backward(lambda m, t: m(t), fast, x, grad)
        want = forward_backward(reference, slow, x, grad)
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12, msg=name)
        if train:  # BatchNorm running statistics really moved
            assert not torch.equal(got["out"], fast.eval()(x).detach())


@pytest.mark.parametrize("make, reference, shape", FAST_PATH_CASES)
def test_ffca_fast_paths_equal_module_by_module_within_float32_rounding(make, reference, shape):
    torch.manual_seed(0)
    module = make()
    randomise_bn(module)
    x = torch.randn(shape)
    with torch.no_grad():
        grad = torch.randn_like(deepcopy(module)(x))
    got = forward_backward(lambda m, t: m(t), deepcopy(module), x, grad)
    want = forward_backward(reference, deepcopy(module), x, grad)
    for name in ("out", "x.grad"):
        scale = want[name].abs().max()
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6 * scale, msg=name)


def test_shared_input_convs_fall_back_module_by_module_when_not_mergeable():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5)
    plain = [Conv(8, 4, 1, act=nn.ReLU()), Conv(8, 6, 1)]
    cases = {
        "3x3 kernel": [Conv(8, 4, 1), Conv(8, 6, 3)],
        "fused BatchNorm": deepcopy(plain),
        "mixed train/eval": deepcopy(plain),
        "different eps": deepcopy(plain),
        "eval mode": deepcopy(plain),
    }
    for conv in cases["eval mode"]:
        conv.eval()
    for conv in cases["fused BatchNorm"]:
        conv.fuse()
    cases["mixed train/eval"][1].bn.eval()
    cases["different eps"][1].bn.eps = 1e-5
    for name, convs in cases.items():
        expected = [m(x) for m in deepcopy(convs)]
        assert not _shareable(convs), name
        for got, want in zip(shared_input_convs(convs, x), expected):
            assert torch.equal(got, want), name
    assert _shareable(plain)


def test_shared_input_convs_update_batchnorm_statistics_like_each_conv():
    torch.manual_seed(0)
    convs = [Conv(8, 4, 1, act=nn.ReLU()), Conv(8, 1, 1), Conv(8, 6, 1, act=False)]
    randomise_bn(nn.ModuleList(convs))
    separate = deepcopy(convs)
    x = torch.randn(4, 8, 6, 7, dtype=torch.float64)
    for m in convs + separate:
        m.double()
    outs = shared_input_convs(convs, x)
    for out, merged, alone in zip(outs, convs, separate):
        torch.testing.assert_close(out, alone(x), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(merged.bn.running_mean, alone.bn.running_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(merged.bn.running_var, alone.bn.running_var, rtol=1e-12, atol=1e-14)
        assert merged.bn.num_batches_tracked.item() == alone.bn.num_batches_tracked.item() == 1


def test_ffca_parameter_names_and_shapes_unchanged():
    """Checkpoints trained before the fast paths must still load: names and shapes are the originals."""
    fem = FEM(32, 24)
    convs = {"branch_a.0": (8, 32, 1, 1), "branch_a.1": (8, 8, 3, 3),
             "branch_b.0": (4, 32, 1, 1), "branch_b.1": (6, 4, 1, 3), "branch_b.2": (8, 6, 3, 1),
             "branch_b.3": (8, 8, 3, 3), "branch_c.0": (4, 32, 1, 1), "branch_c.1": (6, 4, 3, 1),
             "branch_c.2": (8, 6, 1, 3), "branch_c.3": (8, 8, 3, 3), "project": (24, 24, 1, 1),
             "shortcut": (24, 32, 1, 1)}
    expected = {}
    for name, shape in convs.items():
        expected[f"{name}.conv.weight"] = shape
        for stat in ("weight", "bias", "running_mean", "running_var"):
            expected[f"{name}.bn.{stat}"] = (shape[0],)
        expected[f"{name}.bn.num_batches_tracked"] = ()
    assert {k: tuple(v.shape) for k, v in fem.state_dict().items()} == expected
    scam = {k: tuple(v.shape) for k, v in SCAM(12).state_dict().items() if "bn." not in k}
    assert scam == {"key.conv.weight": (1, 12, 1, 1), "value.conv.weight": (12, 12, 1, 1),
                    "context_proj.0.weight": (12, 12, 1, 1), "gate.conv.weight": (1, 2, 1, 1)}
    c3f = {k for k in C3_Faster(16, 16, n=1).state_dict() if k.endswith("weight") and ".bn." not in k}
    assert c3f == {"cv1.conv.weight", "cv2.conv.weight", "cv3.conv.weight", "m.0.partial_conv.weight",
                   "m.0.mlp.0.conv.weight", "m.0.mlp.1.weight"}


def test_drop_path_residual_equals_shortcut_plus_drop_path():
    torch.manual_seed(0)
    drop = DropPath(0.3)
    shortcut, x = torch.randn(64, 3, 4, 4), torch.randn(64, 3, 4, 4)
    torch.manual_seed(5)
    want = shortcut + drop(x)
    torch.manual_seed(5)
    got = drop.residual(shortcut, x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * want.abs().max())
    dropped = torch.isclose(got, shortcut, rtol=0, atol=0).flatten(1).all(1)
    assert 5 < dropped.sum() < 40  # about 30% of 64 samples
    assert torch.equal(drop.eval().residual(shortcut, x), shortcut + x)


def ffca_module_steps(device: str) -> list[torch.Tensor]:
    """Output and input gradient of FEM, SCAM and C3_Faster (training mode) on ``device``."""
    torch.manual_seed(0)
    results = []
    cases = ((FEM(32, 32), (4, 32, 12, 12)), (SCAM(16), (4, 16, 10, 10)), (C3_Faster(16, 16), (4, 16, 8, 8)))
    for module, shape in cases:
        module = module.to(device).train()
        x = torch.randn(shape, device=device, requires_grad=True)
        module(x).square().sum().backward()
        results += [module(x).detach(), x.grad]
    return results


def test_ffca_fast_paths_repeat_bit_for_bit_on_cpu():
    first, second = ffca_module_steps("cpu"), ffca_module_steps("cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ffca_fast_paths_under_cuda_deterministic_algorithms():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = ffca_module_steps("cuda"), ffca_module_steps("cuda")
    finally:
        torch.use_deterministic_algorithms(previous)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
