"""Hyperparameter evolution (``--evolve``): YOLOv5's mutation search and its ``evolve.csv`` record.

Each generation trains once with hyperparameters mutated from a good earlier generation and
appends one row to ``evolve.csv``: the validation results, then the hyperparameters. Result
columns are named with a group prefix (``metrics/...``, ``val/...``) as in ``results.csv``;
hyperparameter names never contain ``/``, which is how the two kinds of column are told apart.
Fitness is ``0.1 * mAP50 + 0.9 * mAP50-95``.
"""

import csv
import io
import math
from copy import deepcopy
from pathlib import Path

import numpy as np
import yaml

from utils.errors import UserError
from utils.files import atomic_write_bytes
from utils.logging import LOGGER, colorstr
from utils.tracking import evolution_run

PREFIX = colorstr("evolve: ")

# key: (mutation scale (0 = never mutated), lower bound, upper bound), YOLOv5's table
META = {
    "lr0": (1, 1e-5, 1e-1),  # initial learning rate
    "lrf": (1, 0.01, 1.0),  # final learning rate as a fraction of lr0
    "momentum": (0.3, 0.6, 0.98),
    "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0),
    "warmup_momentum": (1, 0.0, 0.95),
    "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2),  # loss gains
    "cls": (1, 0.2, 4.0),
    "cls_pw": (1, 0.5, 2.0),
    "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0),
    "iou_t": (0, 0.1, 0.7),
    "anchor_t": (1, 2.0, 8.0),
    "fl_gamma": (0, 0.0, 2.0),
    "hsv_h": (1, 0.0, 0.1),  # augmentation
    "hsv_s": (1, 0.0, 0.9),
    "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0),
    "translate": (1, 0.0, 0.9),
    "scale": (1, 0.0, 0.9),
    "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001),
    "flipud": (1, 0.0, 1.0),
    "fliplr": (0, 0.0, 1.0),
    "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0),
    "copy_paste": (1, 0.0, 1.0),
}

MAP50_KEY = "metrics/mAP_0.5"
MAP50_95_KEY = "metrics/mAP_0.5:0.95"
RESULT_KEYS = ("metrics/precision", "metrics/recall", MAP50_KEY, MAP50_95_KEY,
               "val/box_loss", "val/obj_loss", "val/cls_loss")
MUTATION_PROB, MUTATION_SIGMA = 0.8, 0.2
TOP_N = 5
DECIMALS = 5


def evolve_fitness(map50, map50_95):
    """Evolution fitness: 0.1 * mAP50 + 0.9 * mAP50-95 (scalars or arrays)."""
    return 0.1 * np.asarray(map50, dtype=np.float64) + 0.9 * np.asarray(map50_95, dtype=np.float64)


def read_evolve_csv(evolve_csv) -> tuple[list[str], np.ndarray]:
    """Column names and the ``(generations, columns)`` values of ``evolve_csv`` (empty if it does not exist)."""
    path = Path(evolve_csv)
    if not path.is_file():
        return [], np.zeros((0, 0))
    with open(path, newline="") as f:
        lines = [row for row in csv.reader(f) if row]
    if not lines:
        return [], np.zeros((0, 0))
    names = [name.strip() for name in lines[0]]
    rows = []
    for number, row in enumerate(lines[1:], start=2):
        if len(row) != len(names):
            raise UserError(f"{path}:{number}: {len(row)} values for {len(names)} columns; fix or remove the line")
        try:
            rows.append([float(value) for value in row])
        except ValueError:
            raise UserError(f"{path}:{number}: a value is not a number; fix or remove the line") from None
    return names, np.array(rows, dtype=np.float64).reshape(len(rows), len(names))


def _fitness_of_rows(path, names: list[str], rows: np.ndarray) -> np.ndarray:
    """Fitness of every generation in an evolve.csv, from its mAP columns."""
    missing = [key for key in (MAP50_KEY, MAP50_95_KEY) if key not in names]
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r}; "
                        "it is not an evolve.csv written by this project or YOLOv5")
    return evolve_fitness(rows[:, names.index(MAP50_KEY)], rows[:, names.index(MAP50_95_KEY)])


def append_evolve_row(evolve_csv, keys, results, hyp: dict) -> None:
    """Append one generation (``results`` under column names ``keys``, then ``hyp``) to ``evolve_csv``.

    The header is written with the first row; a later row must have the same columns. The file is
    rewritten atomically so an interrupted run never leaves a half-written line.
    """
    keys, results = list(keys), list(results)
    if len(keys) != len(results):
        raise ValueError(f"{len(keys)} result names for {len(results)} results")
    if any("/" not in key for key in keys) or any("/" in key for key in hyp):
        raise ValueError("result names need a 'group/' prefix and hyperparameter names must not contain '/'")
    if MAP50_KEY not in keys or MAP50_95_KEY not in keys:
        raise ValueError(f"results must include {MAP50_KEY!r} and {MAP50_95_KEY!r} for the fitness")
    path = Path(evolve_csv)
    header = keys + list(hyp)
    names, _ = read_evolve_csv(path)
    if names and names != header:
        raise UserError(f"{path}: its columns differ from this run's hyperparameters; "
                        "use another --name or remove the file")
    text = path.read_text() if names else ",".join(header) + "\n"
    if not text.endswith("\n"):
        text += "\n"
    text += ",".join(repr(float(v)) for v in results + list(hyp.values())) + "\n"
    atomic_write_bytes(path, text.encode())


def generation_rng(seed: int, evolve_csv) -> np.random.Generator:
    """Random generator for the next generation, from ``seed`` and how many generations the csv holds.

    Keying on the generation number makes a run continued from an existing evolve.csv draw the
    same mutations as one that was never interrupted.
    """
    _, rows = read_evolve_csv(evolve_csv)
    return np.random.default_rng([seed % 2**64, len(rows)])


def mutate_hyp(hyp: dict, evolve_csv, rng: np.random.Generator, parent: str = "single") -> dict:
    """Hyperparameters for the next generation: a mutated parent from ``evolve_csv``, clipped to META.

    The parent is one of the ``TOP_N`` fittest generations chosen with probability rising with
    fitness (``parent='single'``), or their fitness-weighted mean (``'weighted'``). Each mutable
    hyperparameter is multiplied, with probability 0.8, by ``1 + N(0, 1) * u * 0.2 * scale``
    (``u`` uniform per generation), clipped to [0.3, 3]. Without earlier generations ``hyp`` is
    only clipped. Keys outside META pass through unchanged. Deterministic given ``rng``.
    """
    if parent not in ("single", "weighted"):
        raise UserError(f"evolve parent {parent!r} is not one of 'single', 'weighted'")
    new = dict(hyp)
    mutable = [key for key in META if key in hyp]
    for key in mutable:
        if not isinstance(hyp[key], (int, float)) or isinstance(hyp[key], bool):
            raise UserError(f"hyperparameter {key}={hyp[key]!r} must be a number")
    names, rows = read_evolve_csv(evolve_csv)
    if len(rows):
        chosen = _choose_parent(evolve_csv, names, rows, rng, parent)
        factors = _mutation_factors(np.array([META[key][0] for key in mutable], dtype=np.float64), rng)
        for key, factor in zip(mutable, factors):
            base = chosen[names.index(key)] if key in names else hyp[key]
            new[key] = float(base * factor)
    for key in mutable:
        _, lower, upper = META[key]
        new[key] = round(min(max(float(new[key]), lower), upper), DECIMALS)
    return new


def _choose_parent(path, names: list[str], rows: np.ndarray, rng: np.random.Generator, parent: str) -> np.ndarray:
    """One row (or the weighted mean row) among the fittest ``TOP_N`` generations."""
    fitness = _fitness_of_rows(path, names, rows)
    top = np.argsort(-fitness, kind="stable")[:TOP_N]
    candidates, weights = rows[top], fitness[top] - fitness[top].min() + 1e-6
    if parent == "single" or len(candidates) == 1:
        return candidates[rng.choice(len(candidates), p=weights / weights.sum())]
    return (candidates * weights[:, None]).sum(0) / weights.sum()


def _mutation_factors(scales: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative factors, redrawn until at least one differs from 1 (when any scale allows it)."""
    factors = np.ones(len(scales))
    while scales.any() and (factors == 1).all():
        mutate = rng.random(len(scales)) < MUTATION_PROB
        step = scales * mutate * rng.standard_normal(len(scales)) * rng.random() * MUTATION_SIGMA
        factors = (step + 1).clip(0.3, 3.0)
    return factors


def best_hyp(evolve_csv, save_path=None) -> dict:
    """Hyperparameters of the fittest generation; also written to ``save_path`` (default: ``hyp_evolve.yaml``
    beside the csv)."""
    path = Path(evolve_csv)
    save_path = Path(save_path) if save_path else path.with_name("hyp_evolve.yaml")
    names, rows = read_evolve_csv(path)
    if not len(rows):
        raise UserError(f"{path}: no generations recorded yet")
    fitness = _fitness_of_rows(path, names, rows)
    best = int(np.argmax(fitness))
    hyp = {name: float(rows[best, i]) for i, name in enumerate(names) if "/" not in name}
    results = ", ".join(f"{name}={rows[best, i]:.5g}" for i, name in enumerate(names) if "/" in name)
    header = (f"# Hyperparameter evolution results\n# Generations: {len(rows)}\n"
              f"# Best generation: {best + 1} (fitness {fitness[best]:.5g})\n# {results}\n")
    atomic_write_bytes(save_path, (header + yaml.safe_dump(hyp, sort_keys=False)).encode())
    LOGGER.info(f"{PREFIX}best of {len(rows)} generations is generation {best + 1}, "
                f"fitness {fitness[best]:.5g}, saved to {save_path}")
    return hyp


def plot_evolve(evolve_csv) -> Path:
    """Save ``evolve.png`` beside the csv: one scatter of each hyperparameter against fitness."""
    from matplotlib.figure import Figure  # imported here: matplotlib is slow to import and only plots need it

    path = Path(evolve_csv)
    names, rows = read_evolve_csv(path)
    if not len(rows):
        raise UserError(f"{path}: no generations recorded yet")
    fitness = _fitness_of_rows(path, names, rows)
    best = int(np.argmax(fitness))
    hyp_columns = [i for i, name in enumerate(names) if "/" not in name]
    cols = math.ceil(math.sqrt(len(hyp_columns)))
    grid_rows = math.ceil(len(hyp_columns) / cols)
    fig = Figure(figsize=(2.4 * cols, 2.2 * grid_rows), tight_layout=True)
    for plot_index, column in enumerate(hyp_columns):
        ax = fig.add_subplot(grid_rows, cols, plot_index + 1)
        ax.scatter(rows[:, column], fitness, c=fitness, cmap="viridis", s=12, alpha=0.8, edgecolors="none")
        ax.plot(rows[best, column], fitness[best], "k+", markersize=12)
        ax.set_title(f"{names[column]} = {rows[best, column]:.3g}", fontsize=8)
        ax.tick_params(labelsize=6)
        if plot_index % cols == 0:
            ax.set_ylabel("fitness", fontsize=7)
    out = path.with_name("evolve.png")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    atomic_write_bytes(out, buffer.getvalue())
    LOGGER.info(f"{PREFIX}saved {out}")
    return out


def evolve(hyp: dict, opt, train_fn) -> None:
    """Hyperparameter evolution: ``opt.evolve`` generations, each ``train_fn(trial_hyp, trial_opt)``.

    ``train_fn`` returns YOLOv5's results tuple; rows go to ``opt.save_dir/evolve.csv`` and a
    continued search (same folder) numbers its generations on.
    """
    save_dir = Path(opt.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    evolve_csv = save_dir / "evolve.csv"
    opt.noval, opt.nosave, opt.noplots = True, True, True
    base = deepcopy(hyp)
    done_before = len(read_evolve_csv(evolve_csv)[1])
    with evolution_run(opt):  # with --logger mlflow: one parent run, each generation a child run
        for generation in range(done_before, done_before + opt.evolve):
            trial = mutate_hyp(base, evolve_csv, generation_rng(opt.seed, evolve_csv))
            trial_opt = deepcopy(opt)
            trial_opt.save_dir = str(save_dir / f"gen{generation}")
            results = train_fn(deepcopy(trial), trial_opt)
            append_evolve_row(evolve_csv, RESULT_KEYS, results, trial)
            LOGGER.info(f"Generation {generation + 1} ({generation - done_before + 1}/{opt.evolve} of this run) "
                        f"done: {results}")
        best_hyp(evolve_csv, save_dir / "hyp_evolve.yaml")
        plot_evolve(evolve_csv)
    LOGGER.info(f"Hyperparameter evolution finished; best hyperparameters in {save_dir / 'hyp_evolve.yaml'}")
