"""train.py with the tiny-object options on: NWD's C recorded in the run, and resume still bit-exact."""

import pytest
import yaml

import train
from tests.conftest import ROOT
from tests.support.run_outputs import results_rows
from tests.support.training_runs import train_run
from utils.dataloaders import LoadImagesAndLabels
from utils.extra_hyps import mean_object_size
from utils.training.checkpoints import load_checkpoint

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


@pytest.fixture(scope="module")
def options_run(tmp_path_factory, shapes_data, tiny_cfg):
    """A 2-epoch run with NWD loss and assignment, copy_paste_small and min_box_px 1, checkpoint every epoch."""
    root = tmp_path_factory.mktemp("small_objects")
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    hyp.update(nwd=0.5, nwd_assign=1, copy_paste_small=0.5, min_box_px=1.0)
    (root / "hyp.yaml").write_text(yaml.safe_dump(hyp))
    return train_run(root, shapes_data, tiny_cfg, hyp=str(root / "hyp.yaml"), save_period=1, noplots=True), \
        shapes_data


@pytest.mark.slow
def test_nwd_constant_is_the_mean_object_size_and_is_recorded(options_run):
    run_dir, data = options_run
    recorded = yaml.safe_load((run_dir / "hyp.yaml").read_text())
    train_images = yaml.safe_load(data.read_text())
    dataset = LoadImagesAndLabels(f"{train_images['path']}/{train_images['train']}", img_size=64)
    expected = mean_object_size(dataset.labels, dataset.shapes, 64)
    assert recorded["nwd_c"] == pytest.approx(expected, abs=1e-4) and recorded["nwd_c"] > 0
    assert load_checkpoint(run_dir / "weights" / "last.pt")["hyp"]["nwd_c"] == recorded["nwd_c"]


@pytest.mark.slow
def test_resume_with_the_options_on_matches_the_uninterrupted_run(options_run, tmp_path):
    run_dir, _ = options_run
    copy = tmp_path / "copy"
    (copy / "weights").mkdir(parents=True)
    for f in ("hyp.yaml", "opt.yaml", "results.csv"):
        (copy / f).write_bytes((run_dir / f).read_bytes())
    (copy / "weights" / "last.pt").write_bytes((run_dir / "weights" / "epoch0.pt").read_bytes())
    train.run(resume=str(copy / "weights" / "last.pt"))
    expected = (run_dir / "weights" / "sha256.txt").read_text().split()[0]
    assert (copy / "weights" / "sha256.txt").read_text().split()[0] == expected
    assert results_rows(copy) == results_rows(run_dir)
