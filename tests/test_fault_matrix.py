"""Entry point x fault: every entry point under a full disk, a read-only output folder and a hostile pickle.

Each cell runs the entry point's command line in process with the fault injected by the shared fixtures of
tests/conftest.py (``full_disk``, ``read_only``, ``hostile_pickle``) and checks the promise of
docs/reliability.md: one ``ERROR:`` line naming the folder or file, exit code 2, nothing left half-written
(the faulted folder holds exactly what it held before), and no code from a pickle run.

| entry point          | full disk / read-only output        | hostile pickle as --weights / SRC |
|----------------------|-------------------------------------|-----------------------------------|
| train.py             | --project                           | --weights, --resume               |
| val.py               | --project                           | --weights                         |
| detect.py            | --project                           | --weights                         |
| export.py            | the checkpoint's folder             | --weights                         |
| convert_checkpoint   | DST's folder                        | SRC (payload in the model YAML)   |
| convert.py           | --out's folder                      | reads no pickle                   |
| slice_dataset.py     | --out's folder                      | reads no pickle                   |
| dataset_stats        | --plot's folder                     | reads no pickle                   |
| audit.py             | writes no file                      | reads no pickle (--cfg is YAML)   |

audit.py has no cell: it writes nothing and loads no checkpoint; its user errors are tested in tests/test_determinism.py.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import yaml

import convert_checkpoint
import detect
import export
import train
import val
from models.yolo import Model
from utils.converters.cli import main as convert_cli
from utils.dataset import dataset_stats
from utils.training.checkpoints import save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FAULTS = [("full_disk", "No space left"), ("read_only", "Read-only")]


def _script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_matrix", ROOT / "data" / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(folder: Path) -> dict:
    """{relative path: bytes} of every file and folder under ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _one_error_line(capsys, func, argv, progress=()) -> str:
    """Run ``func(argv)``: it must exit 2 after printing one ``ERROR:`` line on stderr (progress bars aside)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        func(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if line.strip() and not line.startswith(progress)]
    assert exit_info.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("ERROR:"), "\n".join(err)
    return err[0]


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory, tiny_cfg) -> Path:
    torch.manual_seed(0)
    model = Model(str(tiny_cfg), nc=4)
    path = tmp_path_factory.mktemp("weights") / "tiny.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": ["circle", "square", "triangle", "cross"],
                     "model": model.state_dict(), "ema": None}, path)
    return path


@pytest.fixture
def case(tmp_path, tiny_weights, tiny_cfg, shapes_data):
    """``case(entry)`` -> (command-line function, argv, folder the fault goes on, progress-bar prefixes)."""
    source = shapes_data.parent / "shapes" / "images" / "val"
    disk = tmp_path / "disk"
    disk.mkdir()

    def build(entry):
        if entry == "train.py":
            return (lambda argv: (setattr(sys, "argv", ["train.py", *argv]), train.cli()),
                    ["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64", "--epochs", "1",
                     "--device", "cpu", "--workers", "0", "--project", str(disk)], disk,
                    ("train: Scanning", "val: Scanning"))  # the scan shows while the session's labels have no cache
        if entry == "val.py":
            return val.cli, ["--weights", str(tiny_weights), "--data", str(shapes_data), "--imgsz", "64",
                             "--device", "cpu", "--workers", "0", "--project", str(disk)], disk, ("val: Scanning",)
        if entry == "detect.py":
            return detect.cli, ["--weights", str(tiny_weights), "--source", str(source), "--imgsz", "64",
                                "--device", "cpu", "--save-txt", "--project", str(disk)], disk, ()
        if entry == "export.py":
            weights = disk / "tiny.pt"
            weights.write_bytes(tiny_weights.read_bytes())
            return export.cli, ["--weights", str(weights), "--imgsz", "64", "--include", "onnx"], disk, ()
        if entry == "convert_checkpoint.py":
            src = tmp_path / "upstream.pt"
            torch.save({"model": Model(str(tiny_cfg), nc=4).half(), "ema": None}, src)
            return convert_checkpoint.main, [str(src), str(disk / "converted.pt")], disk, ()
        if entry == "convert.py":
            from tests.support.converter_sources import make_visdrone

            return convert_cli, ["visdrone", "--src", str(make_visdrone(tmp_path / "src")), "--out",
                                 str(disk / "VisDrone")], disk, ()
        if entry == "slice_dataset.py":
            return _script("slice_dataset").main, ["--data", str(shapes_data), "--size", "128", "--splits", "val",
                                                   "--out", str(disk / "tiles")], disk, ("Slicing",)
        if entry == "dataset_stats":
            return dataset_stats.main, ["--data", str(shapes_data), "--imgsz", "64", "--plot",
                                        str(disk / "plots" / "sizes.png")], disk, ()
        raise ValueError(entry)

    return build


WRITE_ENTRIES = ["train.py", "val.py", "detect.py", "export.py", "convert_checkpoint.py", "convert.py",
                 "slice_dataset.py", "dataset_stats"]


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason", FAULTS)
@pytest.mark.parametrize("entry", WRITE_ENTRIES)
def test_unwritable_output(request, case, capsys, entry, fault, reason):
    func, argv, folder, progress = case(entry)
    before = _tree(folder)
    request.getfixturevalue(fault)(folder)
    err = _one_error_line(capsys, func, argv, progress)
    assert str(folder) in err and (reason in err or "could not be written" in err), err
    assert _tree(folder) == before  # nothing half-written, no temporaries, no empty run folders


def _hostile_checkpoint(path, payload, tiny_cfg):
    """A torch.save file shaped like a checkpoint whose 'opt' unpickles by calling ``payload``'s reduce."""
    model = Model(str(tiny_cfg), nc=4)
    torch.save({"model_cfg": model.yaml, "nc": 4, "model": model.state_dict(), "ema": None, "opt": payload,
                "optimizer": payload}, path)
    return path


@pytest.mark.parametrize("entry", ["train.py --weights", "train.py --resume", "val.py", "detect.py", "export.py",
                                   "convert_checkpoint.py"])
@pytest.mark.slow
def test_hostile_pickle_never_runs(entry, hostile_pickle, tmp_path, tiny_cfg, shapes_data, capsys, monkeypatch):
    payload, marker = hostile_pickle
    evil = tmp_path / "evil.pt"
    if entry == "convert_checkpoint.py":  # its own unpickler reads pickled models: the payload sits in the YAML
        model = Model(str(tiny_cfg), nc=4)
        model.yaml = {**model.yaml, "extra": payload}
        torch.save({"model": model, "ema": None}, evil)
    else:
        _hostile_checkpoint(evil, payload, tiny_cfg)
    project = tmp_path / "runs"
    common = ["--imgsz", "64", "--device", "cpu", "--project", str(project)]
    if entry.startswith("train.py"):
        flags = ["--weights", str(evil), "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--epochs", "1",
                 *common] if entry.endswith("--weights") else ["--resume", str(evil)]
        monkeypatch.setattr(sys, "argv", ["train.py", *flags])
        func, argv = (lambda argv: train.cli()), None
    elif entry == "val.py":
        func, argv = val.cli, ["--weights", str(evil), "--data", str(shapes_data), "--workers", "0", *common]
    elif entry == "detect.py":
        func, argv = detect.cli, ["--weights", str(evil), "--source", str(shapes_data.parent / "shapes" / "images"
                                                                           / "val"), *common]
    elif entry == "export.py":
        func, argv = export.cli, ["--weights", str(evil), "--imgsz", "64", "--include", "onnx"]
    else:
        func, argv = convert_checkpoint.main, [str(evil), str(tmp_path / "out.pt")]
    err = _one_error_line(capsys, func, argv)
    assert str(evil) in err, err
    assert not marker.exists() and not project.exists() and not (tmp_path / "out.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.pt"]
    torch.load(evil, weights_only=False)  # the ordinary unpickler does run it: the test can fail
    assert marker.exists()


# ------------------------------------------------------------------ environment, tracker store, start-up order
# Entry point x {bad environment variable, failing tracker store, start-up error after the run folder's name was
# chosen}; out of memory at the first step of train.py, val.py, detect.py and AutoBatch is tests/test_out_of_memory.py,
# every benchmark command's bad flags tests/test_benchmark_flags.py.


def _train(argv):
    sys.argv = ["train.py", *argv]
    train.cli()


@pytest.mark.parametrize("variables, expected", [
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "FFCA_DDP_TIMEOUT_MIN": "-5"},
     "ERROR: FFCA_DDP_TIMEOUT_MIN='-5': expected a positive number of minutes"),
    ({"WORLD_SIZE": "two"}, "ERROR: WORLD_SIZE='two': expected an integer of at least 1"),
])
def test_train_with_a_bad_variable_is_one_line_and_no_run_folder(variables, expected, case, capsys, monkeypatch):
    func, argv, folder, _ = case("train.py")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", sys.argv)
    assert _one_error_line(capsys, _train, argv).startswith(expected)
    assert list(folder.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["val.py", "detect.py"])
def test_variables_an_entry_point_does_not_use_cannot_stop_it(entry, case, capsys, monkeypatch):
    """FFCA_DDP_TIMEOUT_MIN=abc used to stop every entry point at import; a bad PIN_MEMORY is one warning."""
    func, argv, folder, _ = case(entry)
    monkeypatch.setenv("FFCA_DDP_TIMEOUT_MIN", "abc")
    monkeypatch.setenv("PIN_MEMORY", "maybe")
    func(argv)
    assert "ERROR" not in capsys.readouterr().err and list(folder.iterdir())


def test_a_tracking_store_mlflow_cannot_open_stops_train_before_any_folder(case, capsys, monkeypatch):
    pytest.importorskip("mlflow")
    func, argv, folder, _ = case("train.py")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "ftp://host/store")
    monkeypatch.setattr(sys, "argv", sys.argv)
    line = _one_error_line(capsys, _train, [*argv, "--logger", "mlflow"])
    assert line.startswith("ERROR: MLFLOW_TRACKING_URI='ftp://host/store': expected a folder path or a URI")
    assert list(folder.iterdir()) == []


def test_a_start_up_error_after_the_folder_name_was_chosen_leaves_no_folder(case, capsys, monkeypatch, tmp_path):
    """An empty val list used to fail only after runs/.../exp held hyp.yaml, opt.yaml and environment.yaml."""
    func, argv, folder, _ = case("train.py")
    data = yaml.safe_load(Path(argv[argv.index("--data") + 1]).read_text())
    (tmp_path / "empty.txt").write_text("")
    broken = tmp_path / "empty_val.yaml"
    broken.write_text(yaml.safe_dump({**data, "val": str(tmp_path / "empty.txt")}))
    argv[argv.index("--data") + 1] = str(broken)
    monkeypatch.setattr(sys, "argv", sys.argv)
    line = _one_error_line(capsys, _train, argv, progress=("train: Scanning", "val: Scanning"))
    assert "val: " in line and "no images found" in line
    assert list(folder.iterdir()) == []  # so the next run is exp, not exp2
