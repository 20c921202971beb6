"""Hyperparameter evolution: deterministic bounded mutation, evolve.csv round trip, best hyp and plot."""

import numpy as np
import pytest
import yaml

from utils.errors import UserError
from utils.training.evolve import (
    META,
    RESULT_KEYS,
    append_evolve_row,
    best_hyp,
    evolve_fitness,
    generation_rng,
    mutate_hyp,
    plot_evolve,
    read_evolve_csv,
)

BASE_HYP = {
    "lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "warmup_epochs": 3.0,
    "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 0.05, "cls": 0.5, "cls_pw": 1.0, "obj": 1.0,
    "obj_pw": 1.0, "iou_t": 0.2, "anchor_t": 4.0, "fl_gamma": 0.0, "hsv_h": 0.015, "hsv_s": 0.7,
    "hsv_v": 0.4, "degrees": 0.0, "translate": 0.1, "scale": 0.5, "shear": 0.0, "perspective": 0.0,
    "flipud": 0.0, "fliplr": 0.5, "mosaic": 1.0, "mixup": 0.0, "copy_paste": 0.0,
}


def results(map50, map50_95):
    """Validation results in RESULT_KEYS order (P, R, mAP50, mAP50-95, three val losses)."""
    return [0.5, 0.4, map50, map50_95, 0.05, 0.02, 0.01]


def write_generations(path, hyps_and_maps):
    """An evolve.csv with one row per (hyp, mAP50, mAP50-95)."""
    for hyp, map50, map50_95 in hyps_and_maps:
        append_evolve_row(path, RESULT_KEYS, results(map50, map50_95), hyp)


def test_meta_covers_yolov5_keys_with_sane_bounds():
    assert set(META) == set(BASE_HYP)
    for key, (scale, lower, upper) in META.items():
        assert scale >= 0 and lower < upper, key
        assert lower <= BASE_HYP[key] <= upper, key


def test_first_generation_is_only_clipped(tmp_path):
    hyp = dict(BASE_HYP, lr0=5.0, momentum=0.1, custom="kept")
    new = mutate_hyp(hyp, tmp_path / "evolve.csv", np.random.default_rng(0))
    assert new["lr0"] == META["lr0"][2] and new["momentum"] == META["momentum"][1]
    assert new["custom"] == "kept" and new["box"] == BASE_HYP["box"]
    assert hyp["lr0"] == 5.0  # the caller's dict is not modified


def test_mutation_is_deterministic_and_bounded(tmp_path):
    path = tmp_path / "evolve.csv"
    write_generations(path, [(BASE_HYP, 0.5, 0.3), (dict(BASE_HYP, lr0=0.02), 0.6, 0.35)])
    first = mutate_hyp(BASE_HYP, path, np.random.default_rng(11))
    assert first == mutate_hyp(BASE_HYP, path, np.random.default_rng(11))
    assert first != mutate_hyp(BASE_HYP, path, np.random.default_rng(12))
    assert first != {k: round(v, 5) for k, v in BASE_HYP.items()}
    for seed in range(60):
        hyp = mutate_hyp(BASE_HYP, path, np.random.default_rng(seed))
        for key, (scale, lower, upper) in META.items():
            assert lower <= hyp[key] <= upper, key
            assert hyp[key] == round(hyp[key], 5)
            if scale == 0:
                assert hyp[key] == BASE_HYP[key]  # iou_t, fl_gamma, perspective, fliplr never move


def test_parent_comes_from_the_fittest_five(tmp_path):
    path = tmp_path / "evolve.csv"
    generations = [(dict(BASE_HYP, lr0=0.001), 0.5, 0.3 + 0.01 * i) for i in range(5)]
    generations.append((dict(BASE_HYP, lr0=0.09), 0.1, 0.05))  # the worst one: never a parent
    write_generations(path, generations)
    for seed in range(40):
        for parent in ("single", "weighted"):
            lr0 = mutate_hyp(BASE_HYP, path, np.random.default_rng(seed), parent=parent)["lr0"]
            assert 0.0003 - 1e-9 <= lr0 <= 0.003 + 1e-9  # 0.001 times a factor in [0.3, 3]
    with pytest.raises(UserError, match="parent"):
        mutate_hyp(BASE_HYP, path, np.random.default_rng(0), parent="best")


def test_csv_round_trip_best_hyp_and_yaml(tmp_path):
    path = tmp_path / "evolve.csv"
    better = dict(BASE_HYP, lr0=0.0123, mosaic=0.75)
    write_generations(path, [(BASE_HYP, 0.5, 0.3), (better, 0.55, 0.4), (BASE_HYP, 0.9, 0.1)])
    names, rows = read_evolve_csv(path)
    assert names == list(RESULT_KEYS) + list(BASE_HYP)
    assert rows.shape == (3, len(RESULT_KEYS) + len(BASE_HYP))
    np.testing.assert_allclose(evolve_fitness(rows[:, 2], rows[:, 3]), [0.32, 0.415, 0.18])
    best = best_hyp(path)
    assert best == better
    saved = yaml.safe_load((tmp_path / "hyp_evolve.yaml").read_text())
    assert saved == better
    assert best_hyp(path, tmp_path / "elsewhere.yaml") == better
    assert yaml.safe_load((tmp_path / "elsewhere.yaml").read_text()) == better


def test_continuing_run_appends_and_checks_columns(tmp_path):
    path = tmp_path / "evolve.csv"
    write_generations(path, [(BASE_HYP, 0.5, 0.3)])
    assert not np.array_equal(generation_rng(0, path).random(3), generation_rng(0, tmp_path / "none.csv").random(3))
    np.testing.assert_array_equal(generation_rng(0, path).random(3), generation_rng(0, path).random(3))
    write_generations(path, [(BASE_HYP, 0.6, 0.3)])
    assert read_evolve_csv(path)[1].shape[0] == 2
    with pytest.raises(UserError, match="columns differ"):
        append_evolve_row(path, RESULT_KEYS, results(0.1, 0.1), {"lr0": 0.01})
    path.write_text(path.read_text() + "1,2,oops\n")
    with pytest.raises(UserError, match="evolve.csv:4"):
        read_evolve_csv(path)


@pytest.mark.slow
def test_plot_evolve_writes_png(tmp_path):
    path = tmp_path / "evolve.csv"
    few = [({"lr0": 0.01 + 0.001 * i, "mosaic": 1.0 - 0.1 * i, "scale": 0.5}, 0.5, 0.3 + 0.01 * i) for i in range(4)]
    write_generations(path, few)  # three hyperparameters keep the figure (and the test) small
    out = plot_evolve(path)
    assert out == tmp_path / "evolve.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000
