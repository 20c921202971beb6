"""``--modules FILE.py``: a user's registered blocks work in a model YAML, checkpoints name their files.

Each test writes its own block file to ``tmp_path`` (block names unique per test: the registry is the
process's). The end-to-end test trains one tiny epoch with a user block, then runs val.py and
detect.py on the checkpoint in fresh processes, with and without ``--modules``.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from models.experimental import load_one
from models.yolo import Model, resolve_module, unregistered_blocks
from utils.errors import UserError
from utils.training.checkpoints import load_checkpoint, save_checkpoint
from utils.user_modules import CHECKPOINT_KEY, load_user_modules, module_records

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "models" / "tiny.yaml"

BLOCK_SOURCE = '''
import torch
from torch import nn

from models.yolo import register_module


@register_module(name="{name}", style="same")
class UserGate(nn.Module):
    """A sigmoid gate from a 1x1 convolution: (b, c, h, w) -> (b, c, h, w)."""

    def __init__(self, c1):
        super().__init__()
        self.gate = nn.Conv2d(c1, c1, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.gate(x))
'''


def write_block(folder: Path, name: str, file: str = "blocks.py") -> Path:
    path = folder / file
    path.write_text(BLOCK_SOURCE.format(name=name))
    return path


def write_cfg(folder: Path, block: str) -> Path:
    """tests/models/tiny.yaml with the P2 head's SCAM (a 'same'-style block) replaced by ``block``."""
    cfg = yaml.safe_load(TINY.read_text())
    assert cfg["head"][13] == [14, 1, "SCAM", []]
    cfg["head"][13] = [14, 1, block, []]
    path = folder / "user-tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_module_file_registers_its_blocks_once_and_is_recorded(tmp_path):
    path = write_block(tmp_path, "UserGateOnce")
    assert resolve_module("UserGateOnce") is None
    records = load_user_modules([str(path)])
    assert resolve_module("UserGateOnce") is not None
    assert records == [{"file": "blocks.py", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}]
    assert load_user_modules([str(path)]) == records  # imported once: no 'already registered' on a second call
    assert module_records([str(path)]) == records and module_records([str(tmp_path / "other.py")]) == []
    model = Model(str(write_cfg(tmp_path, "UserGateOnce")))
    assert type(model.model[21]).__name__ == "UserGate"


def test_two_files_of_one_name_do_not_replace_each_other(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    load_user_modules([str(write_block(tmp_path / "a", "UserGateA")), str(write_block(tmp_path / "b", "UserGateB"))])
    assert resolve_module("UserGateA").cls is not resolve_module("UserGateB").cls


@pytest.mark.parametrize("source, expected", [
    ("import torch\n\nraise RuntimeError('no GPU here')\n", r"blocks_bad\.py: importing it failed at line 3 "
                                                            r"\(RuntimeError: no GPU here\)"),
    ("def broken(:\n", r"blocks_bad\.py: importing it failed at line 1 \(SyntaxError"),
    ("import not_a_package_anywhere\n", r"at line 1 \(ModuleNotFoundError: No module named 'not_a_package_anywhere'"),
])
def test_a_file_that_fails_to_import_is_one_line_naming_it(tmp_path, source, expected):
    path = tmp_path / "blocks_bad.py"
    path.write_text(source)
    with pytest.raises(UserError, match=expected) as caught:
        load_user_modules([str(path)])
    assert str(caught.value).startswith(f"--modules {path}:") and "\n" not in str(caught.value)


def test_a_missing_or_non_python_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--modules .*nowhere\.py: file not found"):
        load_user_modules([str(tmp_path / "nowhere.py")])
    (tmp_path / "blocks.txt").write_text("")
    with pytest.raises(UserError, match=r"blocks\.txt: not a \.py file"):
        load_user_modules([str(tmp_path / "blocks.txt")])


def test_a_checkpoint_with_unregistered_blocks_names_the_file_to_pass(tmp_path):
    model = Model(str(TINY))
    cfg = {**model.yaml, "head": [*model.yaml["head"][:13], [14, 1, "UserGateNeverLoaded", []],
                                  *model.yaml["head"][14:]]}
    assert unregistered_blocks(cfg) == ["UserGateNeverLoaded"]
    digest = "ab" * 32
    weights = tmp_path / "best.pt"
    save_checkpoint({"model_cfg": cfg, "nc": 2, "model": model.state_dict(),
                     CHECKPOINT_KEY: [{"file": "my_blocks.py", "sha256": digest}]}, weights)
    with pytest.raises(UserError, match=r"best\.pt: the model uses blocks that are not registered "
                                        r"\(UserGateNeverLoaded\); it was trained with my_blocks\.py SHA-256 "
                                        r"abababababab: pass --modules path/my_blocks\.py$"):
        load_one(weights)
    ckpt = load_checkpoint(weights)
    del ckpt[CHECKPOINT_KEY]  # a checkpoint from before the record: the flag, not a file name
    save_checkpoint(ckpt, weights)
    with pytest.raises(UserError, match=r"pass --modules FILE\.py with the file that registers them"):
        load_one(weights)


def test_a_block_file_that_changed_since_training_is_warned_about(tmp_path, log_lines):
    blocks = write_block(tmp_path, "UserGateChanged", file="changed_blocks.py")
    load_user_modules([str(blocks)])
    model = Model(str(write_cfg(tmp_path, "UserGateChanged")))
    weights = tmp_path / "best.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 2, "model": model.state_dict(),
                     CHECKPOINT_KEY: [{"file": "changed_blocks.py", "sha256": "0" * 64}]}, weights)
    load_one(weights)  # the blocks are registered and fit: it loads, with a warning
    assert any("changed_blocks.py: not the file the checkpoint was trained with" in line and "000000000000" in line
               for line in log_lines)
    log_lines.clear()
    ckpt = load_checkpoint(weights)
    ckpt[CHECKPOINT_KEY] = module_records([str(blocks)])
    save_checkpoint(ckpt, weights)
    load_one(weights)
    assert not any("not the file the checkpoint was trained with" in line for line in log_lines)


# ----------------------------------------------------------------------------- end to end


def cli(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_train_then_val_and_detect_with_and_without_modules(tmp_path, shapes_data):
    from tests.support.training_runs import train_run

    blocks = write_block(tmp_path, "UserGateEndToEnd", file="gate_blocks.py")
    run = train_run(tmp_path, shapes_data, write_cfg(tmp_path, "UserGateEndToEnd"), epochs=1, noplots=True,
                    modules=[str(blocks)])
    weights = run / "weights" / "last.pt"
    ckpt = torch.load(weights, weights_only=True)
    digest = hashlib.sha256(blocks.read_bytes()).hexdigest()
    assert ckpt[CHECKPOINT_KEY] == [{"file": "gate_blocks.py", "sha256": digest}]  # this run's files only
    images = Path(yaml.safe_load(shapes_data.read_text())["path"]) / "images" / "val"
    common = {"val.py": ("--data", shapes_data, "--imgsz", 64, "--batch-size", 4, "--workers", 0),
              "detect.py": ("--source", images, "--imgsz", 64, "--nosave")}
    for script, args in common.items():
        done = cli(script, "--weights", weights, "--device", "cpu", "--project", tmp_path / script, *args,
                   "--modules", blocks)
        assert done.returncode == 0, done.stderr[-2000:]
        refused = cli(script, "--weights", weights, "--device", "cpu", "--project", tmp_path / script, *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert lines[0].startswith("ERROR: ") and "UserGateEndToEnd" in lines[0]
        assert lines[0].endswith("pass --modules path/gate_blocks.py")


@pytest.mark.slow
def test_a_broken_modules_file_stops_train_py_with_one_line_and_exit_2(tmp_path, shapes_data):
    broken = tmp_path / "broken_blocks.py"
    broken.write_text("from models.yolo import register_module\n\nregister_module(42)\n")
    done = cli("train.py", "--data", shapes_data, "--cfg", TINY, "--project", tmp_path, "--epochs", 1,
               "--device", "cpu", "--modules", broken)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"ERROR: --modules {broken}: importing it failed at line 3 (")
    assert lines[0].endswith("fix the file or leave the flag out")
    assert not list(tmp_path.glob("exp*"))  # stopped before a run folder was made


def test_every_entry_script_takes_modules_repeatable():
    import audit
    import detect
    import export
    import train
    import val

    parsed = {"train": train.parse_opt(["--modules", "a.py", "--modules", "b.py"]),
              "val": val.build_parser().parse_args(["--weights", "w.pt", "--data", "d.yaml", "--modules", "a.py",
                                                    "--modules", "b.py"]),
              "export": export.parse_opt(["--weights", "w.pt", "--modules", "a.py", "--modules", "b.py"])}
    assert all(opt.modules == ["a.py", "b.py"] for opt in parsed.values())
    with pytest.raises(UserError, match="--source"):  # detect parses --modules, then wants its --source
        detect.parse_opt(["--weights", "w.pt", "--modules", "a.py"])
    assert audit.main(["--cfg", str(TINY), "--modules", "missing_blocks.py"]) == audit.EXIT_BAD_ARGUMENTS
    assert "modules" in train.RESUME_MAY_DIFFER


@pytest.mark.slow
def test_audit_py_audits_a_model_with_a_user_block(tmp_path, capsys):
    import audit

    blocks = write_block(tmp_path, "UserGateAudited")
    code = audit.main(["--cfg", str(write_cfg(tmp_path, "UserGateAudited")), "--imgsz", "64",
                       "--modules", str(blocks)])
    out = capsys.readouterr().out
    assert code == audit.EXIT_CLEAN, out
    assert "Result: clean" in out
