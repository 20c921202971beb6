"""Side by side with the FFCA-YOLO authors' training code: the same data, model YAML, seed, image size, batch
and epochs, trained by their train.py and by ours (with their published hyp and with our defaults).

    git clone https://github.com/yemu1138178251/FFCA-YOLO /tmp/ffca-authors      # outside the project
    pip install --no-deps --target /tmp/ffca-site psutil seaborn "setuptools<81"  # what their code imports beyond ours
    python -m benchmarks.accuracy.vs_authors --authors /tmp/ffca-authors --site /tmp/ffca-site --out runs/vs-authors
    python -m benchmarks.accuracy.vs_authors --authors /tmp/ffca-authors --site /tmp/ffca-site --kinds photos glyphs \\
        --seeds 0 1 --jobs 2 --out runs/vs-authors

Their code is run, never vendored: ``--out`` gets a working copy of the folder with three lines
replaced so it runs on current packages without changing training (``check_requirements`` from
ultralytics 8.0 becomes a no-op; timm's ``DropPath`` becomes ``nn.Identity``, as drop path is 0 in
FFCA-YOLO; ``np.trapz``, gone in numpy 2.4, becomes ``np.trapezoid``), their ``torch.load`` calls get
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, and the Arial.ttf their
dataset check would download is matplotlib's DejaVuSans under that name in their config folder. Every run trains
``models/ffca-yolo-n.yaml`` (or ``--cfg``) from scratch on a matrix cell (benchmarks/accuracy/matrix.py's
generator) with ``--batch-size 16 --workers 0 --noplots --device cpu`` and one thread:

- ``authors``: their train.py with ``data/hyps/hyp.ffca-paper.yaml`` (their published hyp; the keys
  only this project knows are ignored by their code);
- ``ours, paper hyp``: our train.py with the same hyp file;
- ``ours, defaults``: our train.py with its default hyp.

Each side's ``best.pt`` is then scored by our ``val.py`` (the authors' checkpoint converted by
``utils.foreign_checkpoint``, which keeps their FFM arithmetic), so the mAP columns use one metric; their
own results.csv figure is shown beside it. Also per run: the first epoch with mAP50 > 0.001 (each side's
own validation), seconds per epoch (the whole process over the epochs) and peak RSS. Finished runs under
``--out`` are reused, so the same command continues. ``--sides`` picks which of the three runs each cell
gets: ``ours-default`` is the matrix's run of the same cell and seed (same generator, command and
recipe), so ``--sides authors`` adds the authors' runs to a finished matrix.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.accuracy.matrix import KINDS, check_image_sizes, make_data, results_rows
from benchmarks.cli import map_in_workers, parse_checked, parser_for, request_stop_with_parent
from benchmarks.peers import offline_config_folder
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
PAPER_HYP = ROOT / "data" / "hyps" / "hyp.ffca-paper.yaml"
SIDES = {"authors": "authors", "ours-paper": "ours, paper hyp", "ours-default": "ours, defaults"}  # --sides: label
RULES = OptionRules(positive=("size", "epochs", "n_train", "n_val", "jobs"), non_negative=("seeds",), folders=("out",),
                    files=("cfg",))
START_MAP50 = 0.001
THEIR_EXTRA_PACKAGES = "psutil seaborn 'setuptools<81'"  # what their code imports beyond our requirements
# (file, line as the authors wrote it, what runs instead): imports of packages that moved, nothing else
PATCHES = (("utils/general.py", "from ultralytics.yolo.utils.checks import check_requirements",
            "def check_requirements(*args, **kwargs):  # vs_authors: ultralytics 8.0's module is gone\n    return True"),
           ("models/common.py", "from timm.models.layers import DropPath",
            "from torch.nn import Identity as DropPath  # vs_authors: drop path is 0 in FFCA-YOLO"),
           ("utils/metrics.py", "ap = np.trapz(np.interp(x, mrec, mpre), x)  # integrate",
            "ap = getattr(np, 'trapezoid', getattr(np, 'trapz', None))(np.interp(x, mrec, mpre), x)  # vs_authors"))

# Runs a command and prints its peak RSS (KiB) after it ends: RUSAGE_CHILDREN of this wrapper is that run only.
# The command stops when this wrapper dies, as the wrapper does when its worker dies (benchmarks/cli.py).
PEAK_RSS = ("import ctypes, resource, signal, subprocess, sys; "
            "stop = (lambda: ctypes.CDLL(None).prctl(1, signal.SIGTERM)) if sys.platform == 'linux' else None; "
            "code = subprocess.call(sys.argv[1:], preexec_fn=stop); "
            "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True); sys.exit(code)")


def working_copy(authors: Path, out: Path) -> Path:
    """``out/authors-code``: a copy of their folder with :data:`PATCHES` applied (made once)."""
    copy = out / "authors-code"
    if (copy / "train.py").exists():
        return copy
    if not (authors / "train.py").is_file() or not (authors / "models" / "common.py").is_file():
        raise UserError(f"--authors {authors}: not the FFCA-YOLO authors' code (no train.py and models/common.py); "
                        "git clone https://github.com/yemu1138178251/FFCA-YOLO there")
    shutil.copytree(authors, copy, ignore=shutil.ignore_patterns(".git", "runs", "*.pt"))
    for name, original, replacement in PATCHES:
        path = copy / name
        text = path.read_text()
        if original not in text:
            raise UserError(f"--authors {authors}: {name} no longer has '{original}'; this benchmark was written for "
                            "the authors' commit 874a00d")
        path.write_text(text.replace(original, replacement, 1))
    offline_config_folder(out / "authors-config")
    return copy


def authors_env(code: Path, site: str | None) -> dict:
    """The environment their train.py runs in: one thread, their ``torch.load``, our offline font, ``--site``."""
    # their dataset check fetches Arial.ttf; a font file of the right name in their config folder stops that
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
           "YOLOV5_CONFIG_DIR": str(code.parent / "authors-config")}
    if site:
        env["PYTHONPATH"] = site
    return env


def check_their_imports(code: Path, site: str | None) -> None:
    """Import their train.py once, so a missing package is one line before any run rather than a failed run."""
    done = subprocess.run([sys.executable, "-c", "import train"], cwd=code, env=authors_env(code, site),
                          capture_output=True, text=True)
    if done.returncode:
        cause = (done.stderr.strip().splitlines() or ["exited " + str(done.returncode)])[-1]
        raise UserError(f"--site {site or '(not given)'}: the authors' train.py does not import ({cause}); "
                        f"pip install --no-deps --target SITE {THEIR_EXTRA_PACKAGES} and pass --site SITE")


def train_command(job: dict) -> tuple[list, Path]:
    """(command line, working folder) of one run."""
    run = Path(job["out"]) / "runs" / run_name(job)
    args = ["--data", job["data"], "--cfg", job["cfg"], "--weights", "", "--epochs", str(job["epochs"]),
            "--imgsz", str(job["size"]), "--batch-size", "16", "--workers", "0", "--seed", str(job["seed"]),
            "--device", "cpu", "--noplots", "--project", str(run.parent), "--name", run.name, "--exist-ok"]
    if job["side"] != "ours, defaults":
        args += ["--hyp", str(PAPER_HYP)]
    folder = Path(job["authors_code"]) if job["side"] == "authors" else ROOT
    return [sys.executable, "train.py", *args], folder


def run_name(job: dict) -> str:
    side = next(name for name, label in SIDES.items() if label == job["side"])
    return f"{job['kind']}-{job['size']}-s{job['seed']}-{Path(job['cfg']).stem}-{side}"


def own_curve(results_csv: Path) -> dict:
    """Epochs, the first epoch (1-based) with mAP50 > START_MAP50 and the best mAP50-95, from a side's results.csv."""
    rows = results_rows(results_csv)
    maps = [float(r["metrics/mAP_0.5:0.95"]) for r in rows]
    first = next((i + 1 for i, r in enumerate(rows) if float(r["metrics/mAP_0.5"]) > START_MAP50), None)
    return {"epochs": len(rows), "first": first, "own_best": max(maps, default=0.0)}


def score(job: dict, run: Path) -> float:
    """mAP50-95 of the run's best.pt by our val.py (the authors' checkpoint converted first)."""
    import val
    from models.yolo import Model
    from utils.foreign_checkpoint import convert
    from utils.dataset.data_config import check_dataset

    weights = run / "weights" / "best.pt"
    if job["side"] == "authors":
        converted = run / "weights" / "best-converted.pt"
        if not converted.exists():
            convert(weights, converted, Model)
        weights = converted
    return float(val.run(check_dataset(Path(job["data"])), weights=str(weights), batch_size=16, imgsz=job["size"],
                         device="cpu", workers=0, project=str(run / "scored"), name="val", exist_ok=True,
                         plots=False).metrics[3])


def train_one(job: dict) -> dict:
    """One run in a worker process (or the finished one under ``--out``); its table row."""
    run = Path(job["out"]) / "runs" / run_name(job)
    row_file = run / "row.json"
    if row_file.exists():
        return json.loads(row_file.read_text())
    cmd, folder = train_command(job)
    theirs = job["side"] == "authors"
    env = authors_env(Path(job["authors_code"]), job["site"]) if theirs else {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *cmd], cwd=folder, env=env, capture_output=True, text=True,
                          preexec_fn=request_stop_with_parent)
    seconds = time.perf_counter() - start
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UserError(f"{job['side']} run {run.name} exited {done.returncode}: {' | '.join(tail)}")
    peak_kb = int(next(ln for ln in done.stdout.splitlines() if ln.startswith("PEAK_RSS_KB")).split()[1])
    curve = own_curve(run / "results.csv")
    row = {**{k: job[k] for k in ("kind", "size", "seed", "side")}, "model": Path(job["cfg"]).stem, **curve,
           "map": score(job, run), "s_per_epoch": seconds / curve["epochs"], "peak_rss_mb": peak_kb / 1024}
    row_file.write_text(json.dumps(row))
    return row


def table(rows: list) -> str:
    lines = ["| cell | model | side | mAP50-95 (our val.py) | mAP50-95 (its own results.csv, best) | "
             "first epoch mAP50 > 0.001 | s/epoch | peak RSS MiB |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['kind']} {r['size']} px seed {r['seed']} | {r['model']} | {r['side']} | {r['map']:.4f} | "
                     f"{r['own_best']:.4f} | {r['first'] or 'never'} | {r['s_per_epoch']:.1f} | "
                     f"{r['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.accuracy.vs_authors", description=__doc__.splitlines()[0])
    p.add_argument("--authors", required=True, help="a checkout of github.com/yemu1138178251/FFCA-YOLO")
    p.add_argument("--site", help="folder with the packages their code imports beyond ours (pip install --target)")
    p.add_argument("--cfg", default=str(ROOT / "models" / "ffca-yolo-n.yaml"), help="model YAML (both sides)")
    p.add_argument("--kinds", nargs="+", default=["photos"], choices=KINDS)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (data and training)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES),
                   help="which runs per cell (e.g. only 'authors' when ours come from the matrix)")
    p.add_argument("--n-train", type=int, default=256)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    p.add_argument("--out", required=True, help="data, the authors' working copy and runs; finished runs are reused")
    args = parse_checked(p, RULES, argv)
    check_image_sizes("--size", [args.size])
    out = Path(args.out).resolve()
    if args.site and not Path(args.site).is_dir():
        raise UserError(f"--site {args.site}: no such folder; pip install --no-deps --target {args.site} "
                        f"{THEIR_EXTRA_PACKAGES} makes it")
    code = working_copy(Path(args.authors).resolve(), out)
    site = str(Path(args.site).resolve()) if args.site else None
    if "authors" in args.sides:
        check_their_imports(code, site)
    jobs = [{"out": str(out), "authors_code": str(code), "site": site, "cfg": str(Path(args.cfg).resolve()), "kind": kind,
             "size": args.size, "seed": seed, "epochs": args.epochs, "side": side,
             "data": str(make_data(kind, args.size, seed, args.n_train, args.n_val, out))}
            for kind in args.kinds for seed in args.seeds for side in (SIDES[s] for s in args.sides)]
    rows = map_in_workers(train_one, jobs, args.jobs)
    print(f"\n{args.epochs} epochs, {args.n_train} training / {args.n_val} validation images, batch 16, CPU, "
          f"one thread per run\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    main()
