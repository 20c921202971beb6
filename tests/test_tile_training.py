"""train.py --train-tiles end to end: the determinism guarantees of ordinary training hold for tile training.

Mirrors tests/test_reproducibility.py and the resume test of tests/test_train.py on 64 px tiles of the
256 px shapes images (tiny model, CPU, 2 epochs of 4 batches).
"""

import subprocess
import sys
from pathlib import Path

import pytest

import train
from tests.support.launchers import kill_when, train_cmd
from tests.support.run_outputs import assert_identical, results_rows, weights_checksum
from utils.errors import UserError
from utils.files import yaml_load

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(imgsz=64, batch_size=4, epochs=2, device="cpu", noplots=True, exist_ok=True, save_interval=0,
                save_period=1, workers=0)


def tile_run(project: Path, name: str, data, cfg, **overrides) -> Path:
    train.run(**{**SETTINGS, "data": str(data), "cfg": str(cfg), "project": str(project), "name": name,
                 "train_tiles": 64, **overrides})
    return project / name


def data_with_tiles(shapes_data: Path, tmp_path: Path, tiles) -> Path:
    """A copy of the shapes data YAML with ``train_tiles: tiles``."""
    yaml_file = tmp_path / f"tiles{tiles}.yaml"
    yaml_file.write_text(Path(shapes_data).read_text() + f"train_tiles: {tiles}\n")
    return yaml_file


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shapes_data, tiny_cfg) -> Path:
    """The uninterrupted tile run: --train-tiles 64, seed 0, workers 0, epoch checkpoints kept."""
    return tile_run(tmp_path_factory.mktemp("tiles"), "reference", shapes_data, tiny_cfg)


@pytest.mark.slow
def test_tile_run_records_its_tiles_and_differs_from_whole_image_training(reference, shapes_data, tiny_cfg, tmp_path):
    assert yaml_load(reference / "opt.yaml")["train_tiles"] == 64
    whole = tile_run(tmp_path, "whole", shapes_data, tiny_cfg, train_tiles=None)
    assert weights_checksum(whole) != weights_checksum(reference)


@pytest.mark.slow
def test_worker_count_does_not_change_tile_training(reference, shapes_data, tiny_cfg, tmp_path):
    assert_identical(tile_run(tmp_path, "workers2", shapes_data, tiny_cfg, workers=2), reference)


@pytest.mark.slow
def test_data_yaml_key_trains_the_same_and_the_flag_wins(reference, shapes_data, tiny_cfg, tmp_path):
    """Two more runs of the reference's tile settings, each bit-identical to it: this is the rerun guarantee too."""
    from_yaml = tile_run(tmp_path, "yaml", data_with_tiles(shapes_data, tmp_path, 64), tiny_cfg, train_tiles=None)
    assert_identical(from_yaml, reference)
    overridden = tile_run(tmp_path, "flag", data_with_tiles(shapes_data, tmp_path, 128), tiny_cfg)
    assert_identical(overridden, reference)


@pytest.mark.slow
def test_tile_resume_from_epoch_checkpoint_matches_uninterrupted_run(reference, tmp_path):
    copy = tmp_path / "copy"
    (copy / "weights").mkdir(parents=True)
    for f in ("hyp.yaml", "opt.yaml", "results.csv"):
        (copy / f).write_bytes((reference / f).read_bytes())
    (copy / "weights" / "last.pt").write_bytes((reference / "weights" / "epoch0.pt").read_bytes())
    train.run(resume=str(copy / "weights" / "last.pt"))
    assert weights_checksum(copy) == weights_checksum(reference)
    assert results_rows(copy) == results_rows(reference)


@pytest.mark.slow
def test_tile_sigkill_mid_epoch_then_resume_is_bit_identical(reference, shapes_data, tiny_cfg, tmp_path):
    last_pt = tmp_path / "killed" / "weights" / "last.pt"
    cmd = train_cmd(shapes_data, tiny_cfg, tmp_path, "killed", "--train-tiles", "64", "--save-period", "1",
                    "--save-interval", "0.000001")
    position = kill_when(cmd, last_pt, lambda pos: pos[0] == 1 and pos[1] > 0)
    assert position is not None and position[0] == 1 and position[1] > 0, f"not killed mid-epoch: {position}"
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(last_pt)], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_identical(tmp_path / "killed", reference)


@pytest.mark.slow
def test_bad_tile_size_is_one_error_line_exit_2_and_no_run_folder(shapes_data, tiny_cfg, tmp_path):
    """One command line; the other bad values take the same path (tests/test_tiles.py checks their messages)."""
    proc = subprocess.run([sys.executable, "train.py", "--data", str(shapes_data), "--cfg", str(tiny_cfg),
                           "--device", "cpu", "--project", str(tmp_path), "--train-tiles", "100"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    message = "--train-tiles 100: must be a multiple of the model stride 32, e.g. 96 or 128"
    assert proc.stderr.strip().startswith("ERROR: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_tiles_with_rect_is_refused_before_the_run_folder_is_made(shapes_data, tiny_cfg, tmp_path):
    with pytest.raises(UserError, match="--train-tiles 64: cannot be combined with --rect"):
        tile_run(tmp_path, "rect", shapes_data, tiny_cfg, rect=True)
    assert not (tmp_path / "rect").exists()
