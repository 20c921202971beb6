"""Sliced inference: tile grid, border tiles, cut objects counted once, merging, determinism, flags."""

import argparse

import cv2
import numpy as np
import pytest
import torch

from utils.errors import UserError
from utils.slicing import (NMM_CONF_FLOOR, SlicedPredictor, add_slice_arguments, check_slice_options, greedy_nmm,
                           merge_detections, shared_band_filter, sliced_predictor, tile_grid, to_letterbox)
from utils.ops import scale_boxes


def blob_detector(x):
    """Stand-in model + NMS: every bright connected blob of a (b, 3, h, w) batch is one detection.

    Class 0 for white blobs, 1 for red ones; confidence grows with the visible area, so a cut
    (partial) object scores lower than the whole one.
    """
    out = []
    for im in x.float().cpu().numpy():
        rows = []
        for cls, mask in enumerate(((im > 0.7).all(0), (im[0] > 0.7) & (im[1] < 0.3))):
            n, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
            for bx, by, bw, bh, area in stats[1:]:
                rows.append((bx, by, bx + bw, by + bh, min(0.99, 0.3 + area / 2000), cls))
        out.append(torch.tensor(rows, dtype=torch.float32).reshape(-1, 6))
    return out


def _scene(h=700, w=1000, seed=0, n=40):
    """BGR image with non-touching white/red squares of 6-40 px; returns (image, boxes (n, 5) cls/xyxy)."""
    rng = np.random.default_rng(seed)
    im = np.zeros((h, w, 3), np.uint8)
    boxes = []
    while len(boxes) < n:
        s = int(rng.integers(6, 41))
        x, y = int(rng.integers(0, w - s)), int(rng.integers(0, h - s))
        if any(x < b[3] + 3 and b[1] < x + s + 3 and y < b[4] + 3 and b[2] < y + s + 3 for b in boxes):
            continue
        cls = int(rng.integers(0, 2))
        im[y:y + s, x:x + s] = (255, 255, 255) if cls == 0 else (0, 0, 255)
        boxes.append((cls, x, y, x + s, y + s))
    return im, np.array(boxes, dtype=np.float32)


def _count_matches(det, boxes):
    """Number of detections matching each ground-truth box (same class, corners within 1 px)."""
    d = det.numpy()
    return [int(((d[:, 5] == c) & (np.abs(d[:, :4] - b).max(1) <= 1)).sum()) for c, *b in boxes]


def test_tile_grid_covers_image_and_keeps_border_tiles_inside():
    tiles = tile_grid(700, 1000, 256, 0.2)
    assert (tiles[:, 2] - tiles[:, 0] == 256).all() and (tiles[:, 3] - tiles[:, 1] == 256).all()
    assert tiles[:, :2].min() == 0 and tiles[:, 2].max() == 1000 and tiles[:, 3].max() == 700
    covered = np.zeros((700, 1000), bool)
    for x1, y1, x2, y2 in tiles:
        covered[y1:y2, x1:x2] = True
    assert covered.all()
    xs = np.unique(tiles[:, 0])
    assert (np.diff(xs) <= 256 - 0.2 * 256 + 1).all()  # every neighbour overlaps at least 20 %


def test_tile_grid_small_image_is_one_tile():
    assert tile_grid(100, 150, 256, 0.2).tolist() == [[0, 0, 150, 100]]
    assert tile_grid(256, 256, 256, 0.5).tolist() == [[0, 0, 256, 256]]


@pytest.mark.parametrize("merge", ["nms", "nmm"])
@pytest.mark.parametrize("full_pass", [0, 1000])  # 1000: the full pass sees the image unscaled
def test_every_object_found_once_even_when_cut_by_a_tile_edge(merge, full_pass):
    im, boxes = _scene()
    tiles = tile_grid(*im.shape[:2], 256, 0.25)
    inner_edges = set(tiles[:, 0]) | set(tiles[:, 2])
    cut = [b for b in boxes if any(b[1] < e < b[3] for e in inner_edges - {0, im.shape[1]})]
    assert len(cut) >= 3  # the scene really has objects straddling tile edges
    predictor = SlicedPredictor(blob_detector, 256, overlap=0.25, full_pass_size=full_pass, merge=merge,
                                iou_thres=0.45, batch_size=5)
    det = predictor(im)
    assert _count_matches(det, boxes) == [1] * len(boxes)
    assert len(det) == len(boxes)  # no partial leftovers either
    assert predictor.tiles_seen == len(tiles)


def test_cut_box_kept_by_exactly_one_of_two_neighbours():
    tiles = np.array([[0, 0, 100, 100], [80, 0, 180, 100]])
    whole = torch.tensor([[85.0, 10, 95, 20]])  # inside the shared band [80, 100]
    assert shared_band_filter(whole, tiles[0], tiles).item() + shared_band_filter(whole, tiles[1], tiles).item() >= 1
    cut_left_view = torch.tensor([[90.0, 10, 100, 20]])  # object 90-110 seen by tile 0: cut at x=100
    cut_right_view = torch.tensor([[90.0, 10, 110, 20]])  # the same object whole in tile 1
    assert not shared_band_filter(cut_left_view, tiles[0], tiles).item()
    assert shared_band_filter(cut_right_view, tiles[1], tiles).item()
    big = torch.tensor([[40.0, 10, 100, 20]])  # starts before the band: no neighbour sees it whole, kept
    assert shared_band_filter(big, tiles[0], tiles).item()


def test_sliced_inference_is_deterministic_and_batch_independent():
    im, _ = _scene(seed=3)
    runs = [SlicedPredictor(blob_detector, 256, overlap=0.2, full_pass_size=640, batch_size=b)(im)
            for b in (1, 4, 4, 64)]
    for other in runs[1:]:
        assert torch.equal(runs[0], other)


def test_greedy_nmm_merges_by_smaller_box_within_class():
    det = torch.tensor([[0, 0, 20, 20, 0.9, 0],  # whole object
                        [10, 0, 26, 20, 0.5, 0],  # overlaps half of itself with it: merged into a union
                        [0, 0, 10, 10, 0.8, 1],  # other class, contained: kept
                        [50, 50, 60, 60, 0.7, 0]])
    out = greedy_nmm(det)
    assert torch.allclose(out, torch.tensor([[0, 0, 26, 20, 0.9, 0], [0, 0, 10, 10, 0.8, 1], [50, 50, 60, 60, 0.7, 0]]))
    assert len(greedy_nmm(det, agnostic=True)) == 2
    nms = merge_detections(det, "nms", 0.45)
    assert len(nms) == 4  # IoU of the first two is 0.4: NMS at 0.45 keeps both


def chain_forward(x):
    """Raw model output (b, 12, 6): a row of 10x10 class-0 boxes 4 px apart at confidence 0.05. Neighbours
    overlap by 0.6 of the smaller box (NMM merges them) at IoU 0.43 (NMS at 0.45 keeps them)."""
    xs = torch.arange(12, dtype=torch.float32) * 4 + 10
    rows = torch.stack([xs, torch.full_like(xs, 20), *torch.full((2, 12), 10.0), torch.full_like(xs, 0.05),
                        torch.ones_like(xs)], 1)
    return rows.expand(len(x), -1, -1).clone()


def test_nmm_below_the_confidence_floor_merges_by_nms_with_one_warning(log_lines):
    im = np.zeros((64, 64, 3), np.uint8)
    options = dict(slice_size=64, no_full_pass=True, imgsz=64, stride=32)
    low = sliced_predictor(chain_forward, slice_merge="nmm", conf_thres=0.001, **options)
    assert low.merge == "nms"
    assert len(log_lines) == 1 and "--slice-merge nmm" in log_lines[0] and "--conf-thres 0.001" in log_lines[0]
    assert f"{NMM_CONF_FLOOR}" in log_lines[0] and "NMS" in log_lines[0]
    det = low(im)
    assert torch.equal(det, sliced_predictor(chain_forward, slice_merge="nms", conf_thres=0.001, **options)(im))
    assert len(det) == 12 and float((det[:, 2] - det[:, 0]).max()) == 10  # no chained union boxes
    floor = sliced_predictor(chain_forward, slice_merge="nmm", conf_thres=NMM_CONF_FLOOR, **options)
    assert floor.merge == "nmm" and len(log_lines) == 1  # at the floor NMM runs as asked, silently


def test_to_letterbox_inverts_scale_boxes():
    boxes = torch.tensor([[10.0, 20, 110, 220]])
    ratio_pad = ((0.5, 0.5), (16.0, 4.0))
    back = scale_boxes((320, 320), to_letterbox(boxes, ratio_pad), (600, 600), ratio_pad)
    assert torch.allclose(back, boxes)


def test_slice_flags_and_bad_values():
    parser = argparse.ArgumentParser()
    add_slice_arguments(parser)
    opt = parser.parse_args(["--slice", "600", "--slice-overlap", "0.3", "--no-full-pass", "--slice-merge", "nmm"])
    assert (opt.slice_size, opt.slice_overlap, opt.no_full_pass, opt.slice_merge) == (600, 0.3, True, "nmm")
    assert check_slice_options(600, 0.3, 8, 32) == 608
    for args in ((-1, 0.2, 8), (640, 0.95, 8), (640, -0.1, 8), (640, 0.2, 0)):
        with pytest.raises(UserError, match="--slice"):
            check_slice_options(*args, 32)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory, tiny_cfg):
    """A tiny untrained 4-class checkpoint whose objectness is raised so that it always detects something."""
    from models.yolo import Model
    from utils.training.checkpoints import save_checkpoint

    torch.manual_seed(0)
    model = Model(tiny_cfg, nc=4)
    with torch.no_grad():
        model.model[-1].m[-1].weight.normal_(0, 0.3)  # image-dependent confidences, few exact ties
        bias = model.model[-1].m[-1].bias.view(model.model[-1].na, -1)  # coarsest level: few candidates
        bias[:, 4] += 6.0
        for k in range(model.model[-1].na):
            bias[k, 5 + k] += 6.0
    path = tmp_path_factory.mktemp("w") / "tiny.pt"
    save_checkpoint({"model_cfg": model.yaml, "nc": 4, "names": ["circle", "square", "triangle", "cross"],
                     "model": model.state_dict(), "ema": None, "epoch": 0, "best_fitness": 0.0}, path)
    return path


def label_rows(folder) -> dict:
    """{file name: (n, 6) array of its label rows, sorted by class then box}."""
    rows = {}
    for f in folder.glob("*.txt"):
        values = np.loadtxt(f, ndmin=2).reshape(-1, 6)
        rows[f.name] = values[np.lexsort(values[:, ::-1].T)] if len(values) else values
    return rows


@pytest.mark.slow
def test_val_one_whole_image_tile_equals_unsliced_val(tiny_weights, shapes_data, tmp_path):
    import val
    from utils.dataset.data_config import check_dataset
    from utils.dataloaders import create_dataloader

    # square 256 px batches without rect padding: the unsliced pass sees exactly the pixels of the one tile
    loader = create_dataloader(check_dataset(shapes_data)["val"], 256, 8, 32, pad=0.0, rect=False, workers=0)[0]
    common = dict(weights=str(tiny_weights), batch_size=8, imgsz=256, device="cpu", workers=0, plots=False,
                  dataloader=loader,
                  project=tmp_path, conf_thres=0.5, max_det=1000, save_txt=True, save_conf=True, size_bands=True)
    plain = val.run(shapes_data, name="plain", **common)
    sliced = val.run(shapes_data, name="sliced", slice_size=256, no_full_pass=True, **common)
    plain_txt, sliced_txt = (label_rows(tmp_path / name / "labels") for name in ("plain", "sliced"))
    assert sum(len(t) for t in plain_txt.values()) > 8  # there are predictions to compare
    assert plain_txt.keys() == sliced_txt.keys()
    for name, rows in plain_txt.items():  # the tile path maps boxes back with other float steps: 1e-5 px-scale
        assert rows.shape == sliced_txt[name].shape and np.allclose(rows, sliced_txt[name], atol=1e-5), name
    assert np.allclose(plain.metrics[:4], sliced.metrics[:4], rtol=1e-2)  # a box on an IoU threshold may flip
    assert [plain.bands[k]["instances"] for k in plain.bands] == [sliced.bands[k]["instances"] for k in sliced.bands]


@pytest.mark.slow
def test_val_sliced_with_full_pass_runs_and_reports_bands(tiny_weights, shapes_data, tmp_path, log_lines):
    import val

    result = val.run(shapes_data, weights=str(tiny_weights), batch_size=8, imgsz=128, device="cpu", workers=0,
                     plots=False, project=tmp_path, slice_size=96, conf_thres=0.2, slice_overlap=0.25,
                     slice_merge="nmm")
    results, maps, bands = result.metrics, result.maps, result.bands
    assert all(np.isfinite(results[:4])) and maps.shape == (4,)
    label_files = (shapes_data.parent / "shapes" / "labels" / "val").glob("*.txt")
    n_labels = sum(len(f.read_text().splitlines()) for f in label_files)
    assert sum(bands[k]["instances"] for k in ("small", "medium", "large")) == n_labels
    assert any("AI-TOD size bands" in line for line in log_lines)


@pytest.mark.slow
def test_detect_sliced_writes_same_boxes_twice(tiny_weights, tmp_path):
    import detect

    rng = np.random.default_rng(0)
    source = tmp_path / "big.png"
    cv2.imwrite(str(source), rng.integers(0, 255, (300, 420, 3), dtype=np.uint8))
    outs = [detect.run(str(tiny_weights), str(source), imgsz=(128, 128), device="cpu", project=tmp_path,
                       name=f"run{i}", save_txt=True, save_conf=True, nosave=True, slice_size=128,
                       slice_overlap=0.2, slice_merge=merge)
            for i, merge in enumerate(("nms", "nms", "nmm"))]
    texts = [(o / "labels" / "big.txt").read_text() for o in outs]
    assert texts[0] and texts[0] == texts[1]
    assert texts[2]
