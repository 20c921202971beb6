"""VEDAI's fold protocol: `convert.py vedai --folds N` and data/scripts/vedai_folds.py on a tiny fake VEDAI."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from utils.converters.cli import run as convert_main
from utils.dataset.data_config import check_dataset
from utils.dataset.image_io import collect_image_files, img2label_paths
from utils.errors import UserError

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
N_IMAGES = 12  # image 11 is in no fold file, so a fold-file conversion leaves it out


def _load_loop():
    spec = importlib.util.spec_from_file_location("vedai_folds", ROOT / "data" / "scripts" / "vedai_folds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vedai_folds = _load_loop()


def number(i: int) -> str:
    return f"{i:08d}"


def expected_val(k: int) -> set:
    """Fold k's test list in the fake fold files: two images, consecutive modulo 11."""
    return {number((k - 1) % 11), number(k % 11)}


def make_fake_vedai(root: Path, fold_files: bool = True) -> Path:
    """``N_IMAGES`` 64-px colour tiles with one or two cars each; fold K tests on two images and trains
    on the other listed ones; fold 3's train list also names one of its test images (VEDAI's rule: val)."""
    tiles, ann = root / "Vehicules512", root / "Annotations512"
    tiles.mkdir(parents=True)
    ann.mkdir()
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        cv2.imwrite(str(tiles / f"{number(i)}_co.png"), rng.integers(30, 255, (64, 64, 3), dtype=np.uint8))
        rows = [(8 + i, 10, 22 + i, 20), (30, 34, 46, 52)][:1 + i % 2]
        (ann / f"{number(i)}.txt").write_text("".join(
            f"{(x1 + x2) / 2} {(y1 + y2) / 2} 0 1 1 0 {x1} {x2} {x2} {x1} {y1} {y1} {y2} {y2}\n"
            for x1, y1, x2, y2 in rows))
    if fold_files:
        for k in range(1, 11):
            train = sorted({number(i) for i in range(11)} - expected_val(k)) + ([number(3)] if k == 3 else [])
            (ann / f"fold{k:02d}.txt").write_text("\n".join(n.lstrip("0") or "0" for n in train) + "\n")
            (ann / f"fold{k:02d}test.txt").write_text("\n".join(sorted(expected_val(k))) + "\n")
    return root


def listed(out: Path, k: int, split: str) -> set:
    """Image numbers of fold k's train or val list, resolved as the data loader resolves them."""
    files = collect_image_files(out / "folds" / f"fold{k:02d}" / f"{split}.txt")
    assert all(Path(f).is_file() for f in files) and all(Path(f).is_file() for f in img2label_paths(files))
    return {Path(f).stem for f in files}


def tree_bytes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fold_files_give_one_data_yaml_per_fold(tmp_path, log_lines):
    out = tmp_path / "out"
    convert_main(["vedai", "--src", str(make_fake_vedai(tmp_path / "src")), "--out", str(out), "--folds", "10"])
    assert sorted(p.stem for p in (out / "images" / "all").iterdir()) == [number(i) for i in range(11)]
    record = yaml.safe_load((out / "conversion.yaml").read_text())
    assert record["options"]["folds"] == 10 and "fold" not in record["options"]
    assert [f["data"] for f in record["folds"]] == [f"VEDAI-fold{k:02d}.yaml" for k in range(1, 11)]
    for k in range(1, 11):
        data = check_dataset(out / f"VEDAI-fold{k:02d}.yaml")
        assert data["nc"] == 8 and Path(data["val"]) == out / "folds" / f"fold{k:02d}" / "val.txt"
        train, val = listed(out, k, "train"), listed(out, k, "val")
        assert val == expected_val(k) and not train & val
        assert train == {number(i) for i in range(11)} - val
        assert record["folds"][k - 1]["train"] == 9 and record["folds"][k - 1]["val"] == 2
    assert sum("fold03.txt" in m and "also in fold03test.txt" in m for m in log_lines) == 1
    labels = (out / "labels" / "all" / f"{number(1)}.txt").read_text().split("\n")
    assert len([row for row in labels if row]) == 2  # image 1 has two cars


def test_hash_folds_put_each_image_in_exactly_one_val_list(tmp_path):
    src = make_fake_vedai(tmp_path / "src", fold_files=False)
    convert_main(["vedai", "--src", str(src), "--out", str(tmp_path / "a"), "--folds", "3"])
    convert_main(["vedai", "--src", str(src), "--out", str(tmp_path / "b"), "--folds", "3"])
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    everything = {number(i) for i in range(N_IMAGES)}
    vals = [listed(tmp_path / "a", k, "val") for k in (1, 2, 3)]
    assert sorted(n for val in vals for n in val) == sorted(everything)  # each image validates once
    for k, val in enumerate(vals, 1):
        assert val and listed(tmp_path / "a", k, "train") == everything - val


@pytest.mark.parametrize("args, message", [
    (["--folds", "1"], "--folds 1: give 2 or more folds"),
    (["--folds", "5"], "--folds 5: --src .* has VEDAI's 10 fold files; use --folds 10"),
    (["--folds", "10", "--fold", "2"], "--fold 2: does not apply with --folds 10"),
    (["--folds", "10", "--val-fraction", "0.2"], "--val-fraction 0.2: does not apply with --folds 10"),
    (["--fold", "11"], "--fold 11: VEDAI has folds 1-10"),
])
def test_bad_fold_options(tmp_path, args, message):
    src = make_fake_vedai(tmp_path / "src")
    with pytest.raises(UserError, match=message):
        convert_main(["vedai", "--src", str(src), "--out", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_convert_cli_bad_fold_count_is_one_error_line(tmp_path):
    src = make_fake_vedai(tmp_path / "src")
    proc = subprocess.run([sys.executable, str(ROOT / "data" / "scripts" / "convert.py"), "vedai", "--src", str(src),
                           "--out", str(tmp_path / "out"), "--folds", "0"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "ERROR: --folds 0: give 2 or more folds (VEDAI's own fold files make 10)\n"
    assert not (tmp_path / "out").exists()


def test_missing_fold_files_and_too_many_hash_folds_are_refused(tmp_path):
    src = make_fake_vedai(tmp_path / "src")
    (src / "Annotations512" / "fold04test.txt").unlink()
    with pytest.raises(UserError, match=r"fold files of folds \[4\].* are missing"):
        convert_main(["vedai", "--src", str(src), "--out", str(tmp_path / "out"), "--folds", "10"])
    bare = make_fake_vedai(tmp_path / "bare", fold_files=False)
    with pytest.raises(UserError, match="fold .* has no val images"):
        convert_main(["vedai", "--src", str(bare), "--out", str(tmp_path / "out"), "--folds", "13"])


def test_one_fold_conversion_is_unchanged_by_the_folds_option(tmp_path):
    convert_main(["vedai", "--src", str(make_fake_vedai(tmp_path / "src")), "--out", str(tmp_path / "out"),
                  "--fold", "2"])
    out = tmp_path / "out"
    assert {p.stem for p in (out / "images" / "val").iterdir()} == expected_val(2)
    assert yaml.safe_load((out / "conversion.yaml").read_text())["options"]["fold"] == 2


def test_summary_is_mean_and_sample_standard_deviation():
    lines = vedai_folds.summary_lines({2: (0.74, 0.46), 1: (0.70, 0.40), 3: (0.78, 0.43)})
    assert lines == ["fold 01: mAP50 0.7000, mAP50-95 0.4000", "fold 02: mAP50 0.7400, mAP50-95 0.4600",
                     "fold 03: mAP50 0.7800, mAP50-95 0.4300",
                     "3 folds: mAP50 0.7400 ± 0.0400, mAP50-95 0.4300 ± 0.0300 (mean ± sample standard deviation)"]
    assert vedai_folds.summary_lines({4: (0.5, 0.25)})[-1] == \
        "1 fold: mAP50 0.5000, mAP50-95 0.2500 (one fold: no spread)"


@pytest.fixture(scope="module")
def fold_data(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("vedai")
    convert_main(["vedai", "--src", str(make_fake_vedai(tmp / "src")), "--out", str(tmp / "out"), "--folds", "10"])
    return tmp / "out"


@pytest.mark.parametrize("args, message", [
    (["--fold", "11"], "ERROR: --fold 11: this conversion has folds 1-10"),
    (["--fold", "0", "3"], "ERROR: --fold 0: this conversion has folds 1-10"),
    (["--fold", "x"], "ERROR: argument --fold: invalid int value: 'x'; see vedai_folds.py --help"),
    (["--", "--data", "x.yaml"], "ERROR: --data after '--': set for each fold by vedai_folds.py"),
])
@pytest.mark.slow
def test_loop_bad_fold_numbers_exit_2_with_one_line(fold_data, tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(ROOT / "data" / "scripts" / "vedai_folds.py"), "--root", str(fold_data),
                           "--project", str(tmp_path / "runs"), *args], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "runs").exists()


def test_loop_refuses_a_one_split_conversion(tmp_path):
    convert_main(["vedai", "--src", str(make_fake_vedai(tmp_path / "src")), "--out", str(tmp_path / "one")])
    with pytest.raises(UserError, match="converted as one split, not as folds"):
        vedai_folds.run(["--root", str(tmp_path / "one")])


@pytest.mark.slow
def test_loop_trains_validates_and_summarises_folds(fold_data, tiny_cfg, tmp_path, capsys):
    project = tmp_path / "runs"
    train_args = ["--cfg", str(tiny_cfg), "--weights", "", "--imgsz", "64", "--batch-size", "4", "--epochs", "1",
                  "--workers", "0", "--device", "cpu", "--noplots"]
    metrics = vedai_folds.run(["--root", str(fold_data), "--project", str(project), "--fold", "4", "2", "--",
                               *train_args])
    assert sorted(metrics) == [2, 4] and sorted(p.name for p in project.glob("fold[0-9]*")) == ["fold02", "fold04"]
    for k in (2, 4):
        run_opt = yaml.safe_load((project / f"fold{k:02d}" / "opt.yaml").read_text())
        assert Path(run_opt["data"]) == fold_data / f"VEDAI-fold{k:02d}.yaml"
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == vedai_folds.summary_lines(metrics)[-1] and printed[-1].startswith("2 folds: mAP50 ")
    with open(project / "folds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["fold"]), float(r["mAP50"]), float(r["mAP50-95"])) for r in rows] == \
        [(k, round(m50, 6), round(m, 6)) for k, (m50, m) in sorted(metrics.items())]
    with pytest.raises(UserError, match="already exist"):
        vedai_folds.run(["--root", str(fold_data), "--project", str(project), "--fold", "2", "--", *train_args])
    assert vedai_folds.run(["--root", str(fold_data), "--project", str(project), "--fold", "2", "4",
                            "--val-only"]) == metrics
