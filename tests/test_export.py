"""export.py: ONNX, TorchScript and OpenVINO models: metadata, checks, use in val.py and detect.py."""

import csv
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import openvino
import pytest
import torch

import detect
import export
import val
from models.backends import (OPENVINO_METADATA, OnnxBackend, OpenVinoBackend, PyTorchBackend, TorchScriptBackend,
                             load_backend)
from models.experimental import attempt_load
from models.yolo import Model
from tests.support.checkpoints import NAMES, write_tiny_checkpoint
from utils.dataloaders import create_dataloader
from utils.dataset.data_config import check_dataset
from utils.training.checkpoints import save_checkpoint
from utils.errors import UserError

@pytest.fixture(scope="module")
def tiny_pt(tmp_path_factory, tiny_cfg):
    return write_tiny_checkpoint(tiny_cfg, tmp_path_factory.mktemp("weights") / "tiny.pt")


@pytest.fixture(scope="module")
def dynamic_exports(tiny_pt):
    return export.run(tiny_pt, imgsz=[64], include=["onnx", "torchscript", "openvino"], dynamic=True)


def openvino_rt_metadata(xml):
    """{key: value} of the project's metadata section in an OpenVINO model's runtime info."""
    model = openvino.Core().read_model(str(xml))
    return {key: json.loads(model.get_rt_info([OPENVINO_METADATA, key]).astype(str)) for key in export.METADATA_KEYS}


@pytest.mark.slow
def test_export_writes_checked_files_with_metadata(dynamic_exports, tiny_pt):
    onnx_path, ts_path, ov_path = dynamic_exports
    assert onnx_path.suffix == ".onnx" and ts_path.suffix == ".torchscript"
    meta = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    assert meta["names"] == '["circle", "square", "triangle", "cross"]' and meta["dynamic"] == "true"
    assert ov_path == tiny_pt.parent / "tiny_openvino_model" and ov_path.is_dir()
    assert sorted(p.name for p in ov_path.iterdir()) == ["tiny.bin", "tiny.xml"]
    ov_meta = openvino_rt_metadata(ov_path / "tiny.xml")
    assert ov_meta["names"] == NAMES and ov_meta["dynamic"] is True and ov_meta["imgsz"] == [64, 64]
    model = attempt_load(tiny_pt)
    x = torch.rand(2, 3, 96, 64)  # another batch size and shape than the export's (1, 3, 64, 64)
    ref = model(x)[0]
    for path, cls in ((onnx_path, OnnxBackend), (ts_path, TorchScriptBackend), (ov_path, OpenVinoBackend),
                      (ov_path / "tiny.xml", OpenVinoBackend)):
        backend = load_backend(path)
        assert isinstance(backend, cls)
        assert backend.names == NAMES and backend.stride.tolist() == model.stride.tolist()
        out, raw = backend(x)
        assert raw is None and out.shape == ref.shape
        assert (out - ref).abs().max() < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_static_export_pads_smaller_inputs_and_rejects_larger(tiny_pt, tmp_path, fmt):
    pt = tmp_path / "static.pt"
    pt.write_bytes(tiny_pt.read_bytes())
    (path,) = export.run(pt, imgsz=[64], include=[fmt], batch_size=2)
    backend = load_backend(path)
    assert backend.fixed_shape == (2, 64, 64)
    x = torch.rand(3, 3, 64, 64)  # 3 images through a batch-2 graph: chunked and padded
    assert (backend(x)[0] - attempt_load(pt)(x)[0]).abs().max() < 1e-3
    small = torch.rand(1, 3, 48, 64)
    assert backend(small)[0].shape == (1, 1008, 9)
    with pytest.raises(UserError, match="larger than the 64x64"):
        backend(torch.rand(1, 3, 96, 64))


@pytest.mark.slow
@pytest.mark.parametrize("fmt, previous", [("onnx", "m.onnx"), ("openvino", "m_openvino_model/m.xml")])
def test_failed_check_keeps_the_previous_file(tiny_pt, tmp_path, monkeypatch, fmt, previous):
    pt = tmp_path / "m.pt"
    pt.write_bytes(tiny_pt.read_bytes())
    old = tmp_path / previous
    old.parent.mkdir(exist_ok=True)
    old.write_bytes(b"previous export")
    monkeypatch.setattr(export, "relative_difference", lambda ref, out: 0.5)
    with pytest.raises(export.ExportCheckError, match="differ from PyTorch by 0.5"):
        export.run(pt, imgsz=[64], include=[fmt])
    assert old.read_bytes() == b"previous export"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == sorted(
        {"m.pt", previous, str(Path(previous).parent)} - {"."})  # nothing added, nothing left behind


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason", [("full_disk", "No space left"), ("read_only", "Read-only")])
@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "openvino"])
def test_unwritable_output_folder_exits_2_with_one_line(request, tiny_pt, tmp_path, capsys, fault, reason, fmt):
    """Checkpoint in a folder that cannot be written to (read-only mount, full disk): one line, no traceback."""
    folder = tmp_path / "weights"
    folder.mkdir()
    weights = folder / "tiny.pt"
    weights.write_bytes(tiny_pt.read_bytes())
    request.getfixturevalue(fault)(folder)
    with pytest.raises(SystemExit) as e:
        export.cli(["--weights", str(weights), "--imgsz", "64", "--include", fmt])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR: ") and "\n" not in err, err
    assert str(folder) in err and reason in err and "could not be written" in err
    assert sorted(p.name for p in folder.iterdir()) == ["tiny.pt"]

def test_relative_difference_scales_boxes_not_scores():
    ref = torch.zeros(1, 2, 7)
    ref[..., :4] = 600.0
    out = ref.clone()
    out[0, 0, 0] += 0.06  # 1e-4 of the box scale
    assert export.relative_difference(ref, out) == pytest.approx(1e-4, rel=1e-3)
    out[0, 0, 5] += 0.01  # a score 0.01 off is 0.01 off
    assert export.relative_difference(ref, out) == pytest.approx(0.01, rel=1e-3)
    assert export.relative_difference(ref, out[:, :1]) == float("inf")


@pytest.mark.parametrize("args, message", [
    (["--include", "tflite"], "--include ['tflite']: choose from"),
    (["--half"], "--half needs a CUDA --device"),
    (["--imgsz", "0"], "--imgsz [0]"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--include", "onnx", "openvino", "--half"], "--half: OpenVINO export is fp32 only"),
    (["--include", "onnx", "--opset", "99"], "--opset 99: the ONNX exporter supports opsets 7 to 20"),
    (["--include", "openvino", "--opset", "6"], "--opset 6: the ONNX exporter supports opsets 7 to 20"),
])
def test_bad_flags_exit_2_with_one_line(tiny_pt, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        export.cli(["--weights", str(tiny_pt), *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR: ") and message in err and "\n" not in err


def test_python_run_takes_an_int_size_and_one_format_name(tiny_pt, tmp_path):
    pt = tmp_path / "tiny.pt"
    pt.write_bytes(tiny_pt.read_bytes())
    (path,) = export.run(pt, imgsz=64, include="torchscript")
    assert path.name == "tiny.torchscript" and load_backend(path).fixed_shape[1:] == (64, 64)
    for bad in ("64", 0, (64, 64, 64)):
        with pytest.raises(UserError, match=r"^--imgsz .*(give one size|positive integer)"):
            export.run(pt, imgsz=bad, include="torchscript")
    with pytest.raises(UserError, match=r"^--batch-size 'x': must be a positive integer$"):
        export.run(pt, imgsz=64, include="torchscript", batch_size="x")
    with pytest.raises(UserError, match=r"^--opset '17': the ONNX exporter supports opsets"):
        export.run(pt, imgsz=64, include="onnx", opset="17")


def test_unknown_weights_format_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="unknown weights format"):
        load_backend(tmp_path / "model.tflite")
    with pytest.raises(UserError, match="file not found"):
        load_backend(tmp_path / "model.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(UserError, match="onnxruntime cannot load"):
        load_backend(bad)
    with pytest.raises(UserError, match="file not found"):
        load_backend(tmp_path / "model_openvino_model")


@pytest.mark.parametrize("entry", ["detect", "val", "export"])
def test_an_empty_weights_flag_is_one_line_naming_it(entry, capsys, shapes_data):
    import detect
    import val

    cli, rest = {"detect": (detect.cli, ["--source", str(shapes_data.parent)]),
                 "val": (val.cli, ["--data", str(shapes_data)]), "export": (export.cli, [])}[entry]
    with pytest.raises(SystemExit) as e:
        cli(["--weights", "", *rest])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR: --weights '': give ") and "\n" not in err, err


def one_line_user_error(fn, *args):
    """The message of the UserError that ``fn(*args)`` raises, checked to be a single line."""
    with pytest.raises(UserError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_openvino_folder_without_model_unreadable_or_without_metadata(dynamic_exports, tmp_path):
    folder = tmp_path / "empty_openvino_model"
    folder.mkdir()
    assert "expected one .xml OpenVINO model in this folder, found 0" in one_line_user_error(load_backend, folder)
    (folder / "empty.xml").write_text("<net><layers>")
    assert "OpenVINO cannot read this model" in one_line_user_error(load_backend, folder)
    (folder / "other.xml").write_text("<net/>")
    assert "found 2" in one_line_user_error(load_backend, folder)
    plain = tmp_path / "plain_openvino_model"  # converted without export.py: no metadata in its runtime info
    plain.mkdir()
    export.openvino_save(dynamic_exports[0].read_bytes(), {}, plain, "plain")
    assert "exported model has no ['stride'" in one_line_user_error(load_backend, plain)


@pytest.mark.slow
def test_missing_openvino_package_is_one_line(dynamic_exports, tiny_pt, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    message = one_line_user_error(load_backend, dynamic_exports[2])
    assert "needs openvino; pip install openvino" in message
    with pytest.raises(SystemExit) as e:
        export.cli(["--weights", str(tiny_pt), "--include", "openvino"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == "ERROR: --include openvino needs openvino; pip install openvino"


@pytest.mark.slow
def test_openvino_on_a_cuda_device_warns_and_runs_on_cpu(dynamic_exports, tiny_pt, log_lines):
    backend = load_backend(dynamic_exports[2], device="cuda:0")
    x = torch.rand(1, 3, 64, 64)
    assert backend.device.type == "cpu" and (backend(x)[0] - attempt_load(tiny_pt)(x)[0]).abs().max() < 1e-3
    assert any("OpenVINO models run on the CPU here" in line for line in log_lines)


def saved_predictions(run_dir):
    """{label file name: (n, 6) array [cls, x, y, w, h, conf] sorted by conf} from val.py --save-txt --save-conf."""
    out = {}
    for f in sorted((run_dir / "labels").glob("*.txt")):
        rows = np.array([line.split() for line in f.read_text().splitlines()], dtype=float).reshape(-1, 6)
        out[f.name] = rows[np.argsort(-rows[:, 5], kind="stable")]
    return out


@pytest.mark.slow
def test_val_exported_models_and_pytorch_agree(dynamic_exports, tiny_pt, shapes_data, tmp_path):
    results, predictions = {}, {}
    for weights in (tiny_pt, *dynamic_exports):
        mp, mr, map50, map_, *_ = val.run(shapes_data, weights=str(weights), batch_size=2, imgsz=64,
                                          conf_thres=0.03, max_det=100, workers=0, plots=False, save_txt=True, save_conf=True,
                                          project=tmp_path, name=weights.name).metrics
        results[weights.name] = (mp, mr, map50, map_)
        predictions[weights.name] = saved_predictions(tmp_path / weights.name)
    assert sum(map(len, predictions["tiny.pt"].values())) > 50  # an untrained model's mAP is ~0, so the predictions are compared too
    for name in ("tiny.onnx", "tiny.torchscript", "tiny_openvino_model"):
        assert np.allclose(results[name], results["tiny.pt"], atol=0.001), name
        assert predictions[name].keys() == predictions["tiny.pt"].keys()
        for image, ref in predictions["tiny.pt"].items():
            assert predictions[name][image].shape == ref.shape, (name, image)
            assert np.abs(predictions[name][image][:, 5] - ref[:, 5]).max() < 1e-3, (name, image)


@pytest.fixture(scope="module")
def static_exports(tiny_pt, tmp_path_factory):
    """Static (fixed 64x64, batch 1) exports of tiny.pt, in their own folder beside a copy of it."""
    pt = tmp_path_factory.mktemp("static") / "tiny.pt"
    pt.write_bytes(tiny_pt.read_bytes())
    return dict(zip(("onnx", "torchscript", "openvino"),
                    export.run(pt, imgsz=[64], include=["onnx", "torchscript", "openvino"])))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "openvino"])
def test_val_runs_a_static_export_at_its_own_size_on_square_batches(static_exports, tiny_pt, shapes_data, tmp_path,
                                                                    fmt):
    """A static export at --imgsz 64 validates (square letterboxed batches, no rectangular padding) and scores
    what the .pt scores on the same square batches."""
    options = dict(batch_size=2, imgsz=64, conf_thres=0.03, max_det=100, workers=0, plots=False, save_txt=True,
                   save_conf=True, project=tmp_path)
    static = val.run(shapes_data, weights=str(static_exports[fmt]), name=fmt, **options).metrics[:4]
    data = check_dataset(shapes_data)
    square = create_dataloader(data["val"], 64, 2, 32, pad=0.0, rect=False, workers=0)[0]
    reference = val.run(shapes_data, weights=str(tiny_pt), dataloader=square, name="pt", **options).metrics[:4]
    assert np.allclose(static, reference, atol=0.001)
    predictions, ref = saved_predictions(tmp_path / fmt), saved_predictions(tmp_path / "pt")
    assert sum(map(len, ref.values())) > 50 and predictions.keys() == ref.keys()
    for image, rows in ref.items():
        assert predictions[image].shape == rows.shape and np.abs(predictions[image][:, 5] - rows[:, 5]).max() < 1e-3


@pytest.mark.slow
def test_val_refuses_an_imgsz_larger_than_a_static_export_before_making_a_folder(static_exports, shapes_data,
                                                                                 tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        val.cli(["--data", str(shapes_data), "--weights", str(static_exports["onnx"]), "--imgsz", "96",
                 "--workers", "0", "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("ERROR: ") and "\n" not in err, err
    assert "--imgsz 96" in err and "64x64" in err and "--dynamic" in err
    assert not (tmp_path / "runs").exists()


def read_csv_boxes(run_dir):
    with open(run_dir / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    return sorted((r["Image Name"], int(r["class"]), *(float(r[k]) for k in ("x1", "y1", "x2", "y2"))) for r in rows)


@pytest.mark.slow
def test_detect_exported_models_write_the_same_boxes(dynamic_exports, tiny_pt, shapes_data, tmp_path):
    source = shapes_data.parent / "shapes" / "images" / "val"
    runs = {}
    for weights in (tiny_pt, dynamic_exports[0], dynamic_exports[2]):
        run_dir = detect.run(str(weights), str(source), imgsz=64, conf_thres=0.1, iou_thres=1.0, max_det=1000, save_csv=True, nosave=True,
                             project=tmp_path, name=weights.name)
        runs[weights.name] = read_csv_boxes(run_dir)
    assert len(runs["tiny.pt"]) > 20
    # set-wise: an untrained head on flat backgrounds gives exactly tied boxes, so NMS is switched off
    # (--iou-thres 1) and the order of equal rows does not matter
    for name in ("tiny.onnx", "tiny_openvino_model"):
        assert len(runs[name]) == len(runs["tiny.pt"]), name
        for image, cls, *box in runs["tiny.pt"]:
            same = [b[2:] for b in runs[name] if b[:2] == (image, cls)]
            assert same and np.abs(np.subtract(same, box)).max(1).min() <= 1.0, (name, image)


def test_pytorch_backend_keeps_checkpoint_metadata(tiny_pt):
    backend = load_backend(tiny_pt)
    assert isinstance(backend, PyTorchBackend) and backend.names == NAMES and backend.fixed_shape is None
    with pytest.raises(UserError, match="only .pt checkpoints can form an ensemble"):
        load_backend([tiny_pt, tiny_pt.with_suffix(".onnx")])


@pytest.mark.slow
def test_authors_ffm_arithmetic_survives_export(tiny_cfg, tmp_path):
    """FFM rows with the 'authors' arithmetic (converted FFCA-YOLO checkpoints) export and compute the same."""
    from utils.files import yaml_load

    cfg = yaml_load(tiny_cfg)
    cfg["head"] = [[*row[:3], [1, "authors"]] if row[2].startswith("FFM") else row for row in cfg["head"]]
    torch.manual_seed(0)
    model = Model(cfg, nc=len(NAMES))
    with torch.no_grad():
        for layer in model.model:
            if hasattr(layer, "arithmetic"):
                layer.w.uniform_(0.2, 2.0)  # unequal weights: the .view(N, H, W, C) cycling shows
    pt = tmp_path / "authors.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": len(NAMES), "names": NAMES, "model": model.state_dict(),
                     "ema": None}, pt)
    onnx_path, ts_path = export.run(pt, imgsz=[64], include=["onnx", "torchscript"], dynamic=True)
    x = torch.rand(2, 3, 96, 64)
    ref = attempt_load(pt)(x)[0]
    assert {layer.arithmetic for layer in attempt_load(pt).model if hasattr(layer, "arithmetic")} == {"authors"}
    for path in (onnx_path, ts_path):
        assert (load_backend(path)(x)[0] - ref).abs().max() < 1e-3


@pytest.mark.slow
def test_a_static_export_takes_only_its_own_size_per_call(static_exports, shapes_data):
    """``Detector(best.onnx)(im, size=...)``: the export's 64x64 works, another size says to export --dynamic."""
    from models.detector import Detector

    image = sorted((shapes_data.parent / "shapes" / "images" / "val").glob("*.jpg"))[0]
    detector = Detector(static_exports["onnx"], conf=0.01)
    assert np.array_equal(detector(image, size=64).boxes, detector(image).boxes)
    with pytest.raises(UserError, match=r"^Detector: size=96: this exported model's input is fixed at \[64, 64\]; "
                                        r"export with --dynamic"):
        detector(image, size=96)
