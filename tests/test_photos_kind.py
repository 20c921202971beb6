"""The "photos" data kind: objects cut from scikit-image's bundled photographs, pasted onto others."""

from importlib.util import find_spec

import numpy as np
import pytest

from utils.dataset.synthetic import photos
from utils.dataset.synthetic.photos import NAMES, make_photo_image, make_photos
from utils.errors import UserError

needs_photos = pytest.mark.skipif(find_spec("skimage") is None, reason="needs scikit-image's bundled photos")


@needs_photos
def test_images_are_deterministic_with_object_sizes_in_range():
    first, labels = make_photo_image(np.random.default_rng([4, 0]), size=96, sides=(8, 16), objects=(3, 5))
    again, same = make_photo_image(np.random.default_rng([4, 0]), size=96, sides=(8, 16), objects=(3, 5))
    other, _ = make_photo_image(np.random.default_rng([4, 1]), size=96, sides=(8, 16), objects=(3, 5))
    assert first.shape == (96, 96, 3) and first.dtype == np.uint8
    assert np.array_equal(first, again) and np.array_equal(labels, same) and not np.array_equal(first, other)
    assert 3 <= len(labels) <= 5 and set(labels[:, 0].astype(int)) <= set(range(len(NAMES)))
    longer = np.maximum(labels[:, 3], labels[:, 4]) * 96
    assert longer.min() >= 7.5 and longer.max() <= 16.5
    assert (labels[:, 1:3] - labels[:, 3:5] / 2 >= 0).all() and (labels[:, 1:3] + labels[:, 3:5] / 2 <= 1).all()


@needs_photos
def test_a_labelled_box_holds_its_pasted_photo():
    """The box covers content that differs from the background drawn with the same stream."""
    im, labels = make_photo_image(np.random.default_rng([9, 0]), size=128, sides=(16, 24), objects=(2, 2))
    plain = photos.background(np.random.default_rng([9, 0]), 128)
    for _, x, y, w, h in labels:
        x0, y0, x1, y1 = (int(round(v * 128)) for v in (x - w / 2, y - h / 2, x + w / 2, y + h / 2))
        assert np.abs(im[y0:y1, x0:x1].astype(np.float32) - plain[y0:y1, x0:x1]).mean() > 10


@needs_photos
def test_every_class_region_lies_inside_its_photo():
    for name, region in photos.OBJECTS.values():
        h, w = photos.photo(name).shape[:2]
        x0, y0, x1, y1 = region
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, name


@needs_photos
def test_data_set_on_disk_and_refuses_to_overwrite(tmp_path):
    yaml_file = make_photos(tmp_path / "p", n_train=2, n_val=1, seed=1, size=64, sides=(8, 12))
    assert f"names: [{', '.join(NAMES)}]" in yaml_file.read_text()
    assert len(list((tmp_path / "p" / "images" / "train").glob("*.jpg"))) == 2
    with pytest.raises(FileExistsError):
        make_photos(tmp_path / "p", n_train=1, n_val=1)


def test_without_scikit_image_it_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(photos, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install scikit-image"):
        make_photos(tmp_path / "none", n_train=1, n_val=1)
    assert not (tmp_path / "none").exists()


@needs_photos
def test_every_photo_reads_as_opencv_decodes_it_without_a_libpng_warning(capfd):
    import cv2

    names = sorted({*photos.BACKGROUNDS, *photos.DISTRACTORS, *(file for file, _ in photos.OBJECTS.values())})
    photos.photo.cache_clear()
    ours = {name: photos.photo(name) for name in names}
    assert capfd.readouterr().err == ""  # page.png's colour profile made OpenCV's libpng warn once per process
    for name in names:
        assert np.array_equal(ours[name], cv2.imread(str(photos.photo_folder() / name), cv2.IMREAD_COLOR)), name
    assert any(name.endswith(".png") for name in names) and any(name.endswith(".jpg") for name in names)


@needs_photos
def test_an_unreadable_photo_is_one_clear_line(tmp_path, monkeypatch):
    (tmp_path / "grass.png").write_bytes(b"not a png")
    monkeypatch.setattr(photos, "photo_folder", lambda: tmp_path)
    photos.photo.cache_clear()
    with pytest.raises(UserError, match="grass.png: missing or unreadable"):
        photos.photo("grass.png")
    photos.photo.cache_clear()
