"""Size-band pictures: results.png's band panels, the per-band PR plot, the data set size histogram."""

import math

import cv2
import numpy as np
import pandas as pd
import pytest
import torch

from utils.plots import plot_band_pr, plot_results, results_panels
from utils.size_metrics import COCO_BANDS, RESULT_COLUMNS, SIZE_BANDS, SizeBandStats
from utils.training.results_log import COLUMNS


def results_frame(band_values: dict) -> pd.DataFrame:
    """Three epochs of results.csv; band columns NaN unless given in ``band_values`` {band key: value}."""
    data = {name: [0.1, 0.2, 0.3] for name in COLUMNS}
    data["epoch"] = [0, 1, 2]
    for column, band in zip(RESULT_COLUMNS, SIZE_BANDS):
        data[column] = [band_values.get(band.key, math.nan)] * 3
    return pd.DataFrame(data)


def test_band_columns_share_one_panel_per_family_and_empty_bands_are_left_out():
    panels = results_panels(results_frame({"small": 0.5, "tiny": 0.25, "very_tiny": 0.125}))
    titles = [title for title, _ in panels]
    assert titles[:len(COLUMNS) - len(RESULT_COLUMNS) - 1] == list(COLUMNS[1:len(COLUMNS) - len(RESULT_COLUMNS)])
    assert titles[-2:] == ["mAP50-95 by object size (COCO, px)", "mAP50-95 by object size (AI-TOD, px)"]
    assert panels[-2][1] == [("small <32", "metrics/mAP50-95_small")]
    assert panels[-1][1] == [("very tiny <8", "metrics/mAP50-95_very_tiny"), ("tiny 8-16", "metrics/mAP50-95_tiny")]


@pytest.mark.slow
def test_without_band_values_results_png_has_no_band_panel(tmp_path):
    frame = results_frame({})
    assert not any("by object size" in title for title, _ in results_panels(frame))
    frame.to_csv(tmp_path / "results.csv", index=False)
    plot_results(tmp_path / "results.csv")
    assert cv2.imread(str(tmp_path / "results.png")) is not None


def test_band_pr_curve_averages_to_the_band_map50_and_is_drawn(tmp_path):
    stats = SizeBandStats(COCO_BANDS)
    labels = torch.tensor([[0, 10, 10, 20, 20], [1, 0, 0, 50, 50], [0, 60, 60, 110, 110]], dtype=torch.float32)
    detections = torch.tensor([[10, 10, 20, 20, 0.9, 0], [0, 0, 50, 50, 0.8, 0], [60, 60, 110, 110, 0.7, 0],
                               [200, 200, 240, 240, 0.95, 1]])  # a wrong class and a spurious box
    stats.add(detections, labels)
    curves, results = stats.pr_curves(), stats.compute()
    assert curves["large"] is None and math.isnan(results["large"]["map50"])
    for key in ("small", "medium"):
        assert curves[key].shape == (101,) and curves[key].mean() == results[key]["map50"]
    assert results["medium"]["map50"] < 1.0  # the class-1 medium label was missed: not a trivially perfect curve
    plot_band_pr(curves, tmp_path / "PR_curve_bands.png", COCO_BANDS)
    image = cv2.imread(str(tmp_path / "PR_curve_bands.png"))
    assert image is not None and image.shape[1] > 500


def test_dataset_figure_has_size_bands_objects_per_image_and_classes():
    from utils.dataset.dataset_stats import report_figure

    split = {"sizes": np.array([4.0, 12.0, 12.0, 40.0]), "per_image": np.array([0, 1, 3]),
             "classes": np.array([0, 1, 1, 0])}
    fig = report_figure({"names": ["a", "b"], "imgsz": 640, "splits": {"train": split}})
    sizes, per_image, classes = fig.axes
    assert sorted(line.get_xdata()[0] for line in sizes.get_lines()) == [8, 16, 32]  # the band edges
    assert {t.get_text() for t in sizes.texts} == {"very tiny <8", "tiny 8-16", "small 16-32", "medium >=32"}
    assert per_image.get_title() == "train objects per image"
    assert [p.get_height() for p in per_image.patches] == [1, 1, 0, 1]  # images with 0, 1, 2, 3 objects
    assert [p.get_width() for p in classes.patches] == [2, 2]


@pytest.mark.parametrize("size", [(18, 4), (15, 3.6), (9, 3)])  # the default, the docs picture's, a narrow one
def test_dataset_figure_band_labels_do_not_overlap_each_other_or_the_bars(size):
    from utils.dataset.dataset_stats import report_figure

    split = {"sizes": np.array([3.0] * 5 + [12.0] * 40 + [20.0] * 300 + [31.0] * 240 + [40.0] * 9),
             "per_image": np.array([2, 3]), "classes": np.array([0, 1])}
    fig = report_figure({"names": ["a", "b"], "imgsz": 256, "splits": {"train": split}})
    fig.set_size_inches(*size)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    sizes = fig.axes[0]
    labels = [t.get_window_extent(renderer) for t in sizes.texts]
    assert len(labels) == 4
    for i, a in enumerate(labels):
        assert not any(a.overlaps(b) for b in labels[i + 1:]), sizes.texts[i].get_text()
        assert not any(a.overlaps(bar.get_window_extent(renderer)) for bar in sizes.patches if bar.get_height())


@pytest.mark.slow
def test_val_plot_bands_flag_writes_the_band_pr_plot(shapes_data, tiny_cfg, tmp_path):
    import val
    from tests.support.checkpoints import confident_model, write_checkpoint

    weights = write_checkpoint(confident_model(tiny_cfg), tmp_path / "tiny.pt")
    common = ["--weights", str(weights), "--data", str(shapes_data), "--imgsz", "64", "--device", "cpu",
              "--workers", "0", "--project", str(tmp_path)]
    assert val.parse_opt(common).plot_bands is False  # opt-in
    val.main(val.parse_opt([*common, "--name", "bands", "--plot-bands"]))
    image = cv2.imread(str(tmp_path / "bands" / "PR_curve_bands.png"))
    assert image is not None and image.shape[1] > 1000  # one panel per band family, side by side
