"""Entry points under faults and user errors: one ``ERROR:`` line and exit 2, no silent loss, nothing left behind.

Fault matrix (see docs/reliability.md); each row is a test below:

| entry point | full disk (ENOSPC)       | read-only (EROFS)        | user error                                  |
|-------------|--------------------------|--------------------------|---------------------------------------------|
| detect.py   | test_detect_write_faults | test_detect_write_faults | test_detect_missing_source_leaves_no_folder |
| train.py    | tests/test_faults.py     | tests/test_faults.py     | test_train_refuses_before_making_a_run_folder |
| export.py   | tests/test_export.py     | tests/test_export.py     | tests/test_export.py (--opset and other flags) |
| val.py      | tests/test_fault_matrix.py | tests/test_fault_matrix.py | test_val_on_an_empty_image_list_leaves_no_run_folder |
| slicer      | test_slicer_onto_an_unwritable_disk | test_slicer_onto_an_unwritable_disk | test_slicer_refuses_non_finite_or_out_of_range_values |
| convert.py  | test_convert_onto_an_unwritable_disk | test_convert_onto_an_unwritable_disk | tests/test_convert.py |

tests/test_fault_matrix.py runs every entry point through each fault as one table.
"""

import importlib.util
import sys

import cv2
import numpy as np
import pytest
import torch

import detect
import train
import val
from models.yolo import Model
from utils.training.checkpoints import save_checkpoint
from utils.errors import UserError
from utils.torch_utils import freeze_layers


@pytest.fixture(scope="module")
def tiny_model(tiny_cfg):
    torch.manual_seed(0)
    return Model(str(tiny_cfg), nc=4).eval()


def _images(folder, names):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in names:
        cv2.imwrite(str(folder / name), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    return folder


def _tiny_backend(cfg):
    """A stand-in for ``load_backend``: an untrained tiny model, so no checkpoint is needed."""
    return lambda *args, **kwargs: detect.PyTorchBackend(Model(str(cfg), nc=4).eval())


def _cli_error(capsys, func, argv, progress=None):
    """The one ``ERROR:`` line that ``func(argv)`` prints on stderr before exit 2 (progress bars whose lines start
    with ``progress`` aside)."""
    with pytest.raises(SystemExit) as exit_info:
        func(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not (progress and line.startswith(progress))]
    assert exit_info.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("ERROR:"), err
    return err[0]


def test_label_stems_are_unique_and_derived_from_the_file_name():
    stems = detect.label_stems(["x/a.jpg", "x/a.png", "x/b.jpg", "y/b.jpg", "x/c.jpg"])
    assert stems == {"x/a.jpg": "a.jpg", "x/a.png": "a.png", "x/b.jpg": "b.jpg", "y/b.jpg": "b.jpg_2", "x/c.jpg": "c"}


def test_detect_images_sharing_a_stem_get_their_own_label_files(tiny_model, tmp_path):
    source = _images(tmp_path / "src", ["a.jpg", "a.png", "b.jpg"])
    save_dir = detect.run(None, str(source), imgsz=(64,), model=tiny_model, save_txt=True, nosave=True,
                          conf_thres=0.0, max_det=3, project=tmp_path, name="run", batch_size=1)
    labels = sorted(p.name for p in (save_dir / "labels").iterdir())
    assert labels == ["a.jpg.txt", "a.png.txt", "b.txt"]
    assert all(len((save_dir / "labels" / n).read_text().splitlines()) == 3 for n in labels)


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason", [("full_disk", "No space left"), ("read_only", "Read-only")])
@pytest.mark.parametrize("outputs", [["--save-txt", "--nosave"], ["--visualize", "--nosave"], []])
@pytest.mark.parametrize("where", ["project", "run folder"])
def test_detect_write_faults(request, tiny_cfg, tmp_path, capsys, monkeypatch, fault, reason, outputs, where):
    """The fault hits creating the run folder, or (folder already there) writing labels or images."""
    source = _images(tmp_path / "src", ["a.jpg"])
    project = tmp_path / "runs"
    (project / "exp" / "labels").mkdir(parents=True)
    monkeypatch.setattr(detect, "load_backend", _tiny_backend(tiny_cfg))
    request.getfixturevalue(fault)(project if where == "project" else project / "exp")
    extra = ["--name", "new"] if where == "project" else ["--exist-ok"]
    err = _cli_error(capsys, detect.cli, ["--weights", "w.pt", "--source", str(source), "--imgsz", "64",
                                          "--device", "cpu", "--project", str(project), "--conf-thres", "0",
                                          *outputs, *extra])
    image_write = where == "run folder" and not outputs  # OpenCV only says that the write failed
    assert (("could not be written" if image_write else reason) in err) and str(project) in err


def test_detect_missing_source_leaves_no_folder(tmp_path, capsys, tiny_cfg, monkeypatch):
    monkeypatch.setattr(detect, "load_backend", _tiny_backend(tiny_cfg))
    err = _cli_error(capsys, detect.cli, ["--weights", "w.pt", "--source", str(tmp_path / "nope.jpg"),
                                          "--imgsz", "64", "--device", "cpu", "--project", str(tmp_path / "runs")])
    assert "nope.jpg" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flags, message", [
    (["--evolve", "1", "--resume", "last.pt"], "--resume last.pt does not apply to --evolve"),
    (["--hyp", "{no_lr0}"], "missing or non-numeric lr0"),
    (["--hyp", "{a_list}"], "expected a mapping"),
    (["--hyp", "{bad_nwd}"], "nwd=2.0 must be a number in [0.0, 1.0]"),
])
def test_train_refuses_before_making_a_run_folder(flags, message, tiny_cfg, shapes_data, tmp_path, capsys,
                                                  monkeypatch):
    no_lr0, a_list, bad_nwd = tmp_path / "no_lr0.yaml", tmp_path / "list.yaml", tmp_path / "bad_nwd.yaml"
    hyp = (train.ROOT / "data/hyps/hyp.scratch-low.yaml").read_text()
    no_lr0.write_text("\n".join(line for line in hyp.splitlines() if not line.startswith("lr0:")))
    a_list.write_text("- 1\n- 2\n")
    bad_nwd.write_text(hyp.replace("\nnwd: 0.0", "\nnwd: 2.0"))
    flags = [f.format(no_lr0=no_lr0, a_list=a_list, bad_nwd=bad_nwd) for f in flags]
    project = tmp_path / "runs"
    monkeypatch.setattr(sys, "argv", ["train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--project",
                                      str(project), "--device", "cpu", "--epochs", "1", "--imgsz", "64", *flags])
    assert message in _cli_error(capsys, lambda argv: train.cli(), None)
    assert not project.exists()


@pytest.mark.parametrize("damage", ["yaml", "weights"])
def test_resume_on_a_checkpoint_whose_yaml_does_not_fit_its_weights(damage, tiny_cfg, shapes_data, tmp_path, capsys,
                                                                   monkeypatch):
    """A resumable last.pt whose stored model YAML (or state) was edited: one ERROR line, exit 2, no new folder."""
    from utils.training.run_state import plain_opt

    model = Model(str(tiny_cfg), nc=4)
    cfg, state = dict(model.yaml), model.state_dict()
    if damage == "yaml":
        cfg["head"] = [[*row[:3], [12, *row[3][1:]]] if i == 0 else row for i, row in enumerate(cfg["head"])]
    else:
        state = {k: v for k, v in state.items() if not k.startswith("model.2.")}
    project = tmp_path / "runs"
    opt = train.parse_opt(["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64", "--device", "cpu",
                           "--epochs", "2", "--workers", "0", "--project", str(project)])
    last = project / "exp" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    hyp = train.load_hyp(opt)
    save_checkpoint({"opt": plain_opt(opt), "hyp": hyp, "model_cfg": cfg, "nc": 4, "model": state, "ema": state,
                     "optimizer": {"state": {}, "param_groups": []}, "next_position": [1, 0]}, last)
    before = last.read_bytes()
    monkeypatch.setattr(sys, "argv", ["train.py", "--resume", str(last)])
    err = _cli_error(capsys, lambda argv: train.cli(), None)
    assert f"--resume {last}" in err and "do not fit the stored model architecture" in err
    assert ("wrong shape" if damage == "yaml" else "missing") in err
    assert last.read_bytes() == before and sorted(p.name for p in project.rglob("*")) == ["exp", "last.pt", "weights"]


def test_freezing_every_layer_is_a_user_error(tiny_cfg):
    model = Model(str(tiny_cfg), nc=4)
    with pytest.raises(UserError, match=rf"--freeze 100: freezes every layer of this {len(model.model)}-layer model"):
        freeze_layers(model, [100])
    assert freeze_layers(model, [1]) == ["model.0."]
    assert any(p.requires_grad for p in model.parameters())


def _script(name):
    spec = importlib.util.spec_from_file_location(name, train.ROOT / "data" / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag, value", [("--background-ratio", "nan"), ("--background-ratio", "inf"),
                                         ("--background-ratio", "-0.5"), ("--overlap", "nan"),
                                         ("--min-visibility", "nan")])
def test_slicer_refuses_non_finite_or_out_of_range_values(flag, value, tmp_path, capsys):
    err = _cli_error(capsys, _script("slice_dataset").main,
                     ["--data", "d.yaml", "--out", str(tmp_path / "out"), flag, value])
    assert f"{flag} {value}" in err and "must be" in err
    assert not (tmp_path / "out").exists()


def test_val_on_an_empty_image_list_leaves_no_run_folder(tiny_cfg, tmp_path, capsys):
    model = Model(str(tiny_cfg), nc=4)
    weights = tmp_path / "tiny.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": ["a", "b", "c", "d"], "model": model.state_dict(),
                     "ema": None}, weights)
    (tmp_path / "empty.txt").write_text("")
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: empty.txt\nval: empty.txt\nnames: [a, b, c, d]\n")
    project = tmp_path / "runs"
    err = _cli_error(capsys, val.cli, ["--data", str(data), "--weights", str(weights), "--imgsz", "64",
                                       "--device", "cpu", "--workers", "0", "--project", str(project)])
    assert "empty.txt" in err
    assert not project.exists()


FAULTS = [("full_disk", "No space left"), ("read_only", "Read-only")]


def _tree(folder):
    """{relative path: bytes} of every file under ``folder`` ({} when it does not exist)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fault, reason", FAULTS)
@pytest.mark.parametrize("previous", [False, True])
def test_convert_onto_an_unwritable_disk(request, tmp_path, capsys, fault, reason, previous):
    """convert.py whose --out sits on a full or read-only disk: one line, exit 2, --out as it was (absent, or the
    previous conversion), no staging folder left."""
    from tests.support.converter_sources import make_visdrone
    from utils.converters.cli import main as convert_cli

    src, disk = make_visdrone(tmp_path / "src"), tmp_path / "disk"
    disk.mkdir()
    out = disk / "VisDrone"
    if previous:
        convert_cli(["visdrone", "--src", str(src), "--out", str(out)])
    before = _tree(out)
    request.getfixturevalue(fault)(disk)
    err = _cli_error(capsys, convert_cli, ["visdrone", "--src", str(src), "--out", str(out), "--blackout-ignored"])
    assert f"--out {out}" in err and reason in err and "unchanged" in err
    assert _tree(out) == before and [p.name for p in disk.iterdir()] == (["VisDrone"] if previous else [])


@pytest.mark.parametrize("fault, reason", FAULTS)
@pytest.mark.parametrize("previous", [False, True])
def test_slicer_onto_an_unwritable_disk(request, shapes_data, tmp_path, capsys, fault, reason, previous):
    """slice_dataset.py whose --out sits on a full or read-only disk: one line, exit 2; the tiles already there
    stay as they were (an interrupted run's complete tiles, resumable)."""
    slicer = _script("slice_dataset")
    out = tmp_path / "disk" / "tiles"
    argv = ["--data", str(shapes_data), "--size", "128", "--out", str(out), "--splits", "val"]
    if previous:
        slicer.main(argv)
        for tile in sorted((out / "images" / "val").iterdir())[::3]:  # a run that stopped before these tiles
            tile.unlink()
        (out / "data.yaml").unlink()
    else:
        out.parent.mkdir()
    before = _tree(out)
    request.getfixturevalue(fault)(out.parent)
    capsys.readouterr()
    err = _cli_error(capsys, slicer.main, argv, progress="Slicing val")
    assert f"--out {out}" in err and reason in err and "rerun" in err
    assert _tree(out) == before and [p.name for p in out.parent.iterdir()] == (["tiles"] if previous else [])
