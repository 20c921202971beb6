"""detect.py --visualize (YOLOv5's flag): per-layer feature maps, the hooks, the pictures, the refusals."""

import cv2
import numpy as np
import pytest
import torch

import detect
import export
from models.yolo import Model
from tests.support.checkpoints import write_tiny_checkpoint
from utils.errors import UserError
from utils.feature_maps import COLUMNS, GAP, MAX_CHANNELS, MIN_TILE, feature_grid, recorded_layer_outputs


@pytest.fixture(scope="module")
def tiny_pt(tmp_path_factory, tiny_cfg):
    return write_tiny_checkpoint(tiny_cfg, tmp_path_factory.mktemp("fmaps") / "tiny.pt")


@pytest.fixture(scope="module")
def images(shapes_data):
    return sorted((shapes_data.parent / "shapes" / "images" / "val").glob("*.jpg"))[:2]


def test_the_first_pass_of_every_layer_is_recorded_and_the_hooks_go_away(tiny_cfg):
    model = Model(tiny_cfg, nc=2).eval()
    with recorded_layer_outputs(model.model) as outputs:
        model(torch.rand(2, 3, 64, 64))
        model(torch.rand(1, 3, 96, 96))  # a second pass (another TTA scale) is not recorded
    detect_index = len(model.model) - 1
    assert sorted(i for i, _ in outputs) == list(range(detect_index))  # Detect's output is a tuple, left out
    assert all(t.shape[0] == 2 and t.ndim == 4 for t in outputs.values())
    assert {name for _, name in outputs} >= {"Conv"}
    assert all(not layer._forward_hooks for layer in model.model)


def test_the_grid_puts_8_channels_a_row_scales_each_and_leaves_gaps_white():
    channels = np.stack([np.full((5, 5), k, np.float32) for k in range(3)] + [np.arange(25.).reshape(5, 5)] * 37)
    picture = feature_grid(channels[:MAX_CHANNELS])
    tile = 5 * -(-MIN_TILE // 5)  # 5 px maps enlarged to at least MIN_TILE
    assert picture.shape == (4 * (tile + GAP) - GAP, COLUMNS * (tile + GAP) - GAP, 3) and picture.dtype == np.uint8
    assert (picture[:, tile:tile + GAP] == 255).all()  # the gap after the first column
    dark = cv2.applyColorMap(np.zeros((1, 1), np.uint8), cv2.COLORMAP_VIRIDIS)[0, 0]
    assert (picture[:tile, :tile] == dark).all()  # a constant channel has no range: the colormap's 0
    ramp = picture[tile + GAP:2 * tile + GAP, :tile]
    assert (ramp[0, 0] != ramp[-1, -1]).any()  # scaled to its own range
    small = feature_grid(channels[:3])
    assert small.shape == (tile, 3 * (tile + GAP) - GAP, 3)


def test_detect_writes_each_images_maps_in_its_own_folder(tiny_pt, images, tmp_path):
    batched = detect.run(tiny_pt, images[0].parent, imgsz=64, project=tmp_path, name="both", visualize=True,
                         batch_size=2, nosave=True)
    one = detect.run(tiny_pt, images[1], imgsz=64, project=tmp_path, name="one", visualize=True, nosave=True)
    n_val = len(list(images[0].parent.glob("*.jpg")))
    folders = sorted(p for p in batched.iterdir() if p.is_dir())
    assert [p.name for p in folders] == sorted(p.stem for p in images[0].parent.glob("*.jpg")) and n_val >= 2
    pngs = sorted(p.name for p in (batched / images[1].stem).glob("*.png"))
    assert pngs == sorted(p.name for p in (one / images[1].stem).glob("*.png")) and "stage0_Conv_features.png" in pngs
    for name in pngs:  # the second image of a batch of two: its own maps, as when it runs alone
        a = np.load(batched / images[1].stem / name.replace(".png", ".npy"))
        b = np.load(one / images[1].stem / name.replace(".png", ".npy"))
        assert a.shape == b.shape and a.shape[0] <= MAX_CHANNELS and np.allclose(a, b, atol=1e-4)
    first, second = (np.load(batched / p.stem / "stage0_Conv_features.npy") for p in images)
    assert not np.array_equal(first, second)


@pytest.mark.slow
def test_visualize_refuses_what_shows_no_layers_before_any_folder(tiny_pt, images, tmp_path):
    onnx_file = export.run(tiny_pt, imgsz=[64], include=["onnx"])[0]
    cases = [(dict(weights=onnx_file), r"^--visualize needs a \.pt checkpoint: the layers of an exported model \(onnx\) are not"),
             (dict(weights=[tiny_pt, tiny_pt]), r"^--visualize draws one model's layers: give one checkpoint"),
             (dict(weights=tiny_pt, slice_size=64), r"^--visualize does not apply to --slice 64")]
    for kwargs, message in cases:
        with pytest.raises(UserError, match=message):
            detect.run(source=images[0], imgsz=64, project=tmp_path, name="refused", visualize=True, **kwargs)
    assert not (tmp_path / "refused").exists()
