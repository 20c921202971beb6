"""data/scripts/slice_dataset.py: box keeping/clipping, background ratio, resumable after an interrupt, bad input."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from utils.dataset.data_config import check_dataset
from utils.dataloaders import LoadImagesAndLabels
from utils.dataset.synthetic import shapes
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slicer = _load("slice_dataset", ROOT / "data" / "scripts" / "slice_dataset.py")


@pytest.fixture(scope="module")
def large_data(tmp_path_factory):
    """6 train + 2 val images of 160 px with 10-16 objects of 5-12 px: YAML path."""
    root = tmp_path_factory.mktemp("large")
    shapes.make_shapes(root / "shapes", n_train=6, n_val=2, seed=1, size=160, sides=(5, 12), objects=(10, 16))
    yaml_file = root / "data.yaml"
    yaml_file.write_text(f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
                         "names: [circle, square, triangle, cross]\n")
    return yaml_file


def _args(data, out, *extra):
    return slicer.parse_args(["--data", str(data), "--size", "64", "--overlap", "0.25", "--out", str(out), *extra])


def _snapshot(out):
    """{relative path: bytes} of every file under ``out``."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_tile_labels_keep_clip_or_drop_by_visibility():
    boxes = np.array([[0, 10, 10, 20, 20],  # fully inside
                      [1, 90, 10, 110, 20],  # half inside (x 90-110, tile ends at 100): dropped at 0.6
                      [2, 95, 30, 103, 40],  # 5/8 inside: kept, clipped to x 95-100
                      [3, 200, 200, 210, 210]], dtype=float)  # outside
    lb = slicer.tile_labels(boxes, (0, 0, 100, 100), 0.6)
    assert lb[:, 0].tolist() == [0, 2]
    assert np.allclose(lb[1, 1:], [0.975, 0.35, 0.05, 0.10])
    assert slicer.tile_labels(boxes, (0, 0, 100, 100), 0.5)[:, 0].tolist() == [0, 1, 2]


def test_sliced_data_set_is_complete_and_loads(large_data, tmp_path):
    yaml_file = slicer.slice_dataset(_args(large_data, tmp_path / "tiles"))
    data = check_dataset(yaml_file)
    train = LoadImagesAndLabels(data["train"], img_size=64, batch_size=4)
    assert len(train.im_files) > 6 and all(s.tolist() == [64, 64] for s in train.shapes)
    n_labels = sum(len(lb) for lb in train.labels)
    n_background = sum(len(lb) == 0 for lb in train.labels)
    assert n_labels > 6 * 10 * 0.8  # nearly every object (overlap duplicates some) survives
    assert n_background <= 0.1 * (len(train.labels) - n_background)
    for lb in train.labels:
        assert ((lb[:, 1:3] - lb[:, 3:5] / 2 >= -1e-6) & (lb[:, 1:3] + lb[:, 3:5] / 2 <= 1 + 1e-6)).all()
    assert (tmp_path / "tiles" / "images" / "val").is_dir()


def test_background_ratio_zero_and_seed(large_data, tmp_path):
    slicer.slice_dataset(_args(large_data, tmp_path / "a", "--background-ratio", "0", "--splits", "train"))
    labels = list((tmp_path / "a" / "labels" / "train").glob("*.txt"))
    assert labels and all(p.read_text().strip() for p in labels)
    data = check_dataset(tmp_path / "a" / "data.yaml")
    assert data["val"] == str(large_data.parent / "shapes" / "images" / "val")  # unsliced split kept as it was


def test_interrupted_run_resumes_to_identical_output(large_data, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    slicer.slice_dataset(_args(large_data, reference))
    out = tmp_path / "resumed"
    encode, calls = slicer._encode, []

    def interrupt_on_seventh(im, suffix):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return encode(im, suffix)

    monkeypatch.setattr(slicer, "_encode", interrupt_on_seventh)
    with pytest.raises(KeyboardInterrupt):
        slicer.slice_dataset(_args(large_data, out))
    partial = _snapshot(out)
    assert not any(".tmp" in name for name in partial) and "data.yaml" not in partial
    assert len([n for n in partial if n.startswith("images")]) == 6  # six whole tiles, nothing half-written
    monkeypatch.setattr(slicer, "_encode", encode)
    slicer.slice_dataset(_args(large_data, out))
    resumed, expected = _snapshot(out), _snapshot(reference)
    resumed["data.yaml"] = resumed["data.yaml"].replace(str(out).encode(), b"OUT")
    expected["data.yaml"] = expected["data.yaml"].replace(str(reference).encode(), b"OUT")
    assert resumed == expected


def test_rerun_after_a_kill_removes_the_killed_runs_temporaries(large_data, tmp_path, monkeypatch):
    """A SIGKILL mid-write leaves ``.NAME.XXXXXXXX.tmp`` files (atomic writes never renamed); the rerun deletes its
    own, finishes identical to an uninterrupted run, and leaves other files alone."""
    reference = tmp_path / "reference"
    slicer.slice_dataset(_args(large_data, reference))
    out = tmp_path / "killed"
    encode = slicer._encode
    monkeypatch.setattr(slicer, "_encode", lambda im, suffix: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        slicer.slice_dataset(_args(large_data, out))
    monkeypatch.setattr(slicer, "_encode", encode)
    stale = [out / "labels" / "train" / ".000001__0_0.txt.k1ll3d_x.tmp",
             out / "images" / "train" / ".000001__0_0.jpg.abcd1234.tmp",
             out / "labels" / "val" / ".000000__96_48.txt.zz9_zz9z.tmp",
             out / ".data.yaml.q1w2e3r4.tmp"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a tile")
    user_file = out / "images" / "train" / ".notes.tmp"  # not a name of the slicer's temporaries
    user_file.write_text("keep")
    slicer.slice_dataset(_args(large_data, out))
    assert not any(path.exists() for path in stale) and user_file.read_text() == "keep"
    user_file.unlink()
    resumed, expected = _snapshot(out), _snapshot(reference)
    resumed["data.yaml"] = resumed["data.yaml"].replace(str(out).encode(), b"OUT")
    expected["data.yaml"] = expected["data.yaml"].replace(str(reference).encode(), b"OUT")
    assert resumed == expected


def test_bad_input_is_one_line_user_error(large_data, tmp_path):
    slicer.slice_dataset(_args(large_data, tmp_path / "t"))
    with pytest.raises(UserError, match="different settings.*size"):
        slicer.slice_dataset(slicer.parse_args(["--data", str(large_data), "--size", "96", "--out",
                                                str(tmp_path / "t")]))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("user file")
    with pytest.raises(UserError, match="--out .*not a sliced data set"):
        slicer.slice_dataset(_args(large_data, tmp_path / "other"))
    assert (tmp_path / "other" / "keep.txt").read_text() == "user file"
    for flags in (["--overlap", "0.95"], ["--min-visibility", "0"], ["--background-ratio", "-1"]):
        with pytest.raises(UserError, match=flags[0]):
            slicer.parse_args(["--data", "d.yaml", "--out", "o", *flags])
    bad = large_data.parent / "shapes" / "labels" / "train" / "000000.txt"
    text = bad.read_text()
    try:
        bad.write_text("0 0.5 0.5 0.1\n")
        with pytest.raises(UserError, match="000000.txt:1"):
            slicer.slice_dataset(_args(large_data, tmp_path / "bad"))
    finally:
        bad.write_text(text)
