"""Very-tiny benchmark (issue 27): train on large cluttered images of 2-12 px objects, report per AI-TOD band.

The data set is generated offline by data/scripts/make_very_tiny.py (seeded: the seed makes the
data and the run): 256-px images by default (``--img-size``), 32-64 objects each, box sides
2-12 px, about four in five under 8 px. Each model trains from scratch at the images' own size with ``train.run`` through
benchmarks/accuracy/matrix.py's ``train_one`` (one thread per worker process), with the base hyp file
plus the ``--set`` overrides, so options such as a tiny-box threshold or an NWD loss weight can be
compared on the same data; ``--compare`` runs several settings on the same seeds in one command. Per run it prints mAP50,
mAP50-95, AP50, AP50-95 and label count per AI-TOD band (by sqrt(box area): very tiny < 8 and
tiny 8-16 px; the objects fall in no other band), the first epoch with mAP50 > 0.001, the train
box loss at the first and last epoch, and the wall time per epoch (training plus each epoch's
validation); then per setting and model the mean and range over seeds, the seed-to-seed spread, and
with ``--compare`` each band's mean relative to the first setting.

    python -m benchmarks.accuracy.very_tiny    # the default suite (docs/small-objects.md)
    python -m benchmarks.accuracy.very_tiny --set scale=0.25 --out runs/very-tiny
    python -m benchmarks.accuracy.very_tiny --models ffca-yolo-n yolov5n-p2 --seeds 0 --epochs 5
    python -m benchmarks.accuracy.very_tiny --compare base nwd=0.5 nwd=0.5,nwd_assign=1

Accuracy columns do not depend on ``--jobs`` or machine load; the s/epoch column does.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

from benchmarks.accuracy.matrix import BANDS, START_MAP50, train_one
from benchmarks.accuracy.variants import VARIANTS, variant_yaml
from benchmarks.cli import map_in_workers, parse_checked, parser_for
from utils.errors import UserError, exit_on_user_error
from utils.files import yaml_load, yaml_save
from utils.options import OptionRules
from utils.training.evolve import META

ROOT = Path(__file__).resolve().parents[2]
HYPS = ROOT / "data" / "hyps"
DEFAULT_HYP = HYPS / "hyp.scratch-low.yaml"
SUITE_BANDS = ("very_tiny", "tiny")  # AI-TOD bands the generated 2-12 px objects fall in
MIN_IMG_SIZE = 32  # the generator needs room to place objects; the model needs a few stride-32 cells
KIND_PREFIX = "very-tiny-"  # a run's kind is this prefix plus its setting's label


def known_hyp_keys() -> set[str]:
    """Every hyperparameter the project knows: the keys of the hyp files in data/hyps and evolve's table."""
    keys = set(META)
    for path in sorted(HYPS.glob("*.yaml")):
        keys |= set(yaml_load(path) or {})
    return keys


def parse_overrides(items: list[str], known: set[str], flag: str = "--set") -> dict[str, int | float]:
    """``["min_box_px=1", "nwd=0.5"]`` -> ``{"min_box_px": 1, "nwd": 0.5}``; a bad item is a UserError.

    Values are numbers only (int when written as one): they are parsed, never evaluated.
    """
    overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} {item}: write KEY=VALUE, e.g. {flag} min_box_px=1")
        if key not in known:
            raise UserError(f"{flag} {item}: unknown hyperparameter {key!r}; known: {', '.join(sorted(known))}")
        try:
            value = int(text) if text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise UserError(f"{flag} {item}: {text!r} is not a number") from None
        if not math.isfinite(value):
            raise UserError(f"{flag} {item}: the value must be a finite number")
        overrides[key] = value
    return overrides


def run_label(overrides: dict) -> str:
    """Short name of a hyp setting for run folders and the table: ``base`` or ``min_box_px=1,nwd=0.5``."""
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"


def parse_settings(items: list[str], known: set[str]) -> list[dict[str, int | float]]:
    """``--compare`` items -> one overrides dict each: ``base`` is no override, ``a=1,b=2`` sets two keys."""
    settings = [{} if item == "base" else parse_overrides(item.split(","), known, "--compare") for item in items]
    labels = [run_label(s) for s in settings]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise UserError(f"--compare: {', '.join(repeated)} given twice; list each setting once")
    return settings


def setting_of(row: dict) -> str:
    """The setting label of a result row (kept in its kind, which also names its run folder)."""
    return row["kind"].removeprefix(KIND_PREFIX)


def write_hyp(base: Path, overrides: dict, out: Path) -> Path:
    """The base hyp file with ``overrides`` applied, written under ``out/hyps`` (recorded with the runs)."""
    hyp = yaml_load(base)
    if not isinstance(hyp, dict):
        raise UserError(f"--hyp {base}: expected a mapping of hyperparameters, e.g. {DEFAULT_HYP.relative_to(ROOT)}")
    path = out / "hyps" / f"{base.stem}-{run_label(overrides)}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    yaml_save(path, {**hyp, **overrides})
    return path


def make_data(size: int, seed: int, n_train: int, n_val: int, out: Path) -> Path:
    """Generate (or reuse) the very-tiny set of one seed; returns its data YAML."""
    from utils.dataset.synthetic.very_tiny import make_very_tiny

    root = out / "data" / f"very-tiny-{size}-{n_train}-{n_val}-s{seed}"
    yaml_file = root.with_suffix(".yaml")
    return yaml_file if yaml_file.exists() else make_very_tiny(root, n_train, n_val, seed, size=size)


def jobs_for(opt: argparse.Namespace, settings: list[dict], out: Path) -> list[dict]:
    """One ``train_one`` job per (setting, seed, model); the data of each seed is generated up front."""
    data = {seed: str(make_data(opt.img_size, seed, opt.n_train, opt.n_val, out)) for seed in opt.seeds}
    jobs = []
    for overrides in settings:
        run_opt = {"epochs": opt.epochs, "batch_size": opt.batch_size, "hyp": str(write_hyp(opt.hyp, overrides, out))}
        jobs += [{"kind": KIND_PREFIX + run_label(overrides), "size": opt.img_size, "seed": seed, "model": m,
                  "data": data[seed], "out": str(out), "cfg": str(variant_yaml(m, out / "models")), "opt": run_opt}
                 for seed in opt.seeds for m in opt.models]
    return jobs


def _ap(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _band(bands: dict, key: str) -> str:
    """``AP50 / AP50-95 (labels)`` of one band, ``-`` for an empty band."""
    band = bands.get(key, {})
    nan = float("nan")
    return f"{_ap(band.get('map50', nan))} / {_ap(band.get('map', nan))} ({band.get('instances', 0)})"


def format_table(rows: list[dict]) -> str:
    """Markdown table, one row per (setting, seed, model)."""
    bands = (f"AP50 / AP50-95 {BANDS[b]} px (labels)" for b in SUITE_BANDS)
    head = ["hyp", "seed", "model", "mAP50", "mAP50-95", *bands, f"first epoch mAP50 > {START_MAP50}",
            "box loss first → last", "s/epoch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [setting_of(r), str(r["seed"]), r["model"], f"{r['map50']:.3f}", f"{r['map']:.4f}",
                 *(_band(r["bands"], b) for b in SUITE_BANDS), str(r["first"] or "never"),
                 f"{r['box0']:.3f} → {r['box1']:.3f}", f"{r['s_per_epoch']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seed_columns(runs: list[dict]) -> dict[str, list[float]]:
    """mAP50-95 and each band's AP50-95 of a group of runs, one value per run."""
    return {"mAP50-95": [r["map"] for r in runs],
            **{f"AP50-95 {BANDS[b]} px": [r["bands"].get(b, {}).get("map", float("nan")) for r in runs]
               for b in SUITE_BANDS}}


def seed_summary(rows: list[dict]) -> list[str]:
    """Per (setting, model) over its seeds: mean and range of mAP50-95 and of each band's AP50-95.

    The range is the seed-to-seed spread a difference between settings has to exceed. With more than
    one setting, each mean is also given relative to the first setting's mean for the same model.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((setting_of(r), r["model"]), []).append(r)
    reference: dict[str, dict[str, list[float]]] = {}
    for (_, model), runs in groups.items():
        reference.setdefault(model, _seed_columns(runs))  # the model's runs under the first setting
    several = len({setting for setting, _ in groups}) > 1
    lines = []
    for (setting, model), runs in groups.items():
        parts = []
        for name, values in _seed_columns(runs).items():
            mean, ref = sum(values) / len(values), reference[model][name]
            ratio = f", {mean / (sum(ref) / len(ref)):.2f}x" if several and sum(ref) > 0 else ""
            parts.append(f"{name} {mean:.4f} ({min(values):.4f}-{max(values):.4f}{ratio})")
        prefix = f"{setting}, " if several else ""
        lines.append(f"{prefix}{model}, {len(runs)} seed(s), mean (min-max): " + "; ".join(parts))
    return lines


RULES = OptionRules(positive=("epochs", "batch_size", "img_size", "n_train", "n_val", "jobs"), non_negative=("seeds",),
                    folders=("out",), files=("hyp",))


def parse_opt(argv=None) -> tuple[argparse.Namespace, list[dict]]:
    """The suite's flags and the settings to run (``--compare``'s, or the one of ``--set``); a bad flag is a UserError."""
    p = parser_for("benchmarks.accuracy.very_tiny", __doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ffca-yolo-n"], choices=VARIANTS,
                   help="models to train")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds (data and training)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="hyperparameters to override in --hyp, e.g. --set min_box_px=1 nwd=0.5")
    p.add_argument("--compare", nargs="+", default=[], metavar="SETTING",
                   help="run several settings on the same seeds instead of --set: 'base' (no override) or "
                        "KEY=VALUE[,KEY=VALUE...], e.g. --compare base nwd=0.5 nwd=0.5,nwd_assign=1")
    p.add_argument("--hyp", type=Path, default=DEFAULT_HYP, help="base hyperparameters YAML")
    p.add_argument("--epochs", type=int, default=80, help="epochs per run")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--img-size", type=int, default=256, help="image side of the generated set and of training")
    p.add_argument("--n-train", type=int, default=128, help="generated training images per seed")
    p.add_argument("--n-val", type=int, default=32, help="generated validation images per seed")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--out", type=Path, default=None, help="keep data and runs here (default: a temporary folder)")
    opt = parse_checked(p, RULES, argv)
    if opt.img_size < MIN_IMG_SIZE or opt.img_size % 32:
        raise UserError(f"--img-size {opt.img_size}: use a multiple of 32, at least {MIN_IMG_SIZE}")
    if not opt.hyp.is_file():
        raise UserError(f"--hyp {opt.hyp}: file not found")
    if opt.compare and opt.overrides:
        raise UserError("--set and --compare: use one; write the --set keys into each --compare setting")
    known = known_hyp_keys()
    return opt, parse_settings(opt.compare, known) if opt.compare else [parse_overrides(opt.overrides, known)]


def command_line(opt: argparse.Namespace) -> str:
    """The suite's settings as the command that reproduces them."""
    sets = (f" --compare {' '.join(opt.compare)}" if opt.compare else "") + \
        (f" --set {' '.join(opt.overrides)}" if opt.overrides else "")
    return (f"python -m benchmarks.accuracy.very_tiny --models {' '.join(opt.models)} "
            f"--seeds {' '.join(map(str, opt.seeds))} --epochs {opt.epochs} --batch-size {opt.batch_size} "
            f"--img-size {opt.img_size} --n-train {opt.n_train} --n-val {opt.n_val} --hyp {opt.hyp}{sets}")


def run_suite(argv=None) -> str:
    """Run the suite; print and return the table."""
    opt, settings = parse_opt(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the worker processes
    with tempfile.TemporaryDirectory() as tmp:
        out = (opt.out or Path(tmp)).resolve()
        jobs = jobs_for(opt, settings, out)
        rows = map_in_workers(train_one, jobs, opt.jobs)
    report = "\n".join([format_table(rows), "", *seed_summary(rows)])
    print(f"\n{command_line(opt)}\n{report}")
    return report


main = exit_on_user_error(run_suite)

if __name__ == "__main__":
    main()
