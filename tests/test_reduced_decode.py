"""``--reduced-decode``: libjpeg decodes a large JPEG at 1/2, 1/4 or 1/8 scale when that still covers the training
size, then the usual shrink does the rest. Same shapes as a full decode, close pixels, and as deterministic as ever:
caches, workers and reruns give the same batches."""

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.dataloaders import LoadImagesAndLabels, create_dataloader
from utils.dataset import image_io
from utils.dataset.image_io import jpeg_reduction
from utils.dataset.synthetic.photos import make_photo_image
from tests.support.loader_batches import epoch_batches

HYP = dict(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, degrees=5.0, translate=0.1, scale=0.5, shear=2.0, perspective=0.0,
           flipud=0.2, fliplr=0.5, mosaic=1.0, mixup=0.0)


def photo_dataset(root: Path, n=4, size=(384, 512), suffix="jpg") -> Path:
    """``n`` photo-content images of (h, w) ``size`` with two labelled boxes each; returns the images folder."""
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        scene = make_photo_image(rng, size=max(size))[0][:size[0], :size[1]]
        cv2.imwrite(str(images / f"im{i}.{suffix}"), scene, [cv2.IMWRITE_JPEG_QUALITY, 90])
        (labels / f"im{i}.txt").write_text(f"{i % 5} 0.5 0.5 0.1 0.1\n1 0.2 0.3 0.05 0.08\n")
    return images


@pytest.mark.parametrize("name, long_side, target, factor", [
    ("a.jpg", 2000, 640, 2), ("a.JPEG", 4000, 640, 4), ("a.jpg", 5120, 640, 8), ("a.jpg", 1279, 640, 1),
    ("a.jpg", 640, 640, 1), ("a.jpg", 512, 128, 4), ("a.png", 4000, 640, 1), ("a.webp", 4000, 640, 1)])
def test_jpeg_reduction_is_the_largest_factor_that_still_covers_the_training_size(name, long_side, target, factor):
    assert jpeg_reduction(name, long_side, target) == factor


def test_reduced_decode_decodes_smaller_and_stays_close_to_a_full_decode(tmp_path, monkeypatch):
    images = photo_dataset(tmp_path)
    full = LoadImagesAndLabels(str(images), img_size=128, augment=True, hyp=HYP)
    reduced = LoadImagesAndLabels(str(images), img_size=128, augment=True, hyp=HYP, reduced_decode=True)
    flags = []
    real_imread = cv2.imread
    monkeypatch.setattr(image_io.cv2, "imread", lambda path, flag: flags.append(flag) or real_imread(path, flag))
    a, b = full.images.base_image(1), reduced.images.base_image(1)
    assert flags == [cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION,
                     cv2.IMREAD_REDUCED_COLOR_4 | cv2.IMREAD_IGNORE_ORIENTATION]
    assert a.shape == b.shape == (96, 128, 3)
    difference = np.abs(a.astype(int) - b.astype(int))
    assert 0 < difference.mean() < 4, difference.mean()  # another decode, the same picture
    assert reduced.load_image(1)[1:] == full.load_image(1)[1:] == ((384, 512), (96, 128))


@pytest.mark.parametrize("suffix, size", [("png", (384, 512)), ("jpg", (150, 200))])
def test_reduced_decode_leaves_pngs_and_images_near_the_training_size_as_they_were(tmp_path, suffix, size):
    images = photo_dataset(tmp_path, n=2, size=size, suffix=suffix)
    full = LoadImagesAndLabels(str(images), img_size=128)
    reduced = LoadImagesAndLabels(str(images), img_size=128, reduced_decode=True)
    assert np.array_equal(full.images.base_image(0), reduced.images.base_image(0))


def test_reduced_decode_gives_the_same_batches_with_either_cache_and_any_workers(tmp_path):
    images = photo_dataset(tmp_path)

    def batches(cache, workers):
        loader = create_dataloader(str(images), 128, 2, 32, hyp=HYP, augment=True, cache=cache, workers=workers,
                                   shuffle=True, seed=3, reduced_decode=True)[0]
        return epoch_batches(loader, [0, 1])

    plain = batches(None, 0)
    for cache, workers in [(None, 0), (None, 2), ("disk", 0), ("ram", 2)]:
        other = batches(cache, workers)
        for epoch_a, epoch_b in zip(plain, other):
            for (im_a, t_a, _), (im_b, t_b, _) in zip(epoch_a, epoch_b, strict=True):
                assert torch.equal(im_a, im_b) and torch.equal(t_a, t_b), (cache, workers)
    assert sorted(p.name for p in images.glob("*.npy")) == [f"im{i}.128-linear-reduced.npy" for i in range(4)]


def test_a_full_decode_cache_is_never_read_for_a_reduced_decode(tmp_path):
    images = photo_dataset(tmp_path, n=2)
    full = LoadImagesAndLabels(str(images), img_size=128, augment=True, hyp=HYP, cache_images="disk")
    reduced = LoadImagesAndLabels(str(images), img_size=128, augment=True, hyp=HYP, cache_images="disk",
                                  reduced_decode=True)
    assert set(full.npy_files).isdisjoint(reduced.npy_files)
    assert not np.array_equal(full.images.base_image(0), reduced.images.base_image(0))
