"""The very-tiny benchmark (issue 27): the generator's sizes and determinism, the runner's errors, a smoke run."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "data" / "scripts"))

from benchmarks.accuracy import very_tiny  # noqa: E402
from make_very_tiny import main as generator_main  # noqa: E402
from utils.dataset.synthetic.very_tiny import NAMES, make_very_tiny  # noqa: E402
from utils.files import yaml_load  # noqa: E402


def _labels(root: Path, split: str = "train") -> np.ndarray:
    """All label rows of one split, (n, 5)."""
    return np.concatenate([np.loadtxt(f, ndmin=2) for f in sorted((root / "labels" / split).glob("*.txt"))])


def test_boxes_are_2_to_12_px_mostly_very_tiny_and_in_range(tmp_path):
    yaml_file = make_very_tiny(tmp_path / "vt", n_train=3, n_val=1, seed=0, size=512)
    labels = _labels(tmp_path / "vt")
    side = np.sqrt(labels[:, 3] * labels[:, 4]) * 512
    assert len(labels) >= 3 * 30  # several dozen objects per image
    assert side.min() >= 2 and side.max() <= 12
    assert (side < 8).mean() >= 0.6  # most objects in AI-TOD's very-tiny band ...
    assert (side >= 8).sum() >= 10  # ... and some in the tiny band
    assert set(labels[:, 0].astype(int)) == set(range(len(NAMES)))
    x, y, w, h = labels[:, 1:].T
    assert (x - w / 2).min() > 0 and (x + w / 2).max() < 1 and (y - h / 2).min() > 0 and (y + h / 2).max() < 1
    assert f"names: [{', '.join(NAMES)}]" in yaml_file.read_text()
    assert len(list((tmp_path / "vt" / "images" / "val").glob("*.jpg"))) == 1


def test_same_seed_same_set_other_seed_other_set(tmp_path):
    for name, seed in (("a", 4), ("b", 4), ("c", 5)):
        make_very_tiny(tmp_path / name, n_train=2, n_val=1, seed=seed, size=128, objects=(6, 10))
    files = [Path("labels/train/000001.txt"), Path("labels/val/000000.txt"), Path("images/train/000001.jpg")]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert (tmp_path / "a" / files[0]).read_text() != (tmp_path / "c" / files[0]).read_text()


def test_generator_cli_errors_are_one_line(tmp_path, capsys):
    assert generator_main(["--root", str(tmp_path / "x"), "--img-size", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: --img-size 16")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert generator_main(["--root", str(tmp_path / "full"), "--n-train", "1", "--n-val", "1"]) == 2
    assert capsys.readouterr().err.startswith("ERROR:") and (tmp_path / "full" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("argv, names", [
    (["--set", "no_such_hyp=1"], "no_such_hyp"),
    (["--set", "lr0"], "--set lr0"),
    (["--set", "=1"], "--set =1"),
    (["--set", "lr0=fast"], "'fast'"),
    (["--set", "lr0=nan"], "--set lr0=nan"),
    (["--models", "yolov9"], "yolov9"),
    (["--epochs", "0"], "--epochs 0"),
    (["--img-size", "100"], "--img-size 100"),
    (["--hyp", "no/such/hyp.yaml"], "no/such/hyp.yaml"),
    (["--compare", "base", "nwd=0.5,lr0"], "--compare lr0: write KEY=VALUE"),
    (["--compare", "nwd=0.5", "nwd=0.50"], "nwd=0.5 given twice"),
    (["--compare", "base", "--set", "nwd=0.5"], "--set and --compare"),
])
def test_suite_argument_errors_are_one_error_line_and_exit_2(argv, names, capsys):
    with pytest.raises(SystemExit) as e:
        very_tiny.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("ERROR:") and names in err[0]


def test_set_overrides_are_typed_and_written_over_the_base_hyp(tmp_path):
    known = very_tiny.known_hyp_keys()
    assert {"lr0", "scale", "mosaic"} <= known
    overrides = very_tiny.parse_overrides(["warmup_epochs=1", "scale=0.25", "lr0=1e-3"], known)
    assert overrides == {"warmup_epochs": 1, "scale": 0.25, "lr0": 0.001}
    assert type(overrides["warmup_epochs"]) is int and type(overrides["scale"]) is float
    hyp = yaml_load(very_tiny.write_hyp(very_tiny.DEFAULT_HYP, overrides, tmp_path))
    base = yaml_load(very_tiny.DEFAULT_HYP)
    assert hyp == {**base, **overrides} and hyp["scale"] != base["scale"]
    assert very_tiny.run_label(overrides) == "warmup_epochs=1,scale=0.25,lr0=0.001"
    assert very_tiny.run_label({}) == "base"


@pytest.mark.slow
def test_one_epoch_smoke_on_a_64px_mini_suite(tmp_path, tiny_cfg):
    """The suite's own jobs, trained in this process with the test model: a table row per seed."""
    from benchmarks.accuracy.matrix import train_one

    opt, overrides = very_tiny.parse_opt(["--seeds", "0", "--epochs", "1", "--batch-size", "2", "--img-size", "64",
                                          "--n-train", "2", "--n-val", "1", "--set", "mosaic=0"])
    jobs = very_tiny.jobs_for(opt, overrides, tmp_path)
    assert len(jobs) == 1 and jobs[0]["size"] == 64 and yaml_load(jobs[0]["opt"]["hyp"])["mosaic"] == 0
    threads = torch.get_num_threads()
    try:
        row = train_one({**jobs[0], "cfg": str(tiny_cfg)})
    finally:
        torch.set_num_threads(threads)
    table = very_tiny.format_table([row]).splitlines()
    assert len(table) == 3 and table[2].startswith("| mosaic=0 | 0 | ffca-yolo-n |")
    assert row["bands"]["very_tiny"]["instances"] > 0 and 0 <= row["map"] <= row["map50"] <= 1
    assert row["s_per_epoch"] > 0 and not math.isnan(row["box0"])


def _row(seed, m, very_tiny_ap, tiny_ap, setting="scale=0.25"):
    bands = {"very_tiny": {"instances": 50, "map50": 0.5, "map": very_tiny_ap},
             "tiny": {"instances": 9, "map50": 0.6, "map": tiny_ap}}
    return {"kind": very_tiny.KIND_PREFIX + setting, "seed": seed, "model": "ffca-yolo-n", "map50": 0.4, "map": m, "bands": bands, "first": 3 + seed,
            "box0": 0.17, "box1": 0.12, "s_per_epoch": 9.5}


def test_table_shows_both_bands_and_the_summary_gives_the_seed_spread():
    rows = [_row(0, 0.10, 0.05, float("nan")), _row(1, 0.20, 0.07, 0.30)]
    table = very_tiny.format_table(rows).splitlines()
    assert "AP50 / AP50-95 <8 px (labels)" in table[0] and "8-16 px" in table[0] and "16-32" not in table[0]
    assert table[2] == ("| scale=0.25 | 0 | ffca-yolo-n | 0.400 | 0.1000 | 0.500 / 0.050 (50) | 0.600 / - (9) | 3 | "
                        "0.170 → 0.120 | 9.5 |")
    (summary,) = very_tiny.seed_summary(rows)
    assert summary.startswith("ffca-yolo-n, 2 seed(s)") and "mAP50-95 0.1500 (0.1000-0.2000)" in summary
    assert "AP50-95 <8 px 0.0600 (0.0500-0.0700)" in summary and not re.search(r"\dx\)", summary)  # no ratios for one setting


def test_compare_runs_every_setting_on_the_same_data_and_reports_ratios_to_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(very_tiny, "make_data", lambda size, seed, n_train, n_val, out: out / f"data-s{seed}.yaml")
    opt, settings = very_tiny.parse_opt(["--compare", "base", "nwd=0.5,nwd_assign=1", "--seeds", "0", "1"])
    assert settings == [{}, {"nwd": 0.5, "nwd_assign": 1}]
    jobs = very_tiny.jobs_for(opt, settings, tmp_path)
    assert [(j["kind"], j["seed"]) for j in jobs] == [("very-tiny-base", 0), ("very-tiny-base", 1),
                                                     ("very-tiny-nwd=0.5,nwd_assign=1", 0),
                                                     ("very-tiny-nwd=0.5,nwd_assign=1", 1)]
    assert jobs[0]["data"] == jobs[2]["data"] != jobs[1]["data"]
    assert yaml_load(jobs[2]["opt"]["hyp"])["nwd_assign"] == 1 and yaml_load(jobs[0]["opt"]["hyp"])["nwd_assign"] == 0
    rows = [_row(0, 0.10, 0.04, 0.20, "base"), _row(1, 0.10, 0.06, 0.20, "base"),
            _row(0, 0.12, 0.06, 0.10, "nwd=0.5"), _row(1, 0.12, 0.09, 0.10, "nwd=0.5")]
    table = very_tiny.format_table(rows).splitlines()
    assert table[2].startswith("| base | 0 |") and table[4].startswith("| nwd=0.5 | 0 |")
    base, nwd = very_tiny.seed_summary(rows)
    assert base.startswith("base, ffca-yolo-n, 2 seed(s)") and "<8 px 0.0500 (0.0400-0.0600, 1.00x)" in base
    assert nwd.startswith("nwd=0.5, ffca-yolo-n") and "<8 px 0.0750 (0.0600-0.0900, 1.50x)" in nwd
    assert "8-16 px 0.1000 (0.1000-0.1000, 0.50x)" in nwd


@pytest.mark.slow
def test_cli_reports_an_unknown_key_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "benchmarks.accuracy.very_tiny", "--set", "nwdd=0.5"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().startswith("ERROR: --set nwdd=0.5: unknown hyperparameter")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
