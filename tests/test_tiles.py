"""Training tiles cut on the fly (utils/dataset/tiles.py): windows, clipped boxes, scale, determinism, no files."""

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.autoanchor import dataset_box_sizes
from utils.dataloaders import LoadImagesAndLabels, create_dataloader
from utils.dataset.tiles import (MIN_VISIBILITY, box_scale, crop_labels, letterbox_tile, resolve_tile_size,
                                 sample_tile, tile_window)
from utils.errors import UserError
from utils.extra_hyps import mean_object_size
from tests.support.loader_batches import epoch_batches

HYP = dict(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, degrees=5.0, translate=0.1, scale=0.5, shear=2.0, perspective=0.0,
           flipud=0.2, fliplr=0.5, mosaic=0.8, mixup=0.3)
PLAIN = dict.fromkeys(HYP, 0.0)  # no augmentation at all: a sample is the tile, letterboxed


def make_large_dataset(root: Path, n=6, size=(256, 256)):
    """n noise PNGs (h, w) = size, each with three small boxes spread over the image; returns the images folder."""
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i in range(n):
        noise = np.random.default_rng(i).integers(0, 256, (*size, 3), dtype=np.uint8)
        cv2.imwrite(str(images / f"im{i}.png"), noise)
        rows = [f"{i % 2} 0.1 0.15 0.05 0.04", "1 0.55 0.5 0.06 0.08", f"0 0.85 {0.2 + 0.1 * i:.2f} 0.04 0.05"]
        (labels / f"im{i}.txt").write_text("\n".join(rows) + "\n")
    return images


def original(ds, i):
    """Image i as read from disk (BGR) and its labels (n, 5) [cls, x1, y1, x2, y2] in its pixels."""
    im = cv2.imread(ds.im_files[i])
    h, w = im.shape[:2]
    return im, ds._pixel_labels(i, w, h)


def bgr(img_chw):
    return np.ascontiguousarray(img_chw.numpy().transpose(1, 2, 0)[:, :, ::-1])


def locate(needle, haystack):
    """(x, y) where ``needle`` occurs exactly in ``haystack``, or None."""
    scores = cv2.matchTemplate(haystack, needle, cv2.TM_SQDIFF)
    _, _, (x, y), _ = cv2.minMaxLoc(scores)
    crop = haystack[y:y + needle.shape[0], x:x + needle.shape[1]]
    return (x, y) if np.array_equal(crop, needle) else None


# ---------------------------------------------------------------- windows and clipped boxes

def test_crop_labels_keeps_boxes_at_least_sixty_percent_inside_clipped_and_shifted():
    labels = np.array([[0, 20, 20, 30, 30],    # inside: kept, shifted by the window origin
                       [1, 0, 20, 20, 30],     # half inside (0.5): dropped
                       [0, 66, 20, 80, 30],    # 8 of 14 px inside (0.571): dropped
                       [1, 68, 40, 78, 50],    # 6 of 10 px inside (0.6): kept, clipped
                       [0, 100, 100, 110, 110]], dtype=np.float64)  # outside: dropped
    kept = crop_labels(labels, (10, 10, 74, 74))
    np.testing.assert_array_equal(kept, [[0, 10, 10, 20, 20], [1, 58, 30, 64, 40]])
    assert MIN_VISIBILITY == 0.6
    assert len(crop_labels(labels, (10, 10, 74, 74), min_visibility=0.5)) == 4  # the 0.5 and 0.571 boxes join


def test_windows_stay_inside_the_image_with_the_tile_size():
    rng = np.random.default_rng(0)
    boxes = np.array([[5.0, 5.0, 15.0, 12.0], [180.0, 90.0, 196.0, 100.0]])
    for _ in range(200):
        x1, y1, x2, y2 = tile_window(200, 120, 64, boxes, rng)
        assert (x2 - x1, y2 - y1) == (64, 64) and 0 <= x1 and x2 <= 200 and 0 <= y1 and y2 <= 120
    x1, y1, x2, y2 = tile_window(200, 40, 64, boxes, rng)  # shorter than the tile: used whole along y
    assert (y1, y2) == (0, 40) and x2 - x1 == 64


def test_image_that_fits_the_tile_is_used_whole_without_drawing():
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    assert tile_window(50, 64, 64, np.zeros((1, 4)), rng) == (0, 0, 50, 64)
    assert rng.bit_generator.state == before


def test_object_bias_puts_the_whole_box_in_the_window():
    box = np.array([[150.0, 30.5, 170.0, 52.0]])
    rng = np.random.default_rng(1)
    starts = set()
    for _ in range(300):
        x1, y1, x2, y2 = tile_window(256, 256, 64, box, rng, object_bias=1.0)
        assert x1 <= 150 and x2 >= 170 and y1 <= 30.5 and y2 >= 52
        starts.add((x1, y1))
    assert len(starts) > 50  # spread over the positions that hold the box, not always centred
    uniform = [tile_window(256, 256, 64, box, rng, object_bias=0.0) for _ in range(300)]
    assert sum(w[0] <= 150 and w[2] >= 170 and w[1] <= 30.5 and w[3] >= 52 for w in uniform) < 100


def test_box_larger_than_the_tile_gets_a_centred_window():
    box = np.array([[20.0, 40.0, 120.0, 90.0]])  # 100 px wide, 50 high: the x range cannot hold it
    x1, y1, x2, y2 = tile_window(256, 256, 64, box, np.random.default_rng(0), object_bias=1.0)
    assert (x1, x2) == (38, 102) and y1 <= 40 and y2 >= 90


def test_sample_tile_scales_the_window_to_img_size_over_tile():
    im = np.zeros((256, 300, 3), np.uint8)
    labels = np.array([[0, 100, 100, 110, 120]], dtype=np.float64)
    tile, (h, w), kept = sample_tile(im, labels, 128, 64, np.random.default_rng(0))
    assert tile.shape == (128, 128, 3) and (h, w) == (64, 64)
    if len(kept):
        np.testing.assert_allclose(kept[0, 3:] - kept[0, 1:3], [5, 10])  # 10 x 20 px shown at half size
    assert np.shares_memory(tile, im)  # a view: nothing is copied or written


def test_letterbox_tile_pads_and_never_enlarges():
    tile = np.full((40, 64, 3), 7, np.uint8)
    img, labels = letterbox_tile(tile, (40, 64), np.array([[0, 0.0, 0.0, 10.0, 10.0]]), 64)
    assert img.shape == (64, 64, 3) and (img[12:52] == 7).all() and (img[:12] == 114).all()
    np.testing.assert_array_equal(labels, [[0, 0, 12, 10, 22]])


def test_box_scale_is_long_side_over_tile():
    np.testing.assert_array_equal(box_scale([[1024, 512], [100, 200]], 256), [[4.0], [200 / 256]])
    assert box_scale([[1024, 512]], None) is None


def test_autoanchor_and_nwd_constant_see_boxes_at_tile_scale(tmp_path):
    images = make_large_dataset(tmp_path, n=2)
    ds = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, train_tiles=128)
    scale = box_scale(ds.shapes, 128)
    original = np.concatenate([lb[:, 3:5] for lb in ds.labels]) * 256
    np.testing.assert_allclose(dataset_box_sizes(ds, 64, scale), original / 2)  # 128 px tiles at 64 px: half size
    np.testing.assert_allclose(dataset_box_sizes(ds, 64), original / 4)  # whole images would shrink 4x
    mean_side = np.sqrt(original.prod(1)).mean()
    assert mean_object_size(ds.labels, ds.shapes, 64, scale) == pytest.approx(mean_side / 2)
    assert mean_object_size(ds.labels, ds.shapes, 64) == pytest.approx(mean_side / 4)


# ---------------------------------------------------------------- the setting: flag, YAML key, errors

def test_flag_wins_over_the_yaml_key_and_a_resume_reads_only_its_flag():
    data = {"train_tiles": 128, "yaml_file": "d.yaml"}
    assert resolve_tile_size(64, data, 32) == 64
    assert resolve_tile_size(None, data, 32) == 128
    assert resolve_tile_size(None, {"yaml_file": "d.yaml"}, 32) is None
    assert resolve_tile_size(None, data, 32, resume_ckpt={}) is None
    assert resolve_tile_size(96, data, 32, resume_ckpt={}) == 96


@pytest.mark.parametrize("flag, yaml_value, needle", [
    (0, None, "--train-tiles 0: must be a positive"),
    (-64, None, "--train-tiles -64: must be a positive"),
    (100, None, "--train-tiles 100: must be a multiple of the model stride 32, e.g. 96 or 128"),
    (16, None, "--train-tiles 16: must be a multiple of the model stride 32, e.g. 32"),
    (None, "640", "d.yaml: train_tiles '640': must be a positive"),
    (None, True, "d.yaml: train_tiles True: must be a positive"),
    (None, 48, "d.yaml: train_tiles 48: must be a multiple"),
    (64, None, "--train-tiles 64: cannot be combined with --rect"),
])
def test_bad_tile_sizes_are_user_errors_naming_the_flag_or_key(flag, yaml_value, needle):
    with pytest.raises(UserError) as e:
        resolve_tile_size(flag, {"train_tiles": yaml_value, "yaml_file": "d.yaml"}, 32, rect=flag == 64)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_tiles_with_rect_is_a_user_error(tmp_path):
    images = make_large_dataset(tmp_path, n=2)
    with pytest.raises(UserError, match="--train-tiles 64 cannot be combined with --rect"):
        LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, rect=True, train_tiles=64)


# ---------------------------------------------------------------- samples from the data set

def test_unaugmented_tile_sample_is_an_exact_crop_of_the_original_with_its_labels(tmp_path):
    images = make_large_dataset(tmp_path, n=3)
    ds = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=PLAIN, train_tiles=64)
    found = 0
    for epoch in range(4):
        for i in range(3):
            img, labels, _, _ = ds[(i, epoch, 0)]
            im0, lb0 = original(ds, i)
            xy = locate(bgr(img), im0)
            assert xy is not None, "the sample is not a crop of its image"
            x, y = xy
            expected = crop_labels(lb0, (x, y, x + 64, y + 64))
            got = labels[:, 1:].numpy().astype(np.float64)
            got[:, 1:] *= 64  # normalised xywh -> pixels
            np.testing.assert_allclose(got[:, 1:3], (expected[:, 1:3] + expected[:, 3:5]) / 2, atol=1e-3)
            np.testing.assert_allclose(got[:, 3:5], expected[:, 3:5] - expected[:, 1:3], atol=1e-3)
            np.testing.assert_array_equal(got[:, 0], expected[:, 0])
            found += len(expected)
    assert found > 0  # object bias: some tiles hold boxes although boxes cover < 1 % of the image


def test_tile_larger_than_img_size_is_shown_smaller(tmp_path):
    images = make_large_dataset(tmp_path, n=2)
    ds = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=PLAIN, train_tiles=128)
    sizes = []
    for epoch in range(6):
        _, labels, _, _ = ds[(0, epoch, 0)]
        sizes += (labels[:, 4:] * 64).tolist()
    assert sizes, "no box in six tiles"
    whole = {(0.05 * 256 / 2, 0.04 * 256 / 2), (0.06 * 256 / 2, 0.08 * 256 / 2), (0.04 * 256 / 2, 0.05 * 256 / 2)}
    for w, h in sizes:  # each box whole at half size, or clipped (then smaller)
        assert any(w <= ew + 1e-3 and h <= eh + 1e-3 for ew, eh in whole)
    assert any(any(abs(w - ew) < 1e-3 and abs(h - eh) < 1e-3 for ew, eh in whole) for w, h in sizes)


def test_image_smaller_than_the_tile_is_used_whole_and_padded(tmp_path):
    images = make_large_dataset(tmp_path, n=1, size=(64, 100))
    ds = LoadImagesAndLabels(str(images), img_size=128, augment=True, hyp=PLAIN, train_tiles=128)
    img, labels, _, _ = ds[(0, 0, 0)]
    sample, (im0, lb0) = bgr(img), original(ds, 0)
    assert np.array_equal(sample[32:96, 14:114], im0)  # not enlarged: centred with grey around it
    assert (sample[:32] == 114).all() and (sample[:, :14] == 114).all()
    np.testing.assert_allclose(labels[:, 2].numpy() * 128, (lb0[:, 1] + lb0[:, 3]) / 2 + 14, atol=1e-3)


def test_mosaic_of_tiles_gives_valid_boxes_and_differs_from_whole_images(tmp_path):
    images = make_large_dataset(tmp_path, n=6)
    tiled = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP, train_tiles=64)
    whole = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=HYP)
    differ = 0
    for epoch in range(3):
        for i in range(6):
            img, labels, _, _ = tiled[(i, epoch, 0)]
            assert img.shape == (3, 64, 64)
            assert ((labels[:, 2:] >= 0) & (labels[:, 2:] <= 1)).all() and (labels[:, 4:] > 0).all()
            differ += not torch.equal(img, whole[(i, epoch, 0)][0])
    assert differ == 18


# ---------------------------------------------------------------- determinism, resume, caches, disk



def _same(a, b):
    return len(a) == len(b) and all(pa == pb and torch.equal(ia, ib) and torch.equal(ta, tb)
                                    for (ia, ta, pa), (ib, tb, pb) in zip(a, b))


@pytest.mark.slow
def test_tile_batches_are_identical_for_workers_0_and_2_over_twoepoch_batches(tmp_path):
    images = make_large_dataset(tmp_path, n=10)
    kwargs = dict(hyp=HYP, augment=True, shuffle=True, seed=3, train_tiles=64)
    l0, _ = create_dataloader(str(images), 64, 4, 32, workers=0, **kwargs)
    l2, _ = create_dataloader(str(images), 64, 4, 32, workers=2, **kwargs)
    assert l0.num_workers == 0 and l2.num_workers == 2
    a, b = epoch_batches(l0, [0, 1]), epoch_batches(l2, [0, 1])
    assert all(_same(ea, eb) for ea, eb in zip(a, b))
    assert not _same(a[0], epoch_batches(l0, [1])[0])  # another epoch, other tiles


def test_tile_epoch_tail_after_set_epoch_start_batch_matches_the_full_epoch(tmp_path):
    images = make_large_dataset(tmp_path, n=10)
    loader, _ = create_dataloader(str(images), 64, 3, 32, hyp=HYP, augment=True, shuffle=True, seed=1, workers=0,
                                  train_tiles=64)
    full = epoch_batches(loader, [4])[0]
    loader.set_epoch(4, start_batch=2)
    assert _same(full[2:], [(b[0], b[1], b[2]) for b in loader])


def test_ram_cache_holds_full_images_gives_identical_tiles_and_is_never_written(tmp_path):
    images = make_large_dataset(tmp_path, n=3)
    hyp = {**PLAIN, "hsv_s": 0.7, "hsv_v": 0.4}  # in-place HSV on a tile that needs no resizing or padding
    plain = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=hyp, train_tiles=64)
    cached = LoadImagesAndLabels(str(images), img_size=64, augment=True, hyp=hyp, train_tiles=64,
                                 cache_images="ram")
    assert all(im.shape == (256, 256, 3) for im in cached.ims)
    before = [im.copy() for im in cached.ims]
    for key in [(0, 0, 0), (1, 3, 0), (2, 5, 0)]:
        assert torch.equal(plain[key][0], cached[key][0]) and torch.equal(plain[key][1], cached[key][1])
    assert all(np.array_equal(a, b) for a, b in zip(before, cached.ims))


def test_tile_training_writes_no_files(tmp_path):
    images = make_large_dataset(tmp_path, n=4)
    loader, _ = create_dataloader(str(images), 64, 2, 32, hyp=HYP, augment=True, shuffle=True, workers=0,
                                  train_tiles=64)
    listing = sorted((p, p.stat().st_size) for p in tmp_path.rglob("*"))  # the label cache exists by now
    epoch_batches(loader, [0, 1])
    assert sorted((p, p.stat().st_size) for p in tmp_path.rglob("*")) == listing


def test_validation_loader_ignores_tiles(tmp_path):
    images = make_large_dataset(tmp_path, n=2)
    ds = LoadImagesAndLabels(str(images), img_size=64, train_tiles=64)
    img, labels, _, shapes = ds[0]
    assert ds.tiles is None and shapes[0] == (256, 256) and len(labels) == 3  # the whole image, shrunk
