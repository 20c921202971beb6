"""What moving a model from the authors' FFM arithmetic to this project's fixed one costs, in epochs.

A converted FFCA-YOLO checkpoint keeps the authors' FFM arithmetic (docs/export.md). Switching it to
the fixed arithmetic keeps every weight, but the layers after each FFM then see inputs about C times
larger (C: the FFM's output channels) and, with unequal FFM weights, a different channel weighting, so
the model must be fine-tuned. This benchmark measures that on one data set:

1. the source: ``--source CKPT`` (a converted checkpoint, say), or a model trained here from scratch in
   the authors' arithmetic for ``--source-epochs`` (``--cfg`` with every FFM row set to ``authors``);
2. the source validated, then the same weights with every FFM row ``fixed`` (what
   ``convert_checkpoint.py --fixed-ffm`` writes) validated before any training;
3. that switched checkpoint fine-tuned for ``--epochs`` (``train.py --weights switched.pt``), and, as
   the control, the source fine-tuned the same way in its own arithmetic;
4. a table of mAP50 / mAP50-95 per fine-tuning epoch for both, and the first epoch at which each
   reaches the source's mAP50-95.

    python -m benchmarks.accuracy.ffm_switch --data data/shapes.yaml --cfg models/ffca-yolo-n.yaml --imgsz 256 \\
        --source-epochs 100 --epochs 30 --batch-size 16 --out runs/ffm-switch

Figures are for one seed and one data set; docs/export.md says what has been measured.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from utils.foreign_checkpoint import with_authors_ffm, with_fixed_ffm
from utils.files import yaml_load, yaml_save
from utils.training.checkpoints import load_checkpoint, save_checkpoint
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]


RULES = OptionRules(positive=("source_epochs", "epochs", "imgsz", "batch_size"), non_negative=("seed",),
                    folders=("out",), files=("data", "cfg", "hyp"))


def parse_opt(argv=None):
    p = parser_for("benchmarks.accuracy.ffm_switch",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "data" / "shapes.yaml"), help="data YAML")
    p.add_argument("--cfg", default=str(ROOT / "models" / "ffca-yolo-n.yaml"), help="model YAML of the source")
    p.add_argument("--source", default="", help="checkpoint in the authors' arithmetic (skips training one)")
    p.add_argument("--source-epochs", type=int, default=100, help="epochs to train the source from scratch")
    p.add_argument("--epochs", type=int, default=30, help="fine-tuning epochs, switched and control alike")
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--hyp", default=str(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"))
    p.add_argument("--device", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "runs" / "ffm-switch"), help="output folder")
    return parse_checked(p, RULES, argv)


def train_run(opt, name: str, **kwargs) -> Path:
    """One train.py run under ``opt.out`` with the benchmark's shared settings; returns its run folder."""
    import train

    train.run(data=opt.data, imgsz=opt.imgsz, batch_size=opt.batch_size, hyp=opt.hyp, device=opt.device,
              seed=opt.seed, workers=0, project=str(Path(opt.out) / "runs"), name=name, exist_ok=True,
              noplots=True, **kwargs)
    return Path(opt.out) / "runs" / name


def final_weights(run_dir: Path) -> Path:
    """best.pt of a finished run, else last.pt."""
    best = run_dir / "weights" / "best.pt"
    return best if best.is_file() else run_dir / "weights" / "last.pt"


def source_checkpoint(opt) -> Path:
    """``--source``, or a model trained from scratch with every FFM row of ``--cfg`` in the authors' arithmetic."""
    if opt.source:
        return Path(opt.source)
    cfg = with_authors_ffm(yaml_load(opt.cfg), {})  # no pickled classes known: every FFM row -> authors
    cfg_file = Path(opt.out) / f"{Path(opt.cfg).stem}-authors.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    yaml_save(cfg_file, cfg)
    return final_weights(train_run(opt, "source", cfg=str(cfg_file), weights="", epochs=opt.source_epochs))


def switch_to_fixed(src: Path, dst: Path) -> Path:
    """``src`` with every FFM row of its model YAML in the fixed arithmetic, weights untouched."""
    ckpt = load_checkpoint(src)
    save_checkpoint({**ckpt, "model_cfg": with_fixed_ffm(ckpt["model_cfg"])}, dst)
    return dst


def validate(opt, weights: Path, name: str) -> tuple:
    """``(mAP50, mAP50-95)`` of ``weights`` on the val split."""
    import val

    result = val.run(opt.data, weights=str(weights), batch_size=opt.batch_size, imgsz=opt.imgsz,
                     device=opt.device, workers=0, half=False, plots=False,
                     project=str(Path(opt.out) / "val"), name=name, exist_ok=True)
    return float(result.map50), float(result.map50_95)


def curve(run_dir: Path) -> list:
    """``[(mAP50, mAP50-95), ...]`` per epoch from a run's results.csv."""
    with open(run_dir / "results.csv", newline="") as f:
        return [(float(r["metrics/mAP_0.5"]), float(r["metrics/mAP_0.5:0.95"])) for r in csv.DictReader(f)]


def recovery_epoch(points: list, target: float):
    """The first epoch (1-based) whose mAP50-95 reaches ``target``; None if none does."""
    return next((i for i, (_, m) in enumerate(points, 1) if m >= target), None)


def report(source: tuple, switched: tuple, fixed_curve: list, control_curve: list) -> list:
    """The printed lines: the three starting points, one row per epoch, the recovery epochs."""
    lines = [f"source (authors' arithmetic): mAP50 {source[0]:.4f}, mAP50-95 {source[1]:.4f}",
             f"switched to fixed, before training: mAP50 {switched[0]:.4f}, mAP50-95 {switched[1]:.4f}",
             "| epoch | fixed mAP50 | fixed mAP50-95 | control (authors) mAP50 | control mAP50-95 |",
             "|---|---|---|---|---|"]
    lines += [f"| {i} | {f[0]:.4f} | {f[1]:.4f} | {c[0]:.4f} | {c[1]:.4f} |"
              for i, (f, c) in enumerate(zip(fixed_curve, control_curve), 1)]
    for label, points in (("fixed", fixed_curve), ("control", control_curve)):
        epoch = recovery_epoch(points, source[1])
        lines.append(f"{label}: reaches the source's mAP50-95 {source[1]:.4f} at epoch "
                     f"{epoch if epoch else f'- (not within {len(points)})'}")
    return lines


@exit_on_user_error
def main(argv=None) -> list:
    opt = parse_opt(argv)
    source = source_checkpoint(opt)
    switched = switch_to_fixed(source, Path(opt.out) / "switched.pt")
    start = validate(opt, source, "source"), validate(opt, switched, "switched")
    fixed_run = train_run(opt, "fixed", cfg="", weights=str(switched), epochs=opt.epochs)
    control_run = train_run(opt, "control", cfg="", weights=str(source), epochs=opt.epochs)
    lines = report(*start, curve(fixed_run), curve(control_run))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
