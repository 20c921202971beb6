"""Converters (data/scripts/convert.py): native-format fixtures written here, good and malformed input."""

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from tests.support.converter_sources import make_visdrone, write_image
from utils.converters import dota, vedai, visdrone
from utils.converters import writer as writer_module
from utils.converters.cli import run as convert_main
from utils.dataset.data_config import check_dataset
from utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def convert(*args) -> None:
    convert_main([str(a) for a in args])


def labels(out: Path, split: str, stem: str) -> list:
    """Rows of one written label file as lists of floats (class first)."""
    text = (out / "labels" / split / f"{stem}.txt").read_text()
    return [[float(v) for v in line.split()] for line in text.splitlines()]


def tree_bytes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def yolo(cls, x1, y1, x2, y2, w, h) -> list:
    """Expected normalised row for a pixel box already inside the image."""
    return [cls, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h]


def assert_rows(actual, expected):
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected):
        assert a[0] == e[0]
        assert np.allclose(a[1:], e[1:], atol=2e-6), (a, e)


# ----------------------------------------------------------------------------- VisDrone
def test_visdrone_rows_follow_the_evaluation_rules(tmp_path, log_lines):
    out = tmp_path / "out"
    convert("visdrone", "--src", make_visdrone(tmp_path / "src"), "--out", out)
    assert_rows(labels(out, "train", "a"), [yolo(3, 10, 20, 18, 26, 64, 48), yolo(8, 60, 40, 64, 48, 64, 48)])
    assert labels(out, "train", "b") == []  # no annotation file: background image
    assert_rows(labels(out, "val", "c"), [yolo(0, 0, 0, 16, 16, 64, 48)])
    malformed = [m for m in log_lines if "a.txt:6" in m]
    assert len(malformed) == 1 and "row skipped" in malformed[0]
    record = yaml.safe_load((out / "conversion.yaml").read_text())
    assert record["images"] == {"train": 2, "val": 1} and record["boxes"] == {"train": 2, "val": 1}
    assert record["dropped"] == {"ignored region (category 0, never an object)": 1, "inside an ignored region": 1,
                                 "others (category 11, not evaluated)": 1, "malformed row": 1,
                                 "score 0 (ignored by the evaluation)": 1}
    data = check_dataset(out / "VisDrone.yaml")
    assert data["nc"] == 10 and data["names"][3] == "car" and Path(data["val"]) == out / "images" / "val"
    summary = [m for m in log_lines if m.startswith("VisDrone: 3 images")]
    assert summary and "3 boxes, 5 dropped" in summary[0] and "malformed row 1" in summary[0]


def test_visdrone_blackout_paints_only_ignored_regions(tmp_path):
    src = make_visdrone(tmp_path / "src")
    convert("visdrone", "--src", src, "--out", tmp_path / "plain")
    convert("visdrone", "--src", src, "--out", tmp_path / "black", "--blackout-ignored")
    original = cv2.imread(str(src / "VisDrone2019-DET-train" / "images" / "a.png"))
    plain = cv2.imread(str(tmp_path / "plain" / "images" / "train" / "a.png"))
    black = cv2.imread(str(tmp_path / "black" / "images" / "train" / "a.png"))
    assert np.array_equal(plain, original)
    assert not black[0:20, 40:60].any()  # the ignored region
    assert np.array_equal(black[20:, :], original[20:, :]) and np.array_equal(black[:, :40], original[:, :40])
    assert labels(tmp_path / "black", "train", "a") == labels(tmp_path / "plain", "train", "a")  # never objects
    # an image without ignored regions is copied byte for byte
    assert (tmp_path / "black" / "images" / "val" / "c.png").read_bytes() == \
        (src / "VisDrone2019-DET-val" / "images" / "c.png").read_bytes()


def test_conversion_is_repeatable_and_replaces_its_own_output(tmp_path):
    src = make_visdrone(tmp_path / "src", ext=".jpg")
    convert("visdrone", "--src", src, "--out", tmp_path / "one", "--blackout-ignored")
    convert("visdrone", "--src", src, "--out", tmp_path / "two", "--blackout-ignored")
    first = tree_bytes(tmp_path / "one")
    assert first == tree_bytes(tmp_path / "two") and len(first) == 8
    (tmp_path / "one" / "labels" / "train" / "a.txt").write_text("stale\n")
    convert("visdrone", "--src", src, "--out", tmp_path / "one", "--blackout-ignored")  # same folder again
    assert tree_bytes(tmp_path / "one") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "src", "two"]  # no temporary folders left


def test_interrupted_conversion_leaves_nothing_half_written(tmp_path, monkeypatch):
    src = make_visdrone(tmp_path / "src")
    out = tmp_path / "out"
    real_add, calls = writer_module.DatasetWriter.add, []

    def failing_add(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the conversion
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(writer_module.DatasetWriter, "add", failing_add)
    with pytest.raises(KeyboardInterrupt):
        convert("visdrone", "--src", src, "--out", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no out, no staging folder

    monkeypatch.setattr(writer_module.DatasetWriter, "add", real_add)
    convert("visdrone", "--src", src, "--out", out)
    before = tree_bytes(out)
    calls.clear()
    monkeypatch.setattr(writer_module.DatasetWriter, "add", failing_add)
    with pytest.raises(KeyboardInterrupt):
        convert("visdrone", "--src", src, "--out", out, "--blackout-ignored")
    assert tree_bytes(out) == before  # the earlier complete conversion is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_foreign_output_folder_and_bad_sources_are_refused(tmp_path):
    src = make_visdrone(tmp_path / "src")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not written by this converter"):
        convert("visdrone", "--src", src, "--out", mine)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(UserError, match="folder not found"):
        convert("visdrone", "--src", tmp_path / "missing", "--out", tmp_path / "o")
    with pytest.raises(UserError, match="no VisDrone folder"):
        convert("visdrone", "--src", mine, "--out", tmp_path / "o")
    with pytest.raises(UserError, match="--src"):
        convert("visdrone", "--out", tmp_path / "o")


# ----------------------------------------------------------------------------- COCO / AI-TOD
def make_coco(root: Path) -> Path:
    """Category ids 3, 7, 12; a crowd box; an image without annotations; malformed annotations."""
    write_image(root / "images" / "train" / "t1.png", 40, 30)
    write_image(root / "images" / "train" / "t2.png", 40, 30)
    write_image(root / "images" / "val" / "v1.png", 20, 20)
    cats = [{"id": 12, "name": "ship"}, {"id": 3, "name": "airplane"}, {"id": 7, "name": "vehicle"}]
    train = {"images": [{"id": 1, "file_name": "t1.png", "width": 40, "height": 30},
                        {"id": 2, "file_name": "t2.png", "width": 40, "height": 30}],
             "categories": cats,
             "annotations": [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [4, 6, 8, 4], "iscrowd": 0},
                             {"id": 2, "image_id": 1, "category_id": 12, "bbox": [0, 0, 10, 10], "iscrowd": 1},
                             {"id": 3, "image_id": 1, "category_id": 3, "bbox": [1, 2, "x", 4]},
                             {"id": 4, "image_id": 1, "category_id": 99, "bbox": [1, 2, 3, 4]},
                             {"id": 5, "image_id": 42, "category_id": 3, "bbox": [1, 2, 3, 4]}]}
    val = {"images": [{"id": 9, "file_name": "v1.png", "width": 20, "height": 20},
                      {"id": 10, "file_name": "gone.png", "width": 20, "height": 20}],
           "categories": cats,
           "annotations": [{"id": 1, "image_id": 9, "category_id": 12, "bbox": [2, 2, 4, 4]}]}
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "aitod_train_v1.json").write_text(json.dumps(train))
    (root / "annotations" / "aitod_val_v1.json").write_text(json.dumps(val))
    (root / "annotations" / "aitod_trainval_v1.json").write_text(json.dumps(train))  # skipped
    return root


def test_coco_maps_ids_drops_crowd_keeps_background(tmp_path, log_lines):
    out = tmp_path / "out"
    convert("aitod", "--src", make_coco(tmp_path / "src"), "--out", out)
    assert_rows(labels(out, "train", "t1"), [yolo(1, 4, 6, 12, 10, 40, 30)])  # ids 3, 7, 12 -> 0, 1, 2
    assert labels(out, "train", "t2") == []
    assert_rows(labels(out, "val", "v1"), [yolo(2, 2, 2, 6, 6, 20, 20)])
    data = check_dataset(out / "AI-TOD.yaml")
    assert data["names"] == ["airplane", "vehicle", "ship"] and data["max_det"] == 1500  # AI-TOD's maxDets
    mapping = yaml.safe_load((out / "category_map.yaml").read_text())["classes"]
    assert {i: m["category_id"] for i, m in mapping.items()} == {0: 3, 1: 7, 2: 12}
    record = yaml.safe_load((out / "conversion.yaml").read_text())
    assert record["dropped"] == {"crowd box (iscrowd=1)": 1, "malformed row": 3} and record["images_skipped"] == 1
    for where in ("aitod_train_v1.json:annotations[2]", "aitod_train_v1.json:annotations[3]",
                  "aitod_train_v1.json:annotations[4]", "aitod_val_v1.json:images[1]"):
        assert sum(where in m for m in log_lines) == 1, where
    assert not (out / "images" / "val" / "gone.png").exists()


def test_coco_keep_crowd_and_broken_json(tmp_path):
    src = make_coco(tmp_path / "src")
    convert("coco", "--src", src, "--out", tmp_path / "out", "--keep-crowd")
    assert_rows(labels(tmp_path / "out", "train", "t1"),
                [yolo(1, 4, 6, 12, 10, 40, 30), yolo(2, 0, 0, 10, 10, 40, 30)])
    assert "max_det" not in check_dataset(tmp_path / "out" / "COCO.yaml")  # plain COCO keeps the default
    (src / "annotations" / "aitod_val_v1.json").write_text("{not json")
    with pytest.raises(UserError, match="aitod_val_v1.json: not a readable JSON"):
        convert("coco", "--src", src, "--out", tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


# ----------------------------------------------------------------------------- DOTA
def make_dota(root: Path) -> Path:
    write_image(root / "train" / "images" / "P0001.png", 100, 80)
    write_image(root / "val" / "images" / "P0002.png", 50, 50)
    (root / "train" / "labelTxt").mkdir(parents=True)
    (root / "val" / "labelTxt").mkdir(parents=True)
    (root / "train" / "labelTxt" / "P0001.txt").write_text(
        "imagesource:GoogleEarth\ngsd:0.146\n"
        "10 10 30 14 28 24 8 20 small-vehicle 0\n"   # rotated quad -> hull x 8-30, y 10-24
        "50 50 60 50 60 60 50 60 ship 1\n"           # difficult
        "1 2 3 4 5 6 7 8 spaceship 0\n"              # unknown class (line 5)
        "1 2 3 4 plane\n"                            # too few fields (line 6)
        "90 70 110 70 110 90 90 90 plane 0\n")       # clipped at the image edge
    (root / "val" / "labelTxt" / "P0002.txt").write_text("0 0 10 0 10 10 0 10 harbor 0\n")
    return root


def test_dota_polygons_to_boxes_and_difficult_choice(tmp_path, log_lines):
    src = make_dota(tmp_path / "src")
    convert("dota", "--src", src, "--out", tmp_path / "keep")
    assert_rows(labels(tmp_path / "keep", "train", "P0001"),
                [yolo(4, 8, 10, 30, 24, 100, 80), yolo(6, 50, 50, 60, 60, 100, 80), yolo(0, 90, 70, 100, 80, 100, 80)])
    assert_rows(labels(tmp_path / "keep", "val", "P0002"), [yolo(12, 0, 0, 10, 10, 50, 50)])
    assert sum("P0001.txt:5" in m and "spaceship" in m for m in log_lines) == 1
    assert sum("P0001.txt:6" in m for m in log_lines) == 1
    convert("dota", "--src", src, "--out", tmp_path / "drop", "--drop-difficult")
    assert len(labels(tmp_path / "drop", "train", "P0001")) == 2
    record = yaml.safe_load((tmp_path / "drop" / "conversion.yaml").read_text())
    assert record["dropped"] == {"difficult (--drop-difficult)": 1, "malformed row": 2}
    assert len(check_dataset(tmp_path / "drop" / "DOTA.yaml")["names"]) == 15
    convert("dota", "--src", src, "--out", tmp_path / "v2", "--version", "2.0")
    assert len(check_dataset(tmp_path / "v2" / "DOTA.yaml")["names"]) == 18


# ----------------------------------------------------------------------------- VOC
def voc_xml(filename, width, height, objects) -> str:
    objs = "".join(f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{b[0]}</xmin>"
                   f"<ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>"
                   for n, d, b in objects)
    return (f"<annotation><filename>{filename}</filename><size><width>{width}</width><height>{height}</height>"
            f"<depth>3</depth></size>{objs}</annotation>")


def make_voc(root: Path) -> Path:
    write_image(root / "JPEGImages" / "000001.jpg", 60, 40)
    write_image(root / "JPEGImages" / "000002.jpg", 60, 40)
    write_image(root / "JPEGImages" / "000003.jpg", 60, 40)
    ann = root / "Annotations"
    ann.mkdir(parents=True)
    (ann / "000001.xml").write_text(voc_xml("000001.jpg", 60, 40, [("dog", 0, (1, 1, 10, 20)),
                                                                   ("cat", 1, (11, 5, 30, 25)),
                                                                   ("dog", 0, (5, 5, "x", 9))]))
    (ann / "000002.xml").write_text(voc_xml("000002.jpg", 60, 40, [("cat", 0, (50, 30, 70, 45))]))
    (ann / "000003.xml").write_text("<annotation><object>")  # broken XML
    (root / "ImageSets" / "Main").mkdir(parents=True)
    (root / "ImageSets" / "Main" / "train.txt").write_text("000001\n000003\n")
    (root / "ImageSets" / "Main" / "val.txt").write_text("000002\n")
    return root


def test_voc_xml_to_yolo(tmp_path, log_lines):
    src = make_voc(tmp_path / "src")
    convert("voc", "--src", src, "--out", tmp_path / "out")
    out = tmp_path / "out"
    assert check_dataset(out / "VOC.yaml")["names"] == ["cat", "dog"]  # sorted names found
    assert_rows(labels(out, "train", "000001"), [yolo(1, 0, 0, 10, 20, 60, 40), yolo(0, 10, 4, 30, 25, 60, 40)])
    assert_rows(labels(out, "val", "000002"), [yolo(0, 49, 29, 60, 40, 60, 40)])
    assert sum("000001.xml:object 3" in m for m in log_lines) == 1
    assert sum("000003.xml" in m and "not valid XML" in m and "image skipped" in m for m in log_lines) == 1
    assert not (out / "images" / "train" / "000003.jpg").exists()
    convert("voc", "--src", src, "--out", tmp_path / "dogs", "--names", "dog", "--drop-difficult")
    assert_rows(labels(tmp_path / "dogs", "train", "000001"), [yolo(0, 0, 0, 10, 20, 60, 40)])
    record = yaml.safe_load((tmp_path / "dogs" / "conversion.yaml").read_text())
    assert record["dropped"]["class not in --names"] == 2


def test_voc_without_imagesets_splits_by_name_hash(tmp_path):
    src = make_voc(tmp_path / "src")
    (src / "ImageSets" / "Main" / "train.txt").unlink()
    (src / "ImageSets" / "Main" / "val.txt").unlink()
    convert("voc", "--src", src, "--out", tmp_path / "out", "--val-fraction", "0.5")
    record = yaml.safe_load((tmp_path / "out" / "conversion.yaml").read_text())
    assert sum(record["images"].values()) == 2
    with pytest.raises(UserError, match="--val-fraction 1.5"):
        convert("voc", "--src", src, "--out", tmp_path / "bad", "--val-fraction", "1.5")


# ----------------------------------------------------------------------------- VEDAI
def vedai_row(code, x1, y1, x2, y2) -> str:
    """A VEDAI row for an axis-aligned rectangle (corners listed x1..x4 then y1..y4)."""
    return (f"{(x1 + x2) / 2} {(y1 + y2) / 2} 0.5 {code} 1 0 {x1} {x2} {x2} {x1} {y1} {y1} {y2} {y2}")


def make_vedai(root: Path, combined: bool) -> Path:
    tiles = root / "Vehicules512"
    for i in range(3):
        write_image(tiles / f"{i:08d}_co.png", 64, 64, seed=i)
        write_image(tiles / f"{i:08d}_ir.png", 64, 64, seed=10 + i)
    rows = {"00000000": [vedai_row(1, 10, 10, 20, 16), vedai_row(31, 30, 30, 50, 50), "1 2 3"],
            "00000001": [vedai_row(23, 0, 0, 8, 8)], "00000002": []}
    ann = root / "Annotations512"
    ann.mkdir(parents=True)
    if combined:
        (ann / "annotation512.txt").write_text("".join(f"{int(k)} {r}\n" for k, rs in rows.items() for r in rs))
    else:
        for k, rs in rows.items():
            (ann / f"{k}.txt").write_text("".join(f"{r}\n" for r in rs))
    (ann / "fold01.txt").write_text("00000000\n00000002\n")
    (ann / "fold01test.txt").write_text("00000001\n")
    return root


@pytest.mark.parametrize("combined", [False, True])
def test_vedai_rows_classes_and_folds(tmp_path, log_lines, combined):
    src = make_vedai(tmp_path / "src", combined)
    convert("vedai", "--src", src, "--out", tmp_path / "out")
    out = tmp_path / "out"
    assert check_dataset(out / "VEDAI.yaml")["names"] == ["car", "truck", "pickup", "tractor", "camping car",
                                                          "boat", "van", "other"]
    assert_rows(labels(out, "train", "00000000"), [yolo(0, 10, 10, 20, 16, 64, 64)])  # the plane is dropped
    assert_rows(labels(out, "val", "00000001"), [yolo(5, 0, 0, 8, 8, 64, 64)])
    assert labels(out, "train", "00000002") == []
    record = yaml.safe_load((out / "conversion.yaml").read_text())
    assert record["dropped"] == {"class code 31 not in --classes list": 1, "malformed row": 1}
    assert sum("row skipped" in m and "fields" in m for m in log_lines) == 1
    convert("vedai", "--src", src, "--out", tmp_path / "ir", "--modality", "ir", "--classes", "all")
    ir = cv2.imread(str(tmp_path / "ir" / "images" / "train" / "00000000.png"))
    assert np.array_equal(ir, cv2.imread(str(src / "Vehicules512" / "00000000_ir.png")))
    assert [r[0] for r in labels(tmp_path / "ir", "train", "00000000")] == [0, 10]  # plane is class 10 in 'all'


def test_vedai_bad_options(tmp_path):
    src = make_vedai(tmp_path / "src", combined=False)
    with pytest.raises(UserError, match="--fold 11"):
        convert("vedai", "--src", src, "--out", tmp_path / "o", "--fold", "11")
    with pytest.raises(UserError, match="Vehicules1024"):
        convert("vedai", "--src", src, "--out", tmp_path / "o", "--size", "1024")


# ----------------------------------------------------------------------------- command line
@pytest.mark.slow
def test_cli_prints_summary_and_one_error_line(tmp_path):
    src = make_dota(tmp_path / "src")
    script = ROOT / "data" / "scripts" / "convert.py"
    ok = subprocess.run([sys.executable, script, "dota", "--src", src, "--out", tmp_path / "out"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "DOTA: 2 images (train 1, val 1), 4 boxes, 2 dropped (malformed row 2)" in ok.stdout
    bad = subprocess.run([sys.executable, script, "dota", "--src", tmp_path / "nope", "--out", tmp_path / "o"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and bad.stderr.startswith("ERROR: --src")


# ----------------------------------------------------------------------------- shipped data YAMLs
@pytest.mark.parametrize("yaml_name, names", [
    ("VisDrone", visdrone.NAMES),
    ("DOTA", dota.NAMES["1.0"]),
    (("VEDAI", [vedai.CODES[c] for c in vedai.FFCA_CODES])),
    ("AI-TOD", ["airplane", "bridge", "storage-tank", "ship", "swimming-pool", "vehicle", "person", "wind-mill"]),
])
def test_shipped_yaml_names_match_the_converter(tmp_path, yaml_name, names):
    shipped = yaml.safe_load((ROOT / "data" / f"{yaml_name}.yaml").read_text())
    assert list(shipped["names"].values()) == names and shipped["train"] == "images/train"
    for split in ("train", "val", "test"):
        (tmp_path / "images" / split).mkdir(parents=True)
    shipped["path"] = str(tmp_path)  # the user's --out folder
    assert check_dataset({**shipped, "yaml_file": str(tmp_path / "x.yaml")})["nc"] == len(names)


def _orphan_visdrone(root):
    (make_visdrone(root) / "VisDrone2019-DET-train" / "annotations" / "z.txt").write_text(
        "10,20,8,6,1,4,0,0\n1,1,4,4,1,4,0,0\n")
    return root, "z.txt"


def _orphan_dota(root):
    (make_dota(root) / "train" / "labelTxt" / "P0009.txt").write_text(
        "0 0 10 0 10 10 0 10 harbor 0\n1 1 9 1 9 9 1 9 harbor 0\n")
    return root, "P0009.txt"


def _orphan_vedai(root):
    make_vedai(root, combined=False)
    (root / "Annotations512" / "00000009.txt").write_text(f"{vedai_row(1, 1, 1, 5, 5)}\n{vedai_row(1, 2, 2, 6, 6)}\n")
    return root, "00000009.txt"


@pytest.mark.parametrize("fmt, make", [("visdrone", _orphan_visdrone), ("dota", _orphan_dota),
                                       ("vedai", _orphan_vedai)])
def test_annotations_without_an_image_are_counted_and_named(tmp_path, log_lines, fmt, make):
    src, orphan = make(tmp_path / "src")
    convert(fmt, "--src", src, "--out", tmp_path / "out")
    record = yaml.safe_load((tmp_path / "out" / "conversion.yaml").read_text())
    assert record["dropped"]["image missing"] == 2
    assert sum(orphan in m and "no image" in m for m in log_lines) == 1


def test_vedai_names_the_row_of_an_unlisted_class_code(tmp_path, log_lines):
    convert("vedai", "--src", make_vedai(tmp_path / "src", combined=False), "--out", tmp_path / "out")
    assert sum("00000000.txt:2" in m and "class code 31" in m for m in log_lines) == 1


def test_coco_malformed_entries_are_named_counted_and_skipped(tmp_path, log_lines):
    """Null box values, list-valued ids and an image entry that is a string: warnings, not a traceback."""
    src = make_coco(tmp_path / "src")
    train_json = src / "annotations" / "aitod_train_v1.json"
    train = json.loads(train_json.read_text())
    train["images"].append("t3.png")
    train["annotations"] = [train["annotations"][0],
                            {"id": 6, "image_id": 1, "category_id": 7, "bbox": [None, 1, 2, 3]},
                            {"id": 7, "image_id": [1], "category_id": 7, "bbox": [1, 1, 2, 3]},
                            {"id": 8, "image_id": 1, "category_id": [3], "bbox": [1, 1, 2, 3]}]
    train_json.write_text(json.dumps(train))
    out = tmp_path / "out"
    convert("coco", "--src", src, "--out", out)
    assert_rows(labels(out, "train", "t1"), [yolo(1, 4, 6, 12, 10, 40, 30)])
    record = yaml.safe_load((out / "conversion.yaml").read_text())
    assert record["dropped"] == {"malformed row": 3} and record["images_skipped"] == 2  # t3.png, gone.png
    for where in ("annotations[1]: None is not a number", "annotations[2]: image_id", "annotations[3]: category_id",
                  "aitod_train_v1.json:images[2]: entry 't3.png'"):
        assert sum(where in m for m in log_lines) == 1, (where, log_lines)
