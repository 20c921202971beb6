"""Data sets and loaders: per-file verdicts, label cache, image formats, determinism, sharding, sources."""

import hashlib
import os
import random
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from utils.dataset import image_cache, image_io, label_cache
from utils.augmentations import letterbox
from utils.dataloaders import LoadImagesAndLabels, create_dataloader
from utils.errors import UserError
from utils.dataset.image_io import apply_orientation, img2label_paths, read_image
from utils.dataset.sampling import DeterministicBatchSampler
from utils.dataset.sources import LoadImages
from tests.support.image_sets import make_dataset, noise, warnings_about
from tests.support.loader_batches import epoch_batches

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

HYP = dict(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, degrees=5.0, translate=0.1, scale=0.5, shear=2.0, perspective=0.0,
           flipud=0.2, fliplr=0.5, mosaic=0.8, mixup=0.3)


# ---------------------------------------------------------------- label and image verdicts

BAD_LABELS = [
    ("cols", "0 0.5 0.5 0.2\n", "expected 5 columns"),
    ("six cols", "0 0.5 0.5 0.2 0.2 0.9\n", "expected 5 columns 'class x y w h' or a polygon"),
    ("open polygon", "0 0.1 0.1 0.3 0.1 0.3 0.3 0.1\n", "or a polygon 'class x1 y1 x2 y2 x3 y3 ...', got 8"),
    ("polygon beyond", "0 0.1 0.1 0.3 0.1 1.3 0.3\n", "coordinate 1.3 > 1"),
    ("nonnum", "0 0.5 abc 0.2 0.2\n", "non-numeric"),
    ("nan", "0 0.5 nan 0.2 0.2\n", "NaN or infinite"),
    ("inf", "0 0.5 0.5 inf 0.2\n", "NaN or infinite"),
    ("negative", "0 0.5 -0.1 0.2 0.2\n", "negative value"),
    ("beyond", "0 0.5 1.5 0.2 0.2\n", "coordinate 1.5 > 1"),
    ("classid", "7 0.5 0.5 0.2 0.2\n", "class id 7 is not below nc=3"),
    ("fraction", "1.5 0.5 0.5 0.2 0.2\n", "not an integer"),
]


@pytest.mark.parametrize("name,text,reason", BAD_LABELS, ids=[b[0] for b in BAD_LABELS])
def test_bad_label_file_is_skipped_with_file_line_and_reason(tmp_path, log_lines, name, text, reason):
    images = make_dataset(tmp_path, n=3)
    bad = tmp_path / "labels" / "train" / "im1.txt"
    bad.write_text("1 0.5 0.5 0.1 0.1\n" + text)  # the bad row is on line 2
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert len(ds) == 2 and not any(f.endswith("im1.jpg") for f in ds.im_files)
    msgs = warnings_about(log_lines, f"{bad}:2:")
    assert msgs and reason in msgs[0] and "skipped" in msgs[0]
    summary = [m for m in log_lines if "usable images" in m][-1]
    assert "1 corrupt" in summary and "2 usable" in summary


def test_polygon_rows_train_as_their_enclosing_boxes_as_in_yolov5(tmp_path, log_lines):
    images = make_dataset(tmp_path, n=2)
    (tmp_path / "labels" / "train" / "im0.txt").write_text("2 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6\n1 0.5 0.5 0.2 0.2\n")
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert len(ds) == 2 and not warnings_about(log_lines, "im0.txt")
    np.testing.assert_allclose(ds.labels[ds.im_files.index(str(images / "im0.jpg"))],
                               [[2, 0.3, 0.4, 0.4, 0.4], [1, 0.5, 0.5, 0.2, 0.2]], atol=1e-6)


def test_a_cache_made_under_older_scan_rules_is_rescanned_under_the_same_hash(tmp_path, monkeypatch):
    images = make_dataset(tmp_path, n=3)
    first = LoadImagesAndLabels(str(images), img_size=64)
    cache = tmp_path / "labels" / "train.cache"
    with np.load(cache, allow_pickle=False) as z:
        older = {k: z[k] for k in z.files if k != "scan_rules"}  # as written before polygon rows were read
    with open(cache, "wb") as f:
        np.savez(f, **older)
    scans = []
    real_scan = label_cache._scan
    monkeypatch.setattr(label_cache, "_scan", lambda *a: scans.append(1) or real_scan(*a))
    again = LoadImagesAndLabels(str(images), img_size=64)
    assert scans == [1] and again.cache_hash == first.cache_hash
    with np.load(cache, allow_pickle=False) as z:
        assert str(z["scan_rules"]) == label_cache.SCAN_RULES


def test_label_just_beyond_one_is_clipped_and_duplicates_removed(tmp_path, log_lines):
    images = make_dataset(tmp_path, n=2)
    lb = tmp_path / "labels" / "train" / "im0.txt"
    lb.write_text("0 0.5 0.5 0.2 0.2\n1 0.9 1.0000004 0.1 0.1\n0 0.5 0.5 0.2 0.2\n\n")
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    labels = ds.labels[ds.im_files.index(str(images / "im0.jpg"))]
    np.testing.assert_allclose(labels, [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.9, 1.0, 0.1, 0.1]], atol=1e-6)
    assert any(f"{lb}:2: coordinate 1.0000004 slightly > 1 clipped to 1" in m for m in log_lines)
    assert any(f"{lb}:3: duplicate row removed" in m for m in log_lines)
    assert "1 duplicate" in [m for m in log_lines if "usable images" in m][-1]


def test_zero_size_boxes_are_dropped_with_file_and_line(tmp_path, log_lines):
    images = make_dataset(tmp_path, n=3)
    lb0, lb1 = tmp_path / "labels" / "train" / "im0.txt", tmp_path / "labels" / "train" / "im1.txt"
    lb0.write_text("0 0.5 0.5 0.3 0.4\n0 0.5 0.5 0 0\n2 0.2 0.3 0.1 0\n1 0.7 0.7 0 0.2\n")
    lb1.write_text("1 0.4 0.4 0 0\n")
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert len(ds) == 3  # the images stay; only the boxes go
    np.testing.assert_allclose(ds.labels[0], [[0, 0.5, 0.5, 0.3, 0.4]], atol=1e-6)
    assert ds.labels[1].shape == (0, 5)  # its only box was zero-size: now a background image
    for lb, line in [(lb0, 2), (lb0, 3), (lb0, 4), (lb1, 1)]:
        msgs = warnings_about(log_lines, f"{lb}:{line}:")
        assert len(msgs) == 1 and "zero-size box" in msgs[0] and "dropped" in msgs[0], (lb, line)
    assert not warnings_about(log_lines, f"{lb0}:1:")
    img, targets, *_ = ds[0]
    assert targets.shape == (1, 6) and (targets[:, 4:] > 0).all()


def test_zero_size_boxes_are_dropped_when_loading_from_the_cache(tmp_path, monkeypatch, log_lines):
    images = make_dataset(tmp_path, n=2)
    (tmp_path / "labels" / "train" / "im0.txt").write_text("0 0.5 0.5 0.3 0.4\n1 0.5 0.5 0.2 0\n")
    first = LoadImagesAndLabels(str(images), img_size=64)
    log_lines.clear()
    monkeypatch.setattr(label_cache, "_scan", lambda *a: pytest.fail("rescanned although the cache is valid"))
    again = LoadImagesAndLabels(str(images), img_size=64)
    assert [len(lb) for lb in again.labels] == [len(lb) for lb in first.labels] == [1, 2]
    assert any("im0.txt:2: zero-size box" in m for m in log_lines)  # reported on every load, like other verdicts


def test_missing_and_empty_labels_are_background_images(tmp_path, log_lines):
    images = make_dataset(tmp_path, n=3)
    (tmp_path / "labels" / "train" / "im0.txt").unlink()
    (tmp_path / "labels" / "train" / "im1.txt").write_text("\n  \n")
    ds = LoadImagesAndLabels(str(images), img_size=64)
    assert len(ds) == 3
    assert [len(lb) for lb in ds.labels] == [0, 0, 1]
    summary = [m for m in log_lines if "usable images" in m][-1]
    assert "1 found, 1 missing, 1 empty, 0 corrupt" in summary


def _truncated_jpeg(path):
    ok, buf = cv2.imencode(".jpg", noise(80, 96, 5))
    path.write_bytes(buf.tobytes()[: len(buf) // 2])


BAD_IMAGES = [
    ("zero", lambda p: p.write_bytes(b""), "zero-byte file"),
    ("truncated", _truncated_jpeg, "unreadable image"),
    ("text", lambda p: p.write_text("this is not an image"), "not an image file"),
    ("tiny", lambda p: cv2.imwrite(str(p), noise(6, 40)), "below 10 pixels"),
]


@pytest.mark.parametrize("name,make,reason", BAD_IMAGES, ids=[b[0] for b in BAD_IMAGES])
def test_bad_image_is_skipped_and_good_ones_load(tmp_path, log_lines, name, make, reason):
    images = make_dataset(tmp_path, n=3)
    bad = images / "im2.jpg"
    make(bad)
    ds = LoadImagesAndLabels(str(images), img_size=64)
    assert ds.im_files == [str(images / "im0.jpg"), str(images / "im1.jpg")]
    msgs = warnings_about(log_lines, str(bad))
    assert msgs and reason in msgs[0] and "skipped" in msgs[0]
    img, labels, path, shapes = ds[0]
    assert img.shape == (3, 64, 64) and img.dtype == torch.uint8


def test_listed_image_that_does_not_exist_is_reported(tmp_path, log_lines):
    make_dataset(tmp_path, n=2)
    listing = tmp_path / "train.txt"
    listing.write_text("images/train/im0.jpg\nimages/train/im1.jpg\nimages/train/gone.jpg\n")
    ds = LoadImagesAndLabels(str(listing), img_size=64)
    assert len(ds) == 2
    assert warnings_about(log_lines, "gone.jpg") and "file not found" in warnings_about(log_lines, "gone.jpg")[0]


def test_zero_usable_images_is_a_user_error(tmp_path):
    images = make_dataset(tmp_path, n=2)
    for f in images.iterdir():
        f.write_bytes(b"")
    with pytest.raises(UserError, match="no usable images"):
        LoadImagesAndLabels(str(images), img_size=64)


def test_missing_source_and_folder_without_images_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        LoadImagesAndLabels(str(tmp_path / "nope"), img_size=64)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="no images found"):
        LoadImagesAndLabels(str(tmp_path / "empty"), img_size=64)


def test_img2label_paths_replaces_the_last_images_folder():
    p = "/data/images/set/images/train/a.b.jpg".replace("/", os.sep)
    assert img2label_paths([p]) == ["/data/images/set/labels/train/a.b.txt".replace("/", os.sep)]


# ---------------------------------------------------------------- formats and orientation

def _write_formats(folder: Path):
    """One image per awkward format; returns {name: expected (h, w)}."""
    rgb = noise(40, 50)
    Image.fromarray(rgb[..., 0]).save(folder / "grey.png")
    Image.fromarray(np.dstack([rgb, np.full((40, 50), 128, np.uint8)])).save(folder / "rgba.png")
    cv2.imwrite(str(folder / "deep.png"), (rgb.astype(np.uint16) * 257))
    cv2.imwrite(str(folder / "plain.bmp"), rgb)
    Image.fromarray(rgb).save(folder / "plain.tif")
    Image.fromarray(rgb).save(folder / "plain.webp", lossless=True)
    return ["grey.png", "rgba.png", "deep.png", "plain.bmp", "plain.tif", "plain.webp"]


def test_every_format_loads_as_three_channel_uint8(tmp_path):
    names = _write_formats(tmp_path)
    for name in names:
        im = read_image(tmp_path / name)
        assert im is not None and im.shape == (40, 50, 3) and im.dtype == np.uint8, name
    deep = read_image(tmp_path / "deep.png")
    np.testing.assert_array_equal(deep, noise(40, 50))  # 16-bit x257 scales back to the 8-bit values
    ds = LoadImagesAndLabels(str(tmp_path), img_size=64)
    assert len(ds) == len(names)
    assert all(ds[i][0].shape == (3, 64, 64) for i in range(len(ds)))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_matches_pil_exif_transpose(orientation):
    rgb = noise(20, 30, orientation)
    pil = Image.fromarray(rgb)
    exif = pil.getexif()
    exif[0x0112] = orientation
    pil.info["exif"] = exif.tobytes()
    pil._exif = exif
    expected = np.asarray(ImageOps.exif_transpose(pil))
    np.testing.assert_array_equal(apply_orientation(rgb, orientation), expected)


def test_exif_rotated_jpeg_is_read_upright_with_upright_size(tmp_path):
    stored = np.zeros((40, 80, 3), np.uint8)
    stored[:, :20] = 255  # white band on the left of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(stored).save(folder / "rot.jpg", exif=exif.tobytes(), quality=95)
    upright = read_image(folder / "rot.jpg")
    assert upright.shape == (80, 40, 3)
    assert upright[:20].mean() > 200 and upright[30:].mean() < 50  # the band is now on top
    ds = LoadImagesAndLabels(str(folder), img_size=64)
    assert tuple(ds.shapes[0]) == (40, 80)  # (w, h) after rotation
    img = ds[0][0].numpy()
    assert img[:, 2:14, 18:46].mean() > 200 and img[:, 30:60, 18:46].mean() < 50  # band on top, long side vertical


# ---------------------------------------------------------------- label cache

def test_cache_is_written_safely_reused_and_rebuilt_on_change(tmp_path, monkeypatch):
    images = make_dataset(tmp_path, n=4)
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    cache = tmp_path / "labels" / "train.cache"
    assert cache.is_file() and isinstance(ds.cache_hash, str) and len(ds.cache_hash) == 64
    with np.load(cache, allow_pickle=False) as z:  # plain arrays, no pickled objects
        assert str(z["key"]) == ds.cache_hash
    assert not list(cache.parent.glob(".*.tmp"))  # atomic write left no temporary file

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned although the cache is valid")

    monkeypatch.setattr(label_cache, "_scan", no_scan)
    again = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert again.cache_hash == ds.cache_hash and len(again) == 4
    monkeypatch.undo()

    label = tmp_path / "labels" / "train" / "im0.txt"
    label.write_text("2 0.5 0.5 0.5 0.5\n2 0.1 0.1 0.1 0.1\n")
    changed = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert changed.cache_hash != ds.cache_hash
    np.testing.assert_allclose(changed.labels[0][:, 0], [2, 2])


def test_cache_hash_formula_is_pinned(tmp_path, monkeypatch):
    """determinism.json records cache_hash: the formula is spelled out here, independently of the code, so the
    same files keep giving the same hash across versions."""
    monkeypatch.chdir(tmp_path)
    files = ["images/train/a.jpg", "images/train/b.jpg", "labels/train/a.txt", "labels/train/b.txt"]
    for j, f in enumerate(files):
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        Path(f).write_bytes(bytes(range(20 + j)))
    def identity(f: str) -> str:
        data = Path(f).read_bytes() if Path(f).exists() else None
        return f"{f}|missing\n" if data is None else f"{f}|{len(data)}|{hashlib.sha256(data).hexdigest()}\n"

    def expected(paths) -> str:
        return hashlib.sha256(b"ffca-labels-3|0.01|10" + "".join(map(identity, paths)).encode()).hexdigest()

    assert label_cache.label_cache_key(files[:2], files[2:]) == expected(files)
    gone = "images/train/gone.jpg"
    assert label_cache.label_cache_key([*files[:2], gone], files[2:]) == expected([*files[:2], gone, *files[2:]])
    assert identity(files[0]) == f"{files[0]}|20|{hashlib.sha256(bytes(range(20))).hexdigest()}\n"


def test_a_label_replaced_with_its_size_and_timestamps_kept_is_read_anew(tmp_path):
    """``cp -p`` of a same-size label file keeps size and modification time: the cache must see the new rows."""
    images = make_dataset(tmp_path, n=3)
    label = tmp_path / "labels" / "train" / "im0.txt"
    label.write_text("1 0.5 0.5 0.2 0.2\n")
    first = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    stat = label.stat()
    label.write_text("2 0.5 0.5 0.2 0.2\n")
    os.utime(label, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert again.cache_hash != first.cache_hash
    assert again.labels[again.im_files.index(str(images / "im0.jpg"))][:, 0].tolist() == [2]


def test_the_label_scan_runs_serially_when_no_thread_can_start(tmp_path, monkeypatch, log_lines):
    images = make_dataset(tmp_path, n=3)

    def no_threads(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(image_io, "ThreadPool", no_threads)
    ds = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert len(ds) == 3 and any("one file at a time (can't start new thread)" in m for m in log_lines)


def test_cache_hash_depends_only_on_the_files(tmp_path):
    images = make_dataset(tmp_path, n=5, size=(60, 120))
    (tmp_path / "labels" / "train" / "im4.txt").write_text("7 0.5 0.5 0.2 0.2\n")  # skipped when nc=3
    scanned = LoadImagesAndLabels(str(images), img_size=64)
    cache = tmp_path / "labels" / "train.cache"
    variants = [LoadImagesAndLabels(str(images), img_size=64, nc=3),
                LoadImagesAndLabels(str(images), img_size=96, batch_size=2, rect=True, single_cls=True),
                LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, seed=9)]
    cache.unlink()
    rescanned = LoadImagesAndLabels(str(images), img_size=64)
    hashes = {ds.cache_hash for ds in [scanned, rescanned, *variants]}
    assert len(hashes) == 1
    files = sorted(str(f) for f in images.iterdir())
    assert hashes == {label_cache.label_cache_key(files, img2label_paths(files))}


def test_class_check_uses_the_cache_without_rescanning(tmp_path, monkeypatch, log_lines):
    images = make_dataset(tmp_path, n=4)
    (tmp_path / "labels" / "train" / "im3.txt").write_text("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.1 0.1\n")
    assert len(LoadImagesAndLabels(str(images), img_size=64)) == 4  # no nc: every class id is accepted
    monkeypatch.setattr(label_cache, "_scan", lambda *a: pytest.fail("rescanned for a different nc"))
    checked = LoadImagesAndLabels(str(images), img_size=64, nc=3)
    assert len(checked) == 3 and str(images / "im3.jpg") not in checked.im_files
    assert any("im3.txt:2: class id 5 is not below nc=3" in m for m in log_lines)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "pickle"])
def test_corrupt_cache_is_rebuilt_not_trusted(tmp_path, damage):
    images = make_dataset(tmp_path, n=3)
    first = LoadImagesAndLabels(str(images), img_size=64)
    cache = tmp_path / "labels" / "train.cache"
    data = cache.read_bytes()
    if damage == "truncate":
        cache.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        cache.write_bytes(b"\x00not a cache at all" * 10)
    else:  # an object array can only be read by unpickling: must be refused
        with open(cache, "wb") as f:
            np.savez(f, version=np.array(label_cache.CACHE_VERSION), key=np.array(first.cache_hash),
                     im_files=np.array([object()], dtype=object))
    rebuilt = LoadImagesAndLabels(str(images), img_size=64)
    assert len(rebuilt) == 3 and rebuilt.cache_hash == first.cache_hash
    assert all(np.array_equal(a, b) for a, b in zip(first.labels, rebuilt.labels))
    with np.load(cache, allow_pickle=False) as z:
        assert len(z["im_files"]) == 3


# ---------------------------------------------------------------- samples, options

def test_validation_sample_is_letterboxed_with_rescale_shapes(tmp_path):
    images = make_dataset(tmp_path, n=2, size=(60, 120))
    ds = LoadImagesAndLabels(str(images), img_size=64)
    img, labels, path, shapes = ds[0]
    assert img.shape == (3, 64, 64)
    (h0, w0), ((rh, rw), (padw, padh)) = shapes
    assert (h0, w0) == (60, 120) and rh == pytest.approx(32 / 60) and (padw, padh) == (0.0, 16.0)
    # the box 0.5 0.5 0.3 0.4 of the original, in the letterboxed 64 x 64 image
    np.testing.assert_allclose(labels[0, 1:].numpy(), [0, 0.5, 0.5, 0.3, 0.4 * 32 / 64], atol=1e-5)
    assert torch.equal(img[:, 0], torch.full((3, 64), 114, dtype=torch.uint8))  # top padding row


def test_rect_batches_use_stride_multiple_shapes(tmp_path):
    images = make_dataset(tmp_path, n=4, size=(60, 120))
    loader, ds = create_dataloader(str(images), 64, 2, 32, rect=True, workers=0, pad=0.0)
    assert ds.batch_shapes.tolist() == [[32, 64], [32, 64]]
    imgs, targets, paths, shapes = next(iter(loader))
    assert imgs.shape == (2, 3, 32, 64) and shapes[0] is not None
    assert targets[:, 0].tolist() == sorted(targets[:, 0].tolist())


def test_single_cls_and_targets_layout(tmp_path):
    images = make_dataset(tmp_path, n=4)
    loader, ds = create_dataloader(str(images), 64, 4, 32, single_cls=True, workers=0)
    imgs, targets, paths, shapes = next(iter(loader))
    assert imgs.dtype == torch.uint8 and imgs.shape == (4, 3, 64, 64)
    assert targets.shape == (6, 6) and set(targets[:, 1].tolist()) == {0.0}
    assert targets[:, 0].tolist() == [0, 1, 1, 2, 3, 3]
    assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all()


def test_augmented_samples_keep_valid_boxes_and_no_shapes(tmp_path):
    images = make_dataset(tmp_path, n=6)
    ds = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, nc=3)
    for epoch in range(3):
        for i in range(len(ds)):
            img, labels, _, shapes = ds[(i, epoch, 0)]
            assert img.shape == (3, 64, 64) and shapes is None
            assert set(labels[:, 1].tolist()) <= {0.0, 1.0, 2.0}
            assert ((labels[:, 2:] >= 0) & (labels[:, 2:] <= 1)).all()
    assert torch.equal(ds[(2, 1, 0)][0], ds[(2, 1, 0)][0])
    assert not torch.equal(ds[(2, 1, 0)][0], ds[(2, 2, 0)][0])


def test_augment_without_hyp_uses_scratch_low_and_incomplete_hyp_is_rejected(tmp_path):
    images = make_dataset(tmp_path, n=2)
    ds = LoadImagesAndLabels(str(images), img_size=64, augment=True)
    assert ds.hyp["mosaic"] == 1.0 and ds.hyp["scale"] == 0.5
    with pytest.raises(UserError, match="mosaic"):
        LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp={"hsv_h": 0.1})


def test_ram_cache_gives_identical_samples_and_is_refused_when_memory_is_short(tmp_path, monkeypatch, log_lines):
    images = make_dataset(tmp_path, n=3)
    plain = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP)
    cached = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, cache_images="ram")
    assert all(im is not None for im in cached.ims)
    for key in [(0, 0, 0), (1, 3, 0), (2, 5, 0)]:
        assert torch.equal(plain[key][0], cached[key][0]) and torch.equal(plain[key][1], cached[key][1])
    before = [im.copy() for im in cached.ims]
    for key in range(3):
        cached[(key, 9, 0)]
    assert all(np.array_equal(a, b) for a, b in zip(before, cached.ims))  # augmentation never writes into the cache

    monkeypatch.setattr(image_cache, "_available_memory", lambda: (1000, "MemAvailable"))
    refused = LoadImagesAndLabels(str(images), img_size=64, cache_images="ram")
    assert all(im is None for im in refused.ims)
    assert any("--cache ram needs" in m for m in log_lines)
    with pytest.raises(UserError, match="--cache"):
        LoadImagesAndLabels(str(images), img_size=64, cache_images="gpu")


def fake_memory_limits(tmp_path, monkeypatch, meminfo_kb, cgroup_max, rlimit_as, vm_size_kb=0):
    """Point the memory readers at a fake /proc and a fake cgroup v2 tree (process in /a/b, limit on /a)."""
    import resource

    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (cgroup / "a" / "b").mkdir(parents=True)
    proc.mkdir()
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    (proc / "cgroup").write_text("0::/a/b\n")
    (proc / "status").write_text(f"Name: python\nVmSize: {vm_size_kb} kB\n")
    (cgroup / "memory.max").write_text("max\n")  # the root: no limit
    (cgroup / "a" / "memory.max").write_text(f"{cgroup_max}\n")
    (cgroup / "a" / "memory.current").write_text("1000\n")
    (cgroup / "a" / "b" / "memory.max").write_text("max\n")
    for name, path in (("PROC_MEMINFO", proc / "meminfo"), ("PROC_SELF_CGROUP", proc / "cgroup"),
                       ("PROC_SELF_STATUS", proc / "status"), ("CGROUP_ROOT", cgroup)):
        monkeypatch.setattr(image_cache, name, path)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (rlimit_as, rlimit_as) if which == resource.RLIMIT_AS
                        else (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.mark.parametrize("meminfo_kb, cgroup_max, rlimit_as, vm_size_kb, expected", [
    (4_000_000, "max", -1, 0, (4_096_000_000, "MemAvailable")),
    (4_000_000, "3000", -1, 0, (2000, "cgroup memory.max")),  # a parent's limit counts, less what it uses
    (4_000_000, "max", 10_000_000, 8, (10_000_000 - 8192, "RLIMIT_AS")),  # less the address space already mapped
    (4_000_000, "max", 10_000, 1000, (0, "RLIMIT_AS")),
])
def test_available_memory_is_the_least_of_meminfo_cgroup_and_rlimit(tmp_path, monkeypatch, meminfo_kb, cgroup_max,
                                                                    rlimit_as, vm_size_kb, expected):
    fake_memory_limits(tmp_path, monkeypatch, meminfo_kb, cgroup_max, rlimit_as, vm_size_kb)
    assert image_cache._available_memory() == expected


@pytest.mark.parametrize("cgroup_max, rlimit_as, limit", [("20000", -1, "cgroup memory.max"),
                                                          ("max", 20000, "RLIMIT_AS")])
def test_ram_cache_falls_back_under_a_cgroup_or_rlimit_limit(tmp_path, monkeypatch, log_lines, cgroup_max,
                                                            rlimit_as, limit):
    images = make_dataset(tmp_path, n=3)  # 3 images of 64x64x3 bytes need ~40 kB: MemAvailable fits them
    fake_memory_limits(tmp_path, monkeypatch, 4_000_000, cgroup_max, rlimit_as)
    ds = LoadImagesAndLabels(str(images), img_size=64, cache_images="ram")
    assert all(im is None for im in ds.ims)
    assert any("--cache ram needs" in m and f"({limit})" in m for m in log_lines), log_lines
    monkeypatch.undo()
    assert all(im is not None for im in LoadImagesAndLabels(str(images), img_size=64, cache_images="ram").ims)


def test_disk_cache_writes_npy_and_loads_the_same_pixels(tmp_path):
    images = make_dataset(tmp_path, n=2)
    plain = LoadImagesAndLabels(str(images), img_size=64)
    disk = LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")
    assert all(Path(f).is_file() for f in disk.npy_files)
    assert torch.equal(plain[1][0], disk[1][0])


@pytest.mark.parametrize("size", [(300, 400), (150, 1000)])  # 1000 * (64 / 1000) rounds up past 64 in floats
def test_disk_cache_holds_the_image_shrunk_to_the_training_size_and_gives_identical_samples(tmp_path, size,
                                                                                           log_lines):
    images = make_dataset(tmp_path, n=3, size=size)
    plain = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP)
    disk = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, cache_images="disk")
    assert [Path(f).name for f in disk.npy_files] == [f"im{i}.64-linear.npy" for i in range(3)]
    cached = np.load(disk.npy_files[1])
    assert max(cached.shape[:2]) <= 65 and np.array_equal(cached, plain.images.base_image(1))
    for key in [(0, 0, 0), (1, 3, 0), (2, 5, 0)]:
        assert torch.equal(plain[key][0], disk[key][0]) and torch.equal(plain[key][1], disk[key][1])
    assert any("--cache disk: about" in m and "GB for 3 images" in m for m in log_lines)
    val = LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")  # other interpolation: other files
    assert Path(val.npy_files[0]).name == "im0.64-area.npy" and Path(val.npy_files[0]).is_file()


@pytest.mark.slow
def test_training_with_either_cache_is_bit_identical_to_training_without(shapes_data, tiny_cfg, tmp_path):
    from tests.support.run_outputs import assert_identical
    from tests.support.training_runs import train_run

    plain = train_run(tmp_path, shapes_data, tiny_cfg, name="plain", epochs=1, noplots=True, workers=2)
    for cache in ("disk", "ram"):
        assert_identical(train_run(tmp_path, shapes_data, tiny_cfg, name=cache, epochs=1, noplots=True, workers=2,
                                   cache=cache), plain)


@pytest.mark.parametrize("fault, reason", [("read_only", "Read-only"), ("full_disk", "No space left")])
def test_disk_cache_on_an_unwritable_data_set_warns_and_reads_the_images(request, tmp_path, log_lines, fault,
                                                                          reason):
    images = make_dataset(tmp_path, n=3)
    plain = LoadImagesAndLabels(str(images), img_size=64)
    request.getfixturevalue(fault)(images)
    disk = LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")
    warnings = warnings_about(log_lines, "--cache disk")
    assert len(warnings) == 1 and str(images) in warnings[0] and reason in warnings[0], log_lines
    assert not list(images.glob("*.npy")) and not list(images.glob(".*"))  # nothing written, no temporaries
    assert torch.equal(plain[1][0], disk[1][0])


def test_image_weights_favour_images_with_rare_classes(tmp_path):
    images = make_dataset(tmp_path, n=6)
    for i in range(6):  # class 2 only in im5, class 0 everywhere else
        (tmp_path / "labels" / "train" / f"im{i}.txt").write_text("2 0.5 0.5 0.2 0.2\n" if i == 5 else
                                                                     "0 0.5 0.5 0.2 0.2\n")
    ds = LoadImagesAndLabels(str(images), img_size=64, image_weights=True)
    sampler = DeterministicBatchSampler(ds, batch_size=6, seed=0)
    counts = np.zeros(6)
    for epoch in range(20):
        sampler.set_epoch(epoch)
        keys = [k for b in sampler for k in b]
        for index, _, draw in keys:
            counts[index] += 1
        assert len(set(keys)) == len(keys)  # repeated images get distinct draw numbers
    assert counts[5] > 2 * counts[:5].mean()


def test_quad_collate_makes_double_size_images(tmp_path):
    images = make_dataset(tmp_path, n=8)
    loader, _ = create_dataloader(str(images), 64, 8, 32, quad=True, workers=0)
    imgs, targets, paths, shapes = next(iter(loader))
    assert imgs.shape == (2, 3, 128, 128) and len(paths) == 2
    assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all() and set(targets[:, 0].tolist()) <= {0.0, 1.0}


def test_quad_collate_short_last_batch_upscales_instead_of_crashing(tmp_path):
    images = make_dataset(tmp_path, n=10)
    loader, _ = create_dataloader(str(images), 64, 8, 32, quad=True, workers=0)
    shapes = [imgs.shape for imgs, *_ in loader]
    assert shapes == [(2, 3, 128, 128), (1, 3, 128, 128)]  # 8 images -> 2 groups, the last 2 -> 1 upscaled


# ---------------------------------------------------------------- determinism, resume, shards



def test_batches_are_identical_for_workers_0_and_2_over_twoepoch_batches(tmp_path):
    images = make_dataset(tmp_path, n=10)
    kwargs = dict(hyp=HYP, augment=True, shuffle=True, seed=3)
    l0, _ = create_dataloader(str(images), 64, 4, 32, workers=0, **kwargs)
    l2, _ = create_dataloader(str(images), 64, 4, 32, workers=2, **kwargs)
    assert l0.num_workers == 0 and l2.num_workers == 2
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    a, b = epoch_batches(l0, [0, 1]), epoch_batches(l2, [0, 1])
    assert torch.equal(torch_state, torch.get_rng_state())  # loaders never touch the global generators
    assert np.array_equal(np_state[1], np.random.get_state()[1]) and py_state == random.getstate()
    assert [len(e) for e in a] == [3, 3]
    for ea, eb in zip(a, b):
        for (ia, ta, pa), (ib, tb, pb) in zip(ea, eb):
            assert pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
    assert [p for _, _, p in a[0]] != [p for _, _, p in a[1]]  # the order changes with the epoch


def test_set_epoch_start_batch_yields_the_tail_of_the_full_epoch(tmp_path):
    images = make_dataset(tmp_path, n=10)
    loader, _ = create_dataloader(str(images), 64, 3, 32, hyp=HYP, augment=True, shuffle=True, seed=1, workers=0)
    full = epoch_batches(loader, [4])[0]
    loader.set_epoch(4, start_batch=2)
    tail = [(b[0], b[1], b[2]) for b in loader]
    assert len(full) == len(loader) == 4 and len(tail) == 2
    for (ia, ta, pa), (ib, tb, pb) in zip(full[2:], tail):
        assert pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
    with pytest.raises(ValueError):
        loader.set_epoch(0, start_batch=99)


def test_two_ranks_cover_every_image_with_equal_counts(tmp_path, monkeypatch):
    images = make_dataset(tmp_path, n=7)
    monkeypatch.setenv("WORLD_SIZE", "2")
    shards = []
    for rank in (0, 1):
        loader, ds = create_dataloader(str(images), 64, 2, 32, rank=rank, shuffle=True, seed=5, workers=0)
        loader.set_epoch(3)
        keys = [k for batch in loader.batch_sampler for k in batch]
        shards.append(keys)
        assert len(loader) == 2
    assert len(shards[0]) == len(shards[1]) == 4  # 7 images padded to 8
    indices = [k[0] for s in shards for k in s]
    assert set(indices) == set(range(7)) and len(indices) == 8
    monkeypatch.setenv("WORLD_SIZE", "1")
    single = DeterministicBatchSampler(ds, 2, shuffle=True, seed=5)
    single.set_epoch(3)
    order = [k[0] for b in single for k in b]
    assert [k[0] for k in shards[0]] == order[0::2]  # shard = every second image of the same epoch order


def test_rect_shards_keep_whole_batches(tmp_path):
    images = make_dataset(tmp_path, n=6, size=(60, 120))
    ds = LoadImagesAndLabels(str(images), img_size=64, batch_size=2, rect=True)
    parts = []
    for rank in (0, 1):
        sampler = DeterministicBatchSampler(ds, 2, rank=rank, world_size=2)
        parts.append([[k[0] for k in b] for b in sampler])
    assert parts == [[[0, 1], [4, 5]], [[2, 3], [0, 1]]]


# ---------------------------------------------------------------- inference sources

def _write_video(path, frames=6, size=(48, 64)):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 5, (size[1], size[0]))
    for i in range(frames):
        writer.write(np.full((*size, 3), i * 30, np.uint8))
    writer.release()


def test_load_images_mixes_images_and_video_frames(tmp_path):
    cv2.imwrite(str(tmp_path / "a.jpg"), noise(50, 70))
    _write_video(tmp_path / "clip.avi")
    (tmp_path / "readme.md").write_text("ignored")
    items = list(LoadImages(str(tmp_path), img_size=64, stride=32, vid_stride=2))
    assert [Path(p).name for p, *_ in items] == ["a.jpg", "clip.avi", "clip.avi", "clip.avi"]
    path, im, im0, cap, s = items[0]
    assert im.shape == (3, 64, 64) and im.dtype == np.uint8 and im0.shape == (50, 70, 3) and cap is None
    np.testing.assert_array_equal(im, letterbox(im0, 64, stride=32)[0].transpose(2, 0, 1)[::-1])
    assert items[1][3] is not None and "video 2/2" in items[1][4]
    assert im.shape[1] % 32 == 0 and im.shape[2] % 32 == 0


def test_load_images_from_glob_and_txt_list(tmp_path):
    for name in ("a.png", "b.png"):
        cv2.imwrite(str(tmp_path / name), noise(40, 40))
    assert len(LoadImages(str(tmp_path / "*.png"), img_size=64)) == 2
    (tmp_path / "list.txt").write_text("b.png\n")
    paths = [p for p, *_ in LoadImages(str(tmp_path / "list.txt"), img_size=64)]
    assert [Path(p).name for p in paths] == ["b.png"]


def test_load_images_bad_sources_are_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"missing.jpg: no such file or folder; pass an image, folder, glob, video"):
        LoadImages(str(tmp_path / "missing.jpg"))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(UserError, match="no supported files"):
        LoadImages(str(tmp_path))
