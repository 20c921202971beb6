"""Train and validate every fold of a fold conversion, then print mean ± std of mAP50 and mAP50-95.

    python data/scripts/convert.py vedai --src /data/VEDAI --out datasets/VEDAI-folds --folds 10
    python data/scripts/vedai_folds.py --root datasets/VEDAI-folds --project runs/vedai-folds -- \\
        --cfg models/ffca-yolo.yaml --hyp data/hyps/hyp.ffca-paper.yaml --imgsz 640 --batch-size 32 --epochs 1000

Everything after ``--`` goes to train.py for every fold; this script sets ``--data`` (the fold's data
YAML), ``--project`` and ``--name foldNN``, so fold K trains in PROJECT/foldNN. Each fold's best.pt
(last.pt when there is none) is then validated on that fold's val list, as train.py's final
validation does (fused, fp32, batch twice the training batch). ``--fold 1 2 3`` runs some folds
only (one process per GPU, say); ``--val-only`` trains nothing and summarises the finished runs
under PROJECT. Per-fold figures and the summary go to stdout and PROJECT/folds.csv.
"""

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from utils.errors import UserError, exit_on_user_error  # noqa: E402  (needs ROOT on sys.path)
from utils.files import yaml_load  # noqa: E402
from utils.options import OneLineErrorParser  # noqa: E402

NOT_FOR_TRAIN = {"--data": "set for each fold by vedai_folds.py", "--project": "use vedai_folds.py's --project",
                 "--name": "set for each fold by vedai_folds.py (foldNN)",
                 "--resume": "resume a fold with train.py --resume, then summarise with --val-only",
                 "--evolve": "not a fold run", "--exist-ok": "vedai_folds.py never reuses a fold folder"}



def parse_opt(argv=None):
    """``(options, train.py arguments)``: the arguments after ``--`` are train.py's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = OneLineErrorParser(prog="vedai_folds.py", description="Train and validate every fold; mean ± std.")
    parser.add_argument("--root", required=True, help="the --out folder of 'convert.py vedai --folds N'")
    parser.add_argument("--fold", type=int, nargs="+", default=None, help="fold numbers to run (default: all)")
    parser.add_argument("--project", default=str(ROOT / "runs" / "folds"), help="fold K trains in PROJECT/foldNN")
    parser.add_argument("--val-only", action="store_true", help="train nothing; validate the runs under PROJECT")
    opt = parser.parse_args(ours)
    for arg in train_args:
        flag = arg.split("=")[0]
        if flag in NOT_FOR_TRAIN:
            raise UserError(f"{arg} after '--': {NOT_FOR_TRAIN[flag]}; leave it out of the train.py arguments")
    return opt, train_args


def fold_yamls(root: Path) -> list:
    """The data YAMLs of a fold conversion, fold 1 first, from its ``conversion.yaml``."""
    record_file = root / "conversion.yaml"
    if not record_file.is_file():
        raise UserError(f"--root {root}: no conversion.yaml; convert first with "
                        f"'python data/scripts/convert.py vedai --src DIR --out {root} --folds 10'")
    folds = yaml_load(record_file).get("folds")
    if not folds:
        raise UserError(f"--root {root}: converted as one split, not as folds; convert again with --folds 10")
    return [root / fold["data"] for fold in folds]


def select_folds(wanted, n_folds: int) -> list:
    """The fold numbers to run (all when ``wanted`` is None); a number outside 1..n_folds is a UserError."""
    if wanted is None:
        return list(range(1, n_folds + 1))
    bad = [k for k in wanted if not 1 <= k <= n_folds]
    if bad:
        raise UserError(f"--fold {' '.join(map(str, bad))}: this conversion has folds 1-{n_folds}")
    return sorted(set(wanted))


def train_fold(data_yaml: Path, run_dir: Path, train_args: list) -> None:
    """Train one fold into ``run_dir`` with train.py's own option handling."""
    import train

    opt = train.parse_opt([*train_args, "--data", str(data_yaml), "--project", str(run_dir.parent),
                           "--name", run_dir.name])
    train.main(opt)


def validate_fold(data_yaml: Path, run_dir: Path) -> tuple:
    """``(mAP50, mAP50-95)`` of the run's best.pt (else last.pt) on the fold's val list."""
    import val

    weights = next((w for w in (run_dir / "weights" / n for n in ("best.pt", "last.pt")) if w.is_file()), None)
    if weights is None:
        raise UserError(f"{run_dir}: no weights/best.pt or last.pt; train this fold first (or resume it with "
                        f"'python train.py --resume {run_dir / 'weights' / 'last.pt'}')")
    run_opt = yaml_load(run_dir / "opt.yaml")
    batch = 2 * run_opt["batch_size"] if run_opt["batch_size"] > 0 else 32
    result = val.run(str(data_yaml), weights=str(weights), batch_size=batch, imgsz=run_opt["imgsz"],
                     device=run_opt["device"], workers=0, half=False, plots=False, project=str(run_dir),
                     name="folds-val", exist_ok=True)
    return float(result.map50), float(result.map50_95)


def summary_lines(metrics: dict) -> list:
    """Per-fold lines, then the mean ± sample standard deviation of ``{fold: (mAP50, mAP50-95)}``."""
    lines = [f"fold {k:02d}: mAP50 {m50:.4f}, mAP50-95 {m:.4f}" for k, (m50, m) in sorted(metrics.items())]
    columns = list(zip(*metrics.values()))
    if len(metrics) == 1:
        return [*lines, f"1 fold: mAP50 {columns[0][0]:.4f}, mAP50-95 {columns[1][0]:.4f} (one fold: no spread)"]
    mean_std = [f"{statistics.mean(c):.4f} ± {statistics.stdev(c):.4f}" for c in columns]
    return [*lines, f"{len(metrics)} folds: mAP50 {mean_std[0]}, mAP50-95 {mean_std[1]} "
                    f"(mean ± sample standard deviation)"]


def write_csv(path: Path, metrics: dict) -> None:
    """One row per fold: fold, mAP50, mAP50-95."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["fold", "mAP50", "mAP50-95"])
        writer.writerows([k, f"{m50:.6f}", f"{m:.6f}"] for k, (m50, m) in sorted(metrics.items()))


def run(argv=None) -> dict:
    """Train (unless ``--val-only``) and validate the chosen folds; returns ``{fold: (mAP50, mAP50-95)}``."""
    opt, train_args = parse_opt(argv)
    yamls = fold_yamls(Path(opt.root).resolve())
    folds = select_folds(opt.fold, len(yamls))
    project = Path(opt.project).resolve()
    run_dirs = {k: project / f"fold{k:02d}" for k in folds}
    if not opt.val_only:
        taken = [str(d) for d in run_dirs.values() if d.exists()]
        if taken:
            raise UserError(f"--project {project}: {', '.join(taken)} already exist; choose a new --project, or "
                            f"add --val-only to summarise those runs")
        for k in folds:
            train_fold(yamls[k - 1], run_dirs[k], train_args)
    metrics = {k: validate_fold(yamls[k - 1], run_dirs[k]) for k in folds}
    project.mkdir(parents=True, exist_ok=True)
    write_csv(project / "folds.csv", metrics)
    print("\n".join(summary_lines(metrics)))
    return metrics


main = exit_on_user_error(run)

if __name__ == "__main__":
    main()
