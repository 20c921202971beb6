"""Does pinning the CPU kernels make a training run's checksum independent of the machine's vector width?

    python -m benchmarks.studies.cpu_pinning                       # yolov5n, 64 px, 1 epoch, 32 images, 1 thread
    python -m benchmarks.studies.cpu_pinning --cfg models/ffca-yolo-n.yaml --imgsz 96

One machine stands in for several: ``ATEN_CPU_CAPABILITY`` (default, avx2, avx512) caps the vector width of
ATen's own kernels, ``ONEDNN_MAX_CPU_ISA`` that of oneDNN's convolutions, ``MKL_CBWR`` pins MKL's code path.
Each row trains the same 1-epoch run (seed 0, ``--workers 0``, ``OMP_NUM_THREADS`` = ``--threads``) on a
generated shapes set in a fresh process under one combination and prints the final EMA checksum
(determinism.json's ``final_ema_sha256``) and the wall time of the process. Rows with equal checksums agree
bit for bit. Then the cost: the median seconds of a training step (forward and backward, ``--cfg`` at 256 px,
batch 8, 5 steps after one warm-up) in a fresh process under each pin at its own level, against nothing pinned.
A study, not a test: a few minutes on one core.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cli import parse_checked, parser_for, request_stop_with_parent
from utils.dataset.synthetic.shapes import make_shapes
from utils.errors import UserError, exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = ("default", "avx2", "avx512")
# (label, extra environment, the ATen capability of the same level); ATEN_CPU_CAPABILITY is added per capability
PINS = (("nothing pinned", {}, "avx512"),
        ("oneDNN AVX2, MKL AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}, "avx2"),
        ("oneDNN SSE4.1, MKL COMPATIBLE", {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"}, "default"))
# Runs in a fresh process: median seconds of a training step of the model argv[1] (256 px, batch 8)
STEP = """
import statistics, sys, time, torch
from models.yolo import Model
torch.manual_seed(0)
model = Model(sys.argv[1], nc=4).train()
x = torch.rand(8, 3, 256, 256)
seconds = []
for _ in range(6):
    start = time.perf_counter()
    sum(o.square().mean() for o in model(x)).backward()
    seconds.append(time.perf_counter() - start)
print("STEP", statistics.median(seconds[1:]))
"""


def make_data(root: Path, n_train: int) -> Path:
    """A generated shapes set of ``n_train`` train and 8 val images; returns its data YAML."""
    make_shapes(root / "shapes", n_train=n_train, n_val=8, seed=0)
    yaml_file = root / "shapes.yaml"
    yaml_file.write_text(f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
                         "names: [circle, square, triangle, cross]\n")
    return yaml_file


def train_once(args, data: Path, out: Path, name: str, env: dict) -> tuple:
    """(final EMA sha256, seconds) of one run under ``env``."""
    command = [sys.executable, "train.py", "--cfg", args.cfg, "--data", str(data), "--imgsz", str(args.imgsz),
               "--epochs", "1", "--batch-size", "8", "--workers", "0", "--device", "cpu", "--noplots",
               "--noautoanchor", "--project", str(out), "--name", name]
    full_env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), **env}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          preexec_fn=request_stop_with_parent)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise UserError(f"training under {env} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    report = json.loads((out / name / "determinism.json").read_text())
    return report["final_ema_sha256"], seconds


def step_seconds(args, env: dict) -> float:
    """Median seconds of a training step of ``--cfg`` in a fresh process under ``env``."""
    full_env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), **env}
    done = subprocess.run([sys.executable, "-c", STEP, args.cfg], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, preexec_fn=request_stop_with_parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("STEP ")]
    if done.returncode or not lines:
        raise UserError(f"timing under {env} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return float(lines[-1].split()[1])


RULES = OptionRules(positive=("imgsz", "images", "threads"), files=("cfg",))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.studies.cpu_pinning", description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", default="models/yolov5n.yaml")
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--images", type=int, default=32, help="training images")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_checked(parser, RULES, argv)
    work = Path(tempfile.mkdtemp(prefix="cpu_pinning_"))
    data = make_data(work, args.images)
    print(f"{Path(args.cfg).stem}, {args.imgsz} px, 1 epoch, {args.images} images, {args.threads} thread(s)")
    print("| pinned | ATEN_CPU_CAPABILITY | final EMA sha256 (first 16) | seconds |\n|---|---|---|---|")
    for p, (label, env, _) in enumerate(PINS):
        for capability in CAPABILITIES:
            sha, seconds = train_once(args, data, work / "runs", f"p{p}_{capability}",
                                         {**env, "ATEN_CPU_CAPABILITY": capability})
            print(f"| {label} | {capability} | {sha[:16]} | {seconds:.1f} |", flush=True)
    print("\n| pinned | ATEN_CPU_CAPABILITY | s per training step | ratio |\n|---|---|---|---|")
    base = None
    for label, env, capability in PINS:
        seconds = step_seconds(args, {**env, "ATEN_CPU_CAPABILITY": capability})
        base = base or seconds
        print(f"| {label} | {capability} | {seconds:.3f} | {seconds / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
