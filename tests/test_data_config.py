"""Data set YAML: schema, path resolution, clear errors, generation, the embedded shapes data set."""

import textwrap
from pathlib import Path

import numpy as np
import pytest

from utils.dataset import data_config
from utils.dataset.data_config import check_dataset
from utils.dataset.synthetic import shapes as gen
from utils.errors import UserError
from utils.extra_hyps import EXTRA_HYP
from utils.files import yaml_load

ROOT = Path(__file__).resolve().parents[1]


def make_root(root: Path):
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
    return root


def write_yaml(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_relative_path_resolves_beside_the_yaml_and_names_mapping(tmp_path, monkeypatch):
    make_root(tmp_path / "sets" / "toy")
    yaml_file = write_yaml(tmp_path / "sets" / "cfg" / "toy.yaml", """
        path: ../toy
        train: images/train
        val: [images/val, images/train]
        names: {0: car, 1: 'plane', 2: 7}
    """)
    monkeypatch.chdir(tmp_path)  # the YAML-relative location must win over the CWD
    data = check_dataset(yaml_file)
    root = (tmp_path / "sets" / "toy").resolve()
    assert data["path"] == str(root) and data["train"] == str(root / "images" / "train")
    assert data["val"] == [str(root / "images" / "val"), str(root / "images" / "train")]
    assert data["names"] == ["car", "plane", "7"] and data["nc"] == 3
    assert data["yaml_file"] == str(yaml_file.resolve()) and "test" not in data


def test_relative_path_falls_back_to_the_working_directory(tmp_path, monkeypatch):
    make_root(tmp_path / "work" / "datasets" / "toy")
    yaml_file = write_yaml(tmp_path / "cfg" / "toy.yaml", """
        path: datasets/toy
        train: images/train
        val: images/val
        test: images/val
        names: [a, b]
        nc: 2
    """)
    monkeypatch.chdir(tmp_path / "work")
    data = check_dataset(str(yaml_file))
    assert data["path"] == str((tmp_path / "work" / "datasets" / "toy").resolve())
    assert data["test"].endswith("images/val")


def test_relative_path_then_falls_back_to_the_repository_root_as_in_yolov5(tmp_path, monkeypatch):
    """An upstream YAML's ``path: ../datasets/coco128`` is the folder beside the repository, from any folder."""
    make_root(tmp_path / "datasets" / "toy")  # beside the repository
    (tmp_path / "repo").mkdir()
    (tmp_path / "work" / "sub").mkdir(parents=True)
    yaml_file = write_yaml(tmp_path / "yamls" / "cfg" / "toy.yaml", """
        path: ../datasets/toy
        train: images/train
        val: images/val
        names: [a]
    """)
    monkeypatch.setattr(data_config, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "work" / "sub")
    assert check_dataset(yaml_file)["path"] == str((tmp_path / "datasets" / "toy").resolve())
    make_root(tmp_path / "work" / "datasets" / "toy")  # the working directory comes before the repository
    assert check_dataset(yaml_file)["path"] == str((tmp_path / "work" / "datasets" / "toy").resolve())


def test_missing_path_key_means_the_yaml_folder_and_txt_splits_work(tmp_path):
    make_root(tmp_path)
    (tmp_path / "train.txt").write_text("images/train/a.jpg\n")
    yaml_file = write_yaml(tmp_path / "d.yaml", "train: train.txt\nval: images/val\nnames: [x]\n")
    data = check_dataset(yaml_file)
    assert data["train"] == str((tmp_path / "train.txt").resolve()) and data["nc"] == 1


ERRORS = [
    ("missing train", "val: images/val\nnames: [a]\n", "missing key 'train'"),
    ("missing val", "train: images/train\nnames: [a]\n", "missing key 'val'"),
    ("missing names", "train: images/train\nval: images/val\n", "missing key 'names'"),
    ("nc mismatch", "train: images/train\nval: images/val\nnames: [a, b]\nnc: 3\n", "nc=3 but 'names' has 2"),
    ("nc fraction", "train: images/train\nval: images/val\nnames: [a, b]\nnc: 2.5\n", "'nc' must be a whole number"),
    ("nc float", "train: images/train\nval: images/val\nnames: [a, b]\nnc: 2.0\n", "'nc' must be a whole number"),
    ("nc word", "train: images/train\nval: images/val\nnames: [a, b]\nnc: two\n", "got 'two'"),
    ("nc bool", "train: images/train\nval: images/val\nnames: [a]\nnc: true\n", "'nc' must be a whole number"),
    ("nc list", "train: images/train\nval: images/val\nnames: [a, b]\nnc: [2]\n", "'nc' must be a whole number"),
    ("nc string float", "train: images/train\nval: images/val\nnames: [a, b]\nnc: '2.0'\n", "got '2.0'"),
    ("nc string mismatch", "train: images/train\nval: images/val\nnames: [a, b]\nnc: '3'\n",
     "nc=3 but 'names' has 2"),
    ("nc 0 without names", "train: images/train\nval: images/val\nnc: 0\n", "missing key 'names'"),
    ("names gap", "train: images/train\nval: images/val\nnames: {0: a, 2: b}\n", "without gaps"),
    ("names type", "train: images/train\nval: images/val\nnames: 5\n", "'names' must be a non-empty list"),
    ("names keys", "train: images/train\nval: images/val\nnames: {a: x}\n", "keys must be integer"),
    ("no folder", "train: images/nope\nval: images/val\nnames: [a]\n", "'train' path"),
    ("bad split", "train: images/train\nval: 3\nnames: [a]\n", "'val' must be a folder"),
    ("not yaml", "train: [unclosed\n", "not valid YAML"),
    ("unknown generator", "train: images/x\nval: images/val\nnames: [a]\ngenerate: coco\n", "not a known generator"),
]


@pytest.mark.parametrize("name,text,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_yaml_is_one_clear_user_error(tmp_path, name, text, message):
    make_root(tmp_path)
    yaml_file = write_yaml(tmp_path / "bad.yaml", text)
    with pytest.raises(UserError) as err:
        check_dataset(yaml_file)
    assert message in str(err.value) and str(yaml_file.resolve()) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["'2'", '"2"', "' 2 '"])
def test_numeric_string_nc_is_read_as_a_number_with_a_note(tmp_path, log_lines, value):
    make_root(tmp_path)
    yaml_file = write_yaml(tmp_path / "d.yaml", f"train: images/train\nval: images/val\nnames: [a, b]\nnc: {value}\n")
    data = check_dataset(yaml_file)
    assert data["nc"] == 2 and type(data["nc"]) is int
    notes = [m for m in log_lines if "nc" in m]
    assert len(notes) == 1 and str(yaml_file.resolve()) in notes[0] and "read as the number 2" in notes[0]
    assert "\n" not in notes[0]


def test_nc_without_names_names_the_classes_as_yolov5_does(tmp_path, log_lines):
    make_root(tmp_path)
    yaml_file = write_yaml(tmp_path / "d.yaml", "train: images/train\nval: images/val\nnc: 3\n")
    data = check_dataset(yaml_file)
    assert data["names"] == ["class0", "class1", "class2"] and data["nc"] == 3
    assert [m for m in log_lines if "no 'names'" in m] == [
        f"{yaml_file.resolve()}: no 'names', so the 3 classes are named class0..class2"]


def test_integer_nc_gives_no_note(tmp_path, log_lines):
    make_root(tmp_path)
    yaml_file = write_yaml(tmp_path / "d.yaml", "train: images/train\nval: images/val\nnames: [a, b]\nnc: 2\n")
    assert check_dataset(yaml_file)["nc"] == 2
    assert not [m for m in log_lines if "nc" in m]


def test_missing_yaml_and_wrong_suffix_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        check_dataset(tmp_path / "absent.yaml")
    with pytest.raises(UserError, match="expected a data set .yaml"):
        check_dataset(tmp_path / "data.json")


def test_download_key_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    yaml_file = write_yaml(tmp_path / "dl.yaml", f"""
        path: missing_set
        train: images/train
        val: images/val
        names: [a]
        download: touch {marker}
    """)
    with pytest.raises(UserError, match="never run automatically: download the data set yourself"):
        check_dataset(yaml_file)
    assert not marker.exists()


def test_generate_key_runs_the_project_generator_once(tmp_path, monkeypatch):
    calls = []

    def make_shapes(root):
        calls.append(root)
        for split in ("train", "val"):
            Path(root, "images", split).mkdir(parents=True)

    monkeypatch.setitem(data_config.GENERATORS, "shapes", make_shapes)
    yaml_file = write_yaml(tmp_path / "cfg" / "gen.yaml", """
        path: ../generated
        train: images/train
        val: images/val
        names: [a]
        generate: shapes
    """)
    data = check_dataset(yaml_file)
    assert Path(data["train"]).is_dir() and data["path"] == str((tmp_path / "generated").resolve())
    check_dataset(yaml_file)  # already there: not generated again
    assert calls == [(tmp_path / "generated").resolve()]


def test_generation_refuses_a_non_empty_partial_folder(tmp_path):
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "keep.txt").write_text("user data")
    yaml_file = write_yaml(tmp_path / "g.yaml", "path: partial\ntrain: images/train\nval: images/val\n"
                                                "names: [a]\ngenerate: shapes\n")
    with pytest.raises(UserError, match="cannot generate the data set: .*not empty"):
        check_dataset(yaml_file)
    assert (tmp_path / "partial" / "keep.txt").read_text() == "user data"


def test_embedded_yaml_declares_generation_into_the_ignored_datasets_folder():
    raw = yaml_load(ROOT / "data" / "shapes.yaml")
    assert raw["generate"] == "shapes" and "download" not in raw
    assert (ROOT / "data" / raw["path"]).resolve() == (ROOT / "datasets" / "shapes").resolve()
    assert "datasets/" in (ROOT / ".gitignore").read_text().split()
    assert list(raw["names"].values()) == ["circle", "square", "triangle", "cross"]


# ---------------------------------------------------------------- the generator itself

def read_labels(root):
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.txt"))}


def test_make_shapes_is_deterministic_and_valid(tmp_path):
    a = gen.make_shapes(tmp_path / "a", n_train=8, n_val=3, seed=4)
    b = gen.make_shapes(tmp_path / "b", n_train=8, n_val=3, seed=4)
    c = gen.make_shapes(tmp_path / "c", n_train=8, n_val=3, seed=5)
    assert len(list((a / "images" / "train").glob("*.jpg"))) == 8
    assert len(list((a / "images" / "val").glob("*.jpg"))) == 3
    assert read_labels(a) == read_labels(b) and read_labels(a) != read_labels(c)
    assert (a / "images/train/000003.jpg").read_bytes() == (b / "images/train/000003.jpg").read_bytes()
    rows = np.concatenate([np.loadtxt(p, ndmin=2) for p in (a / "labels").rglob("*.txt")])
    assert set(rows[:, 0].astype(int)) <= {0, 1, 2, 3} and (rows[:, 1:] >= 0).all() and (rows[:, 1:] <= 1).all()
    sides = rows[:, 3:] * gen.IMG_SIZE
    assert sides.min() >= 6 and np.median(sides) < 32  # small objects
    with pytest.raises(FileExistsError):
        gen.make_shapes(a, n_train=1, n_val=1)


def test_make_shapes_objects_have_their_class_colour(tmp_path):
    import cv2

    root = gen.make_shapes(tmp_path / "s", n_train=6, n_val=1, seed=0)
    hues = {c: [] for c in range(4)}
    for lb in (root / "labels" / "train").glob("*.txt"):
        im = cv2.cvtColor(cv2.imread(str(root / "images" / "train" / f"{lb.stem}.jpg")), cv2.COLOR_BGR2HSV)
        for cls, x, y, w, h in np.loadtxt(lb, ndmin=2):
            cx, cy = int(x * gen.IMG_SIZE), int(y * gen.IMG_SIZE)
            hues[int(cls)].append(int(np.median(im[cy - 1:cy + 2, cx - 1:cx + 2, 0])))
    for cls, values in hues.items():
        if values:
            target = gen.CLASS_HUES[cls]
            assert all(min(abs(v - target), 180 - abs(v - target)) < 20 for v in values), (cls, values)


HYP_KEYS = ["lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box",
            "cls", "cls_pw", "obj", "obj_pw", "iou_t", "anchor_t", "fl_gamma", "hsv_h", "hsv_s", "hsv_v", "degrees",
            "translate", "scale", "shear", "perspective", "flipud", "fliplr", "mosaic", "mixup", "copy_paste"]
AUGMENTATION_KEYS = HYP_KEYS[HYP_KEYS.index("hsv_h"):]
PROJECT_KEYS = list(EXTRA_HYP)  # this project's additions follow YOLOv5's keys (utils/extra_hyps.py)


@pytest.mark.parametrize("name,expected", [
    ("low", dict(lrf=0.01, cls=0.5, obj=1.0, scale=0.5, mixup=0.0, copy_paste=0.0)),
    ("med", dict(lrf=0.1, cls=0.3, obj=0.7, scale=0.9, mixup=0.1, copy_paste=0.0)),
    ("high", dict(lrf=0.1, cls=0.3, obj=0.7, scale=0.9, mixup=0.1, copy_paste=0.1)),
])
def test_scratch_hyps_have_yolov5_keys_and_values(name, expected):
    hyp = yaml_load(ROOT / "data" / "hyps" / f"hyp.scratch-{name}.yaml")
    assert list(hyp) == HYP_KEYS + PROJECT_KEYS
    assert {k: hyp[k] for k in expected} == expected
    assert (hyp["lr0"], hyp["momentum"], hyp["mosaic"], hyp["fliplr"], hyp["hsv_s"]) == (0.01, 0.937, 1.0, 0.5, 0.7)


def test_no_augmentation_hyp_switches_every_augmentation_off():
    hyp = yaml_load(ROOT / "data" / "hyps" / "hyp.no-augmentation.yaml")
    assert list(hyp) == HYP_KEYS + PROJECT_KEYS
    assert all(hyp[k] == 0 for k in AUGMENTATION_KEYS) and hyp["copy_paste_small"] == 0 and hyp["lr0"] == 0.01


def test_the_python_api_finds_a_bare_data_yaml_name_as_the_command_line_does(tmp_path, monkeypatch):
    """``val.run(data="toy.yaml")``: the repository's data/toy.yaml, from any folder (no data set generated)."""
    import utils.options

    make_root(tmp_path / "repo" / "datasets" / "toy")
    yaml_file = write_yaml(tmp_path / "repo" / "data" / "toy.yaml", """
        path: ../datasets/toy
        train: images/train
        val: images/val
        names: [a]
    """)
    monkeypatch.setattr(utils.options, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    assert check_dataset("toy.yaml")["yaml_file"] == str(yaml_file.resolve())
    with pytest.raises(UserError, match=r"^--data other\.yaml: file not found; nothing is downloaded"):
        check_dataset("other.yaml")


@pytest.mark.parametrize("name", ["VisDrone.yaml", "AI-TOD.yaml", "VEDAI.yaml", "DOTA.yaml"])
def test_a_shipped_yaml_whose_data_is_missing_says_to_convert_it(name, tmp_path, monkeypatch):
    """The repository's data/*.yaml point at data sets the user converts; the error says so, not 'create the folder'."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data_config, "REPO_ROOT", tmp_path)  # no converted data beside a test repository
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / name).write_text((ROOT / "data" / name).read_text())
    with pytest.raises(UserError, match=r"does not exist \(root 'path' resolved to .*\); get and convert the data set "
                                        r"as the YAML's header says \(docs/datasets\.md\)"):
        check_dataset(tmp_path / "data" / name)
    other = write_yaml(tmp_path / "mine" / name, (ROOT / "data" / name).read_text())
    with pytest.raises(UserError, match=r"; fix the YAML or create the folder$"):
        check_dataset(other)


@pytest.mark.parametrize("value", [None, 123, ["data/shapes.yaml"]])
def test_a_data_value_that_is_no_path_is_one_line(value):
    """val.run(data=None) used to end in "expected str, bytes or os.PathLike object, not NoneType"."""
    with pytest.raises(UserError, match=r"^--data .*: expected a data set \.yaml file \(or its dict\), e\.g\. "
                                        r"data/shapes\.yaml$"):
        check_dataset(value)
