"""Start-up cost of the default determinism mode: ``off`` against ``scoped`` with a cold and a cached audit.

    python -m benchmarks.speed.startup_cost                       # yolov5n, 256 px, 3 rounds
    python -m benchmarks.speed.startup_cost --cfg models/ffca-yolo.yaml --rounds 5

Start-up is the wall time from launching ``python train.py ...`` to the first training batch:
the child process runs train.py unchanged until its training loop would begin, writes the names
of its loaded modules and exits. Both its wall time and its CPU time (user + system, which moves
much less with other processes' load) are reported. ``cold`` audits into an empty cache folder each time; ``cached``
reads the audit that an untimed first run stored. Variants run round-robin (off, cold, cached,
off, ...) so load drift spreads over all of them; figures are medians over rounds, and ratios
are to ``off``. The last lines list the modules the cached path loads that ``off`` does not.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("off", "scoped cold", "scoped cached")

# Runs train.py's own command line (started in ROOT, so `import train` finds it); when the training loop
# starts, it records sys.modules and exits.
CHILD = """
import json, os, sys
import train
def stop_at_first_batch(loop):
    with open({modules!r}, "w") as f:
        json.dump(sorted(sys.modules), f)
    sys.stdout.flush()
    os._exit(0)
train.TrainLoop.run = stop_at_first_batch
sys.argv = ["train.py", *{argv!r}]
train.cli()
"""


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_up_seconds(argv: list, cache: str, modules_file: Path) -> tuple:
    """``(wall s, CPU s)`` of one child run of train.py with ``FFCA_AUDIT_CACHE=cache`` up to its first batch.

    The CPU time (user + system) counts only the child's own work, so it moves far less with the
    machine's load than the wall time does.
    """
    program = CHILD.format(modules=str(modules_file), argv=argv)
    env = {**os.environ, "FFCA_AUDIT_CACHE": cache}
    cpu, start = _children_cpu_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu
    if done.returncode != 0 or not modules_file.is_file():
        sys.exit(f"ERROR: train.py exited {done.returncode} before its first batch:\n{done.stderr[-2000:]}")
    return seconds, cpu


def train_args(args, mode: str, project: Path) -> list:
    # the child runs in the repository's root, so the user's relative paths are resolved here
    return ["--cfg", str(Path(args.cfg).resolve()), "--data", str(Path(args.data).resolve()),
            "--imgsz", str(args.imgsz), "--batch-size", "8",
            "--workers", "0", "--epochs", "1", "--noplots", "--device", "cpu", "--deterministic", mode,
            "--project", str(project), "--name", "run"]


RULES = OptionRules(positive=("imgsz", "rounds"), files=("cfg", "data"))


@exit_on_user_error
def main(argv=None):
    p = parser_for("benchmarks.speed.startup_cost",
                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cfg", default=str(ROOT / "models" / "yolov5n.yaml"))
    p.add_argument("--data", default=str(ROOT / "data" / "shapes.yaml"))
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    args = parse_checked(p, RULES, argv)
    samples = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        warm_cache = tmp / "warm-cache"
        modules = {variant: tmp / f"{variant.replace(' ', '-')}.json" for variant in VARIANTS}
        start_up_seconds(train_args(args, "scoped", tmp / "fill"), str(warm_cache), tmp / "fill.json")  # untimed
        for round_index in range(args.rounds):
            for variant in VARIANTS:
                mode = variant.split()[0]
                cache = str(warm_cache) if variant == "scoped cached" else str(tmp / f"cold-{round_index}")
                project = tmp / f"{variant.replace(' ', '-')}-{round_index}"
                samples[variant].append(start_up_seconds(train_args(args, mode, project), cache, modules[variant]))
        loaded = {variant: set(json.loads(path.read_text())) for variant, path in modules.items()}
    base = [statistics.median(s[i] for s in samples["off"]) for i in (0, 1)]
    print(f"{args.cfg}, {args.imgsz} px, CPU, {os.cpu_count()} cores, {args.rounds} rounds, "
          f"start-up = launch to first batch")
    print("| variant | wall s (median) | vs off | minus off s | CPU s (median) | vs off | minus off s | "
          "wall s, every round |")
    for variant in VARIANTS:
        wall, cpu = (statistics.median(s[i] for s in samples[variant]) for i in (0, 1))
        rounds = ", ".join(f"{s[0]:.1f}" for s in samples[variant])
        print(f"| {variant} | {wall:.2f} | {wall / base[0]:.2f}x | {wall - base[0]:+.2f} | {cpu:.2f} | "
              f"{cpu / base[1]:.2f}x | {cpu - base[1]:+.2f} | {rounds} |")
    extra = sorted(loaded["scoped cached"] - loaded["off"])
    print(f"modules loaded by 'scoped cached' but not by 'off' ({len(extra)}): {', '.join(extra) or 'none'}")
    extra_cold = sorted(loaded["scoped cold"] - loaded["scoped cached"])
    print(f"modules loaded by 'scoped cold' but not by 'scoped cached' ({len(extra_cold)}): "
          f"{', '.join(extra_cold) or 'none'}")


if __name__ == "__main__":
    main()
