"""The ``--cache disk`` entries: used only for the image bytes they were made from, rebuilt when damaged or
stale, read around when they change during a run, and never left half-written by a full disk."""

import errno
import itertools
import os
import shutil
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.dataloaders import LoadImagesAndLabels
from utils.dataset import image_cache
from utils.dataset.image_cache import ImageCache, read_entry, source_key
from utils.errors import UserError
from tests.support.image_sets import make_dataset, noise, warnings_about


def bmp_cache(folder: Path, n=3, mode="disk"):
    """An ImageCache over ``n`` 48 x 40 BMPs (uncompressed: a replacement of the same size has the same length)."""
    files = [folder / f"im{i}.bmp" for i in range(n)]
    if not files[0].exists():
        folder.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(files):
            cv2.imwrite(str(f), noise(40, 48, seed=i))
    shapes, orientations = np.array([[48, 40]] * n), np.ones(n, dtype=int)
    return ImageCache([str(f) for f in files], shapes, orientations, img_size=32, augment=True, mode=mode)


def decoded(path, size=32):
    """What an uncached ImageCache gives for the one image ``path``."""
    return ImageCache([str(path)], np.array([[48, 40]]), np.ones(1, dtype=int), size, augment=True).base_image(0)


def test_an_entry_holds_the_image_then_the_key_of_its_source_bytes(tmp_path):
    cache = bmp_cache(tmp_path)
    im, key = read_entry(cache.npy_files[1])
    assert key == source_key(cache.im_files[1]) and str(os.path.getsize(cache.im_files[1])) in key
    assert np.array_equal(np.load(cache.npy_files[1], allow_pickle=False), im)  # a plain np.load gives the image
    assert np.array_equal(im, decoded(cache.im_files[1]))


def test_an_image_replaced_with_the_same_size_and_timestamps_is_never_served_from_the_cache(tmp_path, log_lines):
    first = bmp_cache(tmp_path)
    replaced, old = Path(first.im_files[1]), first.base_image(1)
    times = os.stat(replaced)
    before = replaced.read_bytes()
    cv2.imwrite(str(replaced), noise(40, 48, seed=99))
    os.utime(replaced, ns=(times.st_atime_ns, times.st_mtime_ns))  # what cp -p, tar and rsync -a do
    assert len(replaced.read_bytes()) == len(before) and replaced.read_bytes() != before
    assert os.stat(first.npy_files[1]).st_mtime_ns >= os.stat(replaced).st_mtime_ns  # the cache looks newer
    again = bmp_cache(tmp_path)
    new = decoded(replaced)
    assert not np.array_equal(new, old)
    assert np.array_equal(again.base_image(1), new) and np.array_equal(read_entry(again.npy_files[1])[0], new)
    rebuilt = [m for m in log_lines if "rebuilt" in m]
    assert len(rebuilt) == 1 and again.npy_files[1] in rebuilt[0] and "1 .npy" in rebuilt[0]
    assert np.array_equal(again.base_image(0), decoded(again.im_files[0]))  # the others are kept


def test_training_samples_after_cp_p_replaces_an_image_and_its_labels_match_the_uncached_ones(tmp_path):
    images = make_dataset(tmp_path / "data", n=4)
    LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")
    donor = make_dataset(tmp_path / "donor", n=4)  # same names, other pixels (another seed per name below)
    cv2.imwrite(str(donor / "im2.jpg"), noise(80, 96, seed=42))
    os.utime(donor / "im2.jpg", ns=(10**18, 10**18))  # older than the cache, as an unpacked archive's file is
    for src, dst in ((donor / "im2.jpg", images / "im2.jpg"),
                     (donor.parent.parent / "labels" / "train" / "im0.txt",
                      images.parent.parent / "labels" / "train" / "im2.txt")):
        shutil.copy2(src, dst)
    cached = LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")
    plain = LoadImagesAndLabels(str(images), img_size=64)
    for i in range(4):
        assert torch.equal(cached[i][0], plain[i][0]) and torch.equal(cached[i][1], plain[i][1])


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path):
    path.write_bytes(b"\x00not a cache file" * 50)


def _pickled(path):
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _not_an_image(path):
    im, key = read_entry(path)
    image_cache.write_entry(path, im[..., 0].astype(np.float32), key)  # the right key on a grey float array


@pytest.mark.parametrize("damage", [_truncate, _garbage, _pickled, _not_an_image])
def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, log_lines, damage):
    first = bmp_cache(tmp_path)
    damage(Path(first.npy_files[2]))
    again = bmp_cache(tmp_path)
    warnings = warnings_about(log_lines, "--cache disk")
    assert len(warnings) == 1 and again.npy_files[2] in warnings[0] and "rebuilt" in warnings[0], log_lines
    assert np.array_equal(read_entry(again.npy_files[2])[0], decoded(again.im_files[2]))
    assert [np.array_equal(again.base_image(i), decoded(again.im_files[i])) for i in range(3)] == [True] * 3


def test_an_entry_written_before_keys_existed_is_rebuilt_quietly(tmp_path, log_lines):
    first = bmp_cache(tmp_path)
    np.save(first.npy_files[0], noise(27, 32, seed=7), allow_pickle=False)  # an image record and no key
    again = bmp_cache(tmp_path)
    assert not warnings_about(log_lines, "--cache disk")
    assert read_entry(again.npy_files[0])[1] == source_key(again.im_files[0])
    assert np.array_equal(again.base_image(0), decoded(again.im_files[0]))


def test_an_entry_damaged_during_the_run_is_read_around_with_one_warning(tmp_path, log_lines):
    cache = bmp_cache(tmp_path)
    _truncate(Path(cache.npy_files[0]))
    _garbage(Path(cache.npy_files[1]))
    assert [np.array_equal(cache.base_image(i), decoded(cache.im_files[i])) for i in range(3)] == [True] * 3
    warnings = warnings_about(log_lines, "--cache disk")
    assert len(warnings) == 1 and cache.npy_files[0] in warnings[0], log_lines


def test_a_disk_that_fills_while_the_cache_is_written_leaves_no_npy_and_no_temporary(tmp_path, monkeypatch,
                                                                                    log_lines):
    images = make_dataset(tmp_path, n=6)
    plain = LoadImagesAndLabels(str(images), img_size=64)
    real_open, creations, lock = os.open, itertools.count(), threading.Lock()

    def open_until_full(path, flags, *args, **kwargs):  # two files fit; the third and later find the disk full
        if flags & os.O_CREAT and Path(path).parent == images:
            with lock:
                if next(creations) >= 2:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_until_full)
    disk = LoadImagesAndLabels(str(images), img_size=64, cache_images="disk")
    monkeypatch.undo()
    warnings = warnings_about(log_lines, "--cache disk")
    assert len(warnings) == 1 and "No space left" in warnings[0] and str(images) in warnings[0], log_lines
    assert sorted(p.name for p in images.iterdir()) == [f"im{i}.jpg" for i in range(6)]
    for i in range(6):
        assert torch.equal(plain[i][0], disk[i][0])


def test_an_image_rewritten_while_it_is_cached_stops_with_one_line(tmp_path, monkeypatch):
    """The key and the pixels of an entry come from the same bytes, or nothing is written."""
    bmp_cache(tmp_path, mode=None)  # the images, no cache yet
    real_decode = ImageCache._decode

    def decode_then_rewrite(self, i):
        decoded_image = real_decode(self, i)
        if i == 1:
            cv2.imwrite(self.im_files[i], noise(40, 48, seed=77))  # another process writes the file meanwhile
        return decoded_image

    monkeypatch.setattr(ImageCache, "_decode", decode_then_rewrite)
    with pytest.raises(UserError, match=r"im1\.bmp: the image changed while it was being cached"):
        bmp_cache(tmp_path)
    assert not Path(tmp_path / "im1.32-linear.npy").exists()
