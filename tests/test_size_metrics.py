"""Size-band AP/AR: agreement with pycocotools' area ranges, band edges, empty bands, results.csv row."""

import contextlib
import io
import math

import numpy as np
import pytest
import torch

from utils.size_metrics import (COCO_BANDS, RESULT_COLUMNS, SIZE_BANDS, SizeBand, SizeBandStats, band_row,
                                format_band_table, match_bands)


def _random_scene(rng, n_images=40, size=400, nc=3):
    """Ground truth and jittered / missed / spurious predictions over 2-150 px boxes."""
    scenes = []
    for _ in range(n_images):
        n = int(rng.integers(0, 12))
        side = np.exp(rng.uniform(np.log(2), np.log(150), (n, 2)))
        xy = rng.uniform(0, size - 150, (n, 2))
        gt = np.column_stack((rng.integers(0, nc, n), xy, xy + side))
        dets = []
        for cls, x1, y1, x2, y2 in gt:
            if rng.random() < 0.15:  # missed
                continue
            w, h = x2 - x1, y2 - y1
            jitter = rng.normal(0, 0.12, 4) * (w, h, w, h)
            wrong_class = rng.random() < 0.1
            dets.append((x1 + jitter[0], y1 + jitter[1], x2 + jitter[2], y2 + jitter[3], rng.random(),
                         (cls + 1) % nc if wrong_class else cls))
        for _ in range(int(rng.integers(0, 5))):  # false positives of any size
            s = np.exp(rng.uniform(np.log(2), np.log(150), 2))
            x, y = rng.uniform(0, size - 150, 2)
            dets.append((x, y, x + s[0], y + s[1], rng.random(), rng.integers(0, nc)))
        scenes.append((torch.tensor(np.array(dets).reshape(-1, 6)), torch.tensor(gt.reshape(-1, 5))))
    return scenes


def _pycocotools_bands(scenes, bands, nc=3):
    """{band key: (mAP50-95, AR)} from COCOeval with areaRng set to ``bands``."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    images, annotations, results = [], [], []
    for image_id, (dets, gt) in enumerate(scenes, 1):
        images.append({"id": image_id, "width": 400, "height": 400})
        for cls, x1, y1, x2, y2 in gt.tolist():
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls),
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for x1, y1, x2, y2, score, cls in dets.tolist():
            results.append({"image_id": image_id, "category_id": int(cls), "bbox": [x1, y1, x2 - x1, y2 - y1],
                            "score": score})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations,
                  "categories": [{"id": i, "name": str(i)} for i in range(nc)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluator.params.areaRng = [[b.lo, b.hi] for b in bands]
        evaluator.params.areaRngLbl = [b.key for b in bands]
        evaluator.params.maxDets = [1000]
        evaluator.evaluate()
        evaluator.accumulate()
    out = {}
    for a, band in enumerate(bands):
        precision = evaluator.eval["precision"][:, :, :, a, -1]
        recall = evaluator.eval["recall"][:, :, a, -1]
        out[band.key] = (precision[precision > -1].mean() if (precision > -1).any() else math.nan,
                         recall[recall > -1].mean() if (recall > -1).any() else math.nan)
    return out


def _in_band(detections, labels, band):
    correct, ignored, in_band = match_bands(detections, labels, (band,))
    return correct[0], ignored[0], in_band[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_bands_agree_with_pycocotools(seed):
    pytest.importorskip("pycocotools")
    scenes = _random_scene(np.random.default_rng(seed))
    stats = SizeBandStats()
    for dets, gt in scenes:
        stats.add(dets, gt)
    ours = stats.compute()
    reference = _pycocotools_bands(scenes, SIZE_BANDS)
    checked = 0
    for band in SIZE_BANDS:
        ref_ap, ref_ar = reference[band.key]
        if math.isnan(ref_ap):
            assert ours[band.key]["instances"] == 0 and math.isnan(ours[band.key]["map"])
            continue
        checked += 1
        assert ours[band.key]["instances"] > 0
        assert abs(ours[band.key]["map"] - ref_ap) < 0.005, (band.key, ours[band.key]["map"], ref_ap)
        assert abs(ours[band.key]["ar"] - ref_ar) < 0.005, (band.key, ours[band.key]["ar"], ref_ar)
    assert checked >= 6  # the random scene covers (nearly) every band, so the comparison means something


def test_out_of_band_match_is_ignored_not_false_positive():
    small = SizeBand("s", "T", "s", 0, 100)
    labels = torch.tensor([[0, 0, 0, 8, 8], [0, 50, 50, 90, 90]], dtype=torch.float32)  # 64 px² and 1600 px²
    dets = torch.tensor([[50, 50, 90, 90, 0.9, 0], [0, 0, 8, 8, 0.8, 0], [200, 200, 260, 260, 0.7, 0]])
    correct, ignored, in_band = _in_band(dets, labels, small)
    assert in_band.tolist() == [True, False]
    assert correct[:, 0].tolist() == [False, True, False]
    # the big detection found the big (out-of-band) label: ignored; the unmatched big one is outside: ignored
    assert ignored[:, 0].tolist() == [True, False, True]


def test_band_edges_are_inclusive_like_pycocotools():
    tiny, very_tiny = SIZE_BANDS[4], SIZE_BANDS[3]
    labels = torch.tensor([[0, 0, 0, 8, 8]], dtype=torch.float32)  # area exactly 8² = 64
    assert _in_band(torch.zeros(0, 6), labels, tiny)[2].tolist() == [True]
    assert _in_band(torch.zeros(0, 6), labels, very_tiny)[2].tolist() == [True]


def test_empty_band_prints_dash_and_logs_nan():
    stats = SizeBandStats(COCO_BANDS)
    labels = torch.tensor([[0, 10, 10, 20, 20]], dtype=torch.float32)  # 100 px²: COCO small only
    stats.add(torch.tensor([[10, 10, 20, 20, 0.9, 0]]), labels)
    results = stats.compute()
    assert results["small"] == {"instances": 1, "map50": 1.0, "map": 1.0, "ar": 1.0}
    assert results["large"]["instances"] == 0 and math.isnan(results["large"]["map"])
    lines = format_band_table(results, COCO_BANDS)
    large_row = next(ln for ln in lines if "large" in ln)
    assert large_row.split()[-4:] == ["-", "-", "-", "-"] and " 0 " not in large_row


def test_band_row_matches_columns():
    stats = SizeBandStats()
    stats.add(torch.zeros(0, 6), torch.tensor([[1, 0, 0, 5, 5]], dtype=torch.float32))
    row = band_row(stats.compute())
    assert len(row) == len(RESULT_COLUMNS) == len(SIZE_BANDS)
    assert row[0] == 0.0  # COCO small has a label that was missed: AP 0, not NaN
    assert math.isnan(row[1])  # COCO medium is empty
    assert all(math.isnan(v) for v in band_row(None))
    assert "metrics/mAP50-95_small" in RESULT_COLUMNS and "metrics/mAP50-95_very_tiny" in RESULT_COLUMNS


def test_coco_summary_matches_pycocotools_and_honours_max_det():
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from utils.coco_eval import coco_summary

    scenes = _random_scene(np.random.default_rng(2), n_images=10)
    images = [{"id": i, "width": 400, "height": 400} for i in range(1, len(scenes) + 1)]
    gt_rows = [(i, *row) for i, (_, gt) in enumerate(scenes, 1) for row in gt.tolist()]
    annotations = [{"id": k + 1, "image_id": i, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1), "iscrowd": 0} for k, (i, c, x1, y1, x2, y2) in enumerate(gt_rows)]
    results = [{"image_id": i, "category_id": int(c), "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s}
               for i, (dets, _) in enumerate(scenes, 1) for x1, y1, x2, y2, s, c in dets.tolist()]
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations, "categories": [{"id": k} for k in range(3)]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    assert np.allclose(coco_summary(evaluator), evaluator.stats)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.params.maxDets = [1, 10, 300]
        evaluator.evaluate()
        evaluator.accumulate()
    assert coco_summary(evaluator)[0] > 0  # pycocotools' own first line would be -1 here


def test_band_covering_everything_is_val_matching():
    from utils.metrics import match_predictions

    everything = SizeBand("all", "T", "all", 0, 1e10)
    for dets, gt in _random_scene(np.random.default_rng(5), n_images=15):
        correct, ignored, in_band = _in_band(dets, gt, everything)
        assert np.array_equal(correct, match_predictions(dets, gt)) and not ignored.any() and in_band.all()
