"""The GPU proof: every single-GPU determinism claim of this project, checked in one command.

    python -m benchmarks.gpu_proof.proof --out proof.json 2>&1 | tee proof.log  # one CUDA GPU
    python -m benchmarks.gpu_proof.proof --device cpu --quick --out proof.json   # the CPU check (test suite)

The quick plan is the CPU check: the full plan is sized for a GPU and refuses --device cpu.

Sections (each row PASS, FAIL, ERROR, INCOMPLETE, SKIP or INFO; the table is printed and written to ``--out``):

1. ops: for each op of the battery, the CPU audit's prediction (its meta trace, with the op table
   for the device's torch) against what the device does under
   ``torch.use_deterministic_algorithms(True)``; every mismatch is a FAIL naming both. Each row
   also names the replay table's outcome for that torch release, or NO DATA.
2. control: ``index_add_`` of 10^6 values into one slot, 20 times: one hash under strict, several
   without determinism on CUDA (so the proof could see non-determinism if there were any).
3. reruns: separate ``train.py`` processes (``--deterministic strict``, AMP on by itself on
   CUDA, warm-up off so that gradients accumulate from the first batch): a rerun, a ``--workers 0``
   rerun, and a run SIGKILLed mid-epoch and mid-accumulation then ``--resume``d, all with the same
   final EMA checksum.
4. scam: FFCA's SCAM as published (``nn.AdaptiveMaxPool2d``; on a CPU a stand-in whose backward
   needs ``put_``): the audit names it, ``train.py`` strict stops before the first batch with the
   project's message, a raw strict loop raises PyTorch's own error, ``scoped`` trains, and
   ``--batch-size -1 --deterministic scoped`` trains.
5. twins: per deterministic twin, its backward bit-identical over reruns under strict, its agreement
   with the native op, and what the native op does on CUDA (raises or varies; not applicable on a CPU);
   then a model of nine user blocks (tests/support/user_block_zoo.py) trained under strict twice, with
   the twins named in determinism.json and the same checksum (benchmarks/gpu_proof/twin_rows.py).
6. timing: time per training step and images/s of each mode (off, warn, scoped, strict);
   information rows with their own budget after the claims'.

Exit code: 0 every claim row passed (or does not apply here); 1 a claim row FAILs (the claim is
false, whatever else happened); 3 incomplete, no FAIL but a claim undecided: an ERROR row (the
check raised: out of memory, a missing module, a training run that crashed; its reason is the
row's detail), a claim skipped for the budget or a run still going at the deadline (the last line
names each undecided row and why); 2 bad arguments. Information rows never change it. ``--workdir`` (default ``runs/gpu_proof``, kept)
gets a new subfolder per run, so rerunning with the same one is safe; its path is printed.

``--replay TABLE --quick`` runs the same code on a CPU against a table of a device's outcomes
(``benchmarks/gpu_proof/device.py``; the test suite replays ``benchmarks/gpu_proof/replay/cuda-torch-2.14.json``
with faults added, so every row kind and the proof's CUDA branches have run before a GPU sees them;
only ``LiveDevice``'s own CUDA calls, such as the peak-memory statistics, have not).
"""

import argparse
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from utils.env_vars import recorded  # noqa: E402  (imports no torch, so CUDA cannot start before the line below)

DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")
CUBLAS_FOUND = recorded("CUBLAS_WORKSPACE_CONFIG")
if CUBLAS_FOUND not in DETERMINISTIC_CUBLAS:  # another value makes cuBLAS non-deterministic: every CUDA claim void
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = DETERMINISTIC_CUBLAS[0]  # before anything in this process starts CUDA

import torch  # noqa: E402

from benchmarks.gpu_proof import modules as proof_modules  # noqa: E402  (registers the SCAM variants here too)
from benchmarks.gpu_proof import preflight  # noqa: E402
from benchmarks.gpu_proof import twin_rows  # noqa: E402
from benchmarks.gpu_proof.device import LiveDevice, ReplayDevice  # noqa: E402
from benchmarks.gpu_proof.ops import (CASES, TORCH_ALERT, battery_case, control_off, control_strict,  # noqa: E402
                                      run_audit)
from benchmarks.gpu_proof.report import Proof, info, skip, verdict  # noqa: E402
from benchmarks.gpu_proof.runs import RunSettings, finished  # noqa: E402
from benchmarks.speed.harness import HYP  # noqa: E402
from models.yolo import Model  # noqa: E402
from utils.dataset.synthetic.shapes import make_shapes  # noqa: E402
from utils.determinism.env import environment_report  # noqa: E402
from utils.errors import UserError, exit_on_user_error  # noqa: E402
from utils.files import yaml_load, yaml_save  # noqa: E402
from utils.loss import ComputeLoss  # noqa: E402
from utils.torch_utils import CUBLAS_TOO_LATE, select_device, temporary_determinism  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
TINY = ROOT / "tests" / "models" / "tiny.yaml"
MODES = ("off", "warn", "scoped", "strict")
LAYER = re.compile(r"model\.(\d+)\b")  # the layer index in an audit finding's module path
AUDIT_IMGSZ = 64  # the audit's findings do not depend on the image size
DEFAULT_WORKDIR = ROOT / "runs" / "gpu_proof"


@dataclass(frozen=True)
class Plan:
    """Sizes of one proof: the full GPU proof or the quick one the CPU test suite runs."""

    rerun_models: tuple
    scam_base: Path
    imgsz: int
    epochs: int
    batch_size: int
    workers: int
    n_train: int
    n_val: int
    timing: tuple  # (model YAML, imgsz, batch size) per timed model
    warmup: int
    batches: int
    budget_s: float  # claims may start until then; training runs still going then are killed
    info_budget_s: float  # information rows may start until budget_s + info_budget_s


# Batch 16 accumulates 4 batches per optimizer step (NOMINAL_BATCH 64); 4 batches per epoch or more
# put the kill after batch 2 mid-epoch and mid-accumulation. Budgets: docs/determinism.md, "worst case".
FULL = Plan((MODELS / "ffca-yolo-n.yaml", MODELS / "l-ffca-yolo.yaml"), MODELS / "ffca-yolo-n.yaml",
            imgsz=256, epochs=2, batch_size=16, workers=4, n_train=96, n_val=16,
            timing=((MODELS / "ffca-yolo.yaml", 640, 16),), warmup=3, batches=10, budget_s=230, info_budget_s=45)
QUICK = Plan((TINY,), TINY, imgsz=64, epochs=1, batch_size=16, workers=2, n_train=64, n_val=8,
             timing=((TINY, 64, 4),), warmup=1, batches=3, budget_s=600, info_budget_s=60)
NO_WARMUP = {"warmup_epochs": 0}  # warm-up ramps accumulation from 1: without it the first step accumulates


def make_data(folder: Path, plan: Plan) -> Path:
    """Generate the shapes data set into ``folder`` (the generator of data/scripts/make_shapes.py); returns its YAML."""
    make_shapes(folder / "shapes", n_train=plan.n_train, n_val=plan.n_val, seed=0)
    data_yaml = folder / "shapes.yaml"
    data_yaml.write_text(f"path: {folder / 'shapes'}\ntrain: images/train\nval: images/val\n"
                         "names: [circle, square, triangle, cross]\n")
    return data_yaml


def make_hyp(folder: Path) -> Path:
    """The runs' hyperparameters: the default ones with warm-up off (:data:`NO_WARMUP`)."""
    path = folder / "hyp.no-warmup.yaml"
    yaml_save(path, {**yaml_load(HYP), **NO_WARMUP})
    return path


# ----------------------------------------------------------------------------- ops and control


def ops_section(proof: Proof, layer: LiveDevice) -> None:
    """One row per battery case (predicted for the device's torch, next to its table's outcome), then the control."""
    device, version, table = layer.device, layer.torch_version, layer.expected_outcomes()
    for name in CASES:
        expected = None if table is None else table.get(name, {})
        proof.check("ops", name, lambda name=name, expected=expected: battery_case(
            name, device, layer.strict_outcome, version, expected))
    proof.check("control", "index_add_ 10^6 -> 1 slot x20, strict",
                lambda: control_strict(device, layer.index_add_hashes))
    proof.check("control", "index_add_ 10^6 -> 1 slot x20, off", lambda: control_off(device, layer.index_add_hashes))


# ----------------------------------------------------------------------------- training runs


def start_reruns(pool, layer: LiveDevice, settings: RunSettings, cfgs: tuple, deadline: float) -> dict:
    """Submit, per model in ``cfgs``, a reference run, a rerun, a ``--workers 0`` rerun and a kill-and-resume run.

    The kill-and-resume chains (a run, then its resume) are the longest tasks, so they are submitted first:
    queued behind other runs they would end past the deadline and be reported as killed.
    """
    futures = {cfg: {"killed": pool.submit(layer.kill_and_resume, settings, cfg, f"{cfg.stem}-killed", deadline)}
               for cfg in cfgs}
    runs = {"first": (), "again": (), "workers0": ("--workers", "0")}
    for cfg in cfgs:
        futures[cfg].update({key: pool.submit(layer.run_named, settings, cfg, f"{cfg.stem}-{key}", deadline, *flags)
                             for key, flags in runs.items()})
    return futures


def same_checksum(first, run, what: str):
    """PASS when ``run`` ended with the reference run ``first``'s final EMA checksum."""
    finished(first)
    finished(run)
    return verdict(run.checksum() == first.checksum(),
                   f"{what}: {run.checksum()[:16]} vs {first.checksum()[:16]}",
                   reference=first.checksum(), other=run.checksum())


def reference_row(futures: dict):
    """The reference run finished under strict with a clean audit and printed its checksum."""
    run = futures["first"].result()
    finished(run)
    report = run.report()
    ok = (report["mode"] == "strict" and report["relaxed_backward"] is False
          and run.printed_checksum() == run.checksum())
    return verdict(ok, f"exit 0 in {run.seconds:.0f} s, mode {report['mode']}, relaxed "
                       f"{report['relaxed_backward']}, printed sha256 {run.printed_checksum()} = weights/sha256.txt "
                       f"{run.checksum()}", sha256=run.checksum(), seconds=run.seconds)


def log_row(futures: dict, cuda: bool, needle: str, wanted: bool, what: str):
    """CUDA only: every finished run's log does (``wanted``) or does not contain ``needle``.

    A run cut at the deadline may not have logged the line yet, so only finished runs decide; the row
    is undecided only when no run finished.
    """
    if not cuda:
        return skip(f"CUDA only: {what}")
    everyone = [futures[k].result() for k in ("first", "again", "workers0")]
    runs = [run for run in everyone if not run.timed_out]
    if not runs:
        finished(everyone[0])  # raises: undecided
    found = [run.name for run in runs if (needle in run.log) != wanted]
    cut = [run.name for run in everyone if run.timed_out]
    scope = "all runs" if not cut else f"every finished run ({', '.join(cut)} cut at the deadline)"
    return verdict(not found, f"{what}: {scope if not found else 'not in ' + ', '.join(found)}")


def rerun_rows(proof: Proof, cfg: Path, futures: dict, cuda: bool) -> None:
    """The rows of one model's reruns."""
    stem = cfg.stem
    proof.check("reruns", f"{stem}: strict run, clean audit, checksum", lambda: reference_row(futures))
    proof.check("reruns", f"{stem}: rerun bit-identical",
                lambda: same_checksum(futures["first"].result(), futures["again"].result(), "rerun"))
    proof.check("reruns", f"{stem}: --workers 0 bit-identical",
                lambda: same_checksum(futures["first"].result(), futures["workers0"].result(), "--workers 0"))

    def resumed():
        (epoch, batch, pending), run = futures["killed"].result()
        result = same_checksum(futures["first"].result(), run, f"SIGKILL at epoch {epoch} batch {batch} with "
                                                              f"{pending} batch(es) of gradient pending, --resume")
        if pending <= 0:
            result = verdict(False, f"not mid-accumulation: {result.detail}")
        result.data["position"] = [epoch, batch, pending]
        return result

    proof.check("reruns", f"{stem}: SIGKILL mid-accumulation + --resume bit-identical", resumed)
    proof.check("reruns", f"{stem}: AMP on", lambda: log_row(futures, cuda, "AMP: checks passed", True,
                                                             "'AMP: checks passed' logged"))
    proof.check("reruns", f"{stem}: CUBLAS_WORKSPACE_CONFIG set in time",
                lambda: log_row(futures, cuda, CUBLAS_TOO_LATE, False, "no cuBLAS too-late warning"))


# ----------------------------------------------------------------------------- the SCAM


def start_scam_runs(pool, layer: LiveDevice, settings: RunSettings, cfg: Path, deadline: float) -> dict:
    """Submit strict, scoped and AutoBatch-scoped runs of the flagged SCAM model."""
    runs = {"strict": ("--deterministic", "strict"), "scoped": ("--deterministic", "scoped"),
            "autobatch": ("--deterministic", "scoped", "--batch-size", "-1")}
    return {key: pool.submit(layer.run_named, settings, cfg, f"scam-{key}", deadline, *flags)
            for key, flags in runs.items()}


def scam_audit_row(cfg: Path, block: str, device_type: str):
    """The CPU audit names the block's op in every layer that holds the block."""
    model = Model(cfg, nc=4)
    layers = [i for i, m in enumerate(model.model) if type(m).__name__ == block]
    audit_op = proof_modules.FLAGGED_OPS[block][0]
    report = run_audit(model, AUDIT_IMGSZ, "cpu", 2, 3)
    hits = [f for f in report.findings if f.op == audit_op and device_type in f.devices]
    flagged_layers = sorted({int(m.group(1)) for f in hits if (m := LAYER.match(f.module))})
    return verdict(flagged_layers == layers, f"{audit_op} for {device_type} in layers {flagged_layers} "
                                             f"(the {block} layers: {layers})",
                   findings=[f.to_dict() for f in report.findings])


def raw_strict_row(cfg: Path, block: str, device: torch.device, imgsz: int):
    """A plain strict training step (no audit, no policy) raises PyTorch's own error in the backward."""
    model = Model(cfg, nc=4).to(device).train()
    generator = torch.Generator().manual_seed(0)
    imgs = torch.rand((2, 3, imgsz, imgsz), generator=generator).to(device)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2], [1, 2, 0.3, 0.6, 0.1, 0.15]], device=device)
    with torch.autocast(device.type, enabled=device.type == "cuda"):
        loss, _ = ComputeLoss(model, {**yaml_load(HYP), "label_smoothing": 0.0})(model(imgs), targets)
    try:
        with temporary_determinism(True):
            loss.backward()
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        torch_op = proof_modules.FLAGGED_OPS[block][1]
        return verdict(TORCH_ALERT in str(e) and torch_op in str(e), f"PyTorch: {first[:160]}")
    return verdict(False, "the strict backward did not raise")


def strict_stop_row(future, block: str):
    """train.py strict exits 2 with the project's one-line message before any batch ran."""
    run = future.result()
    if run.timed_out:
        finished(run)  # undecided, not a FAIL: it was still starting at the deadline
    audit_op = proof_modules.FLAGGED_OPS[block][0]
    errors = [line for line in run.log.splitlines() if line.startswith("ERROR: ")]
    started = "Starting training" in run.log or (run.run_dir / "weights" / "last.pt").exists()
    ok = run.returncode == 2 and len(errors) == 1 and "--deterministic strict" in errors[0] \
        and audit_op in errors[0] and not started and "Traceback" not in run.log
    return verdict(ok, f"exit {run.returncode}, training started: {started}: {(errors or [run.tail()])[0][:200]}")


def scoped_row(future, what: str):
    """The run trained to the end with the backward relaxed."""
    run = future.result()
    finished(run)
    relaxed = run.report()["relaxed_backward"]
    autobatch = [line.strip() for line in run.log.splitlines() if "AutoBatch" in line]
    return verdict(relaxed is True, f"{what}: exit 0 in {run.seconds:.0f} s, relaxed backward {relaxed}"
                                    + (f"; {autobatch[-1][:120]}" if autobatch else ""))


def scam_section(proof: Proof, layer: LiveDevice, futures: dict, cfg: Path, block: str, imgsz: int) -> None:
    """The SCAM rows (run futures were submitted earlier); ``block`` fails under strict where the work runs."""
    proof.check("scam", f"{block}: CPU audit names its op", lambda: scam_audit_row(cfg, block, layer.device.type))
    proof.check("scam", f"{block}: raw strict loop raises PyTorch's error",
                lambda: raw_strict_row(cfg, block, layer.run_device, imgsz))
    proof.check("scam", f"{block}: train.py strict stops before batch 1",
                lambda: strict_stop_row(futures["strict"], block))
    proof.check("scam", f"{block}: train.py scoped trains", lambda: scoped_row(futures["scoped"], "scoped"))
    proof.check("scam", f"{block}: --batch-size -1 scoped trains",
                lambda: scoped_row(futures["autobatch"], "AutoBatch + scoped"))


# ----------------------------------------------------------------------------- timing


def timing_section(proof: Proof, plan: Plan, layer: LiveDevice, data_yaml: Path) -> None:
    """Time per training step on one fixed batch, per mode, with the ratio to the first mode that measured.

    Information rows: a row starts only while its budget still holds the longest row so far, so the
    section ends within its budget plus the first row.
    """
    cuda = layer.run_device.type == "cuda"
    longest = 0.0
    for cfg, imgsz, batch in plan.timing:
        base = {}
        for mode in MODES:
            def measure(mode=mode, cfg=cfg, imgsz=imgsz, batch=batch):
                seconds, peak_gib = layer.time_fixed_batch(cfg, imgsz, batch, mode, data_yaml, plan.warmup,
                                                           plan.batches)
                if not base:  # the first mode that measured is the baseline (off unless off failed)
                    base.update(mode=mode, seconds=seconds)
                return info(f"{seconds * 1000:.1f} ms/batch, {batch / seconds:.1f} img/s, "
                            f"x{seconds / base['seconds']:.3f} vs {base['mode']}, "
                            f"peak {'allocated' if cuda else 'RSS'} {peak_gib:.2f} GiB", seconds=seconds,
                            images_per_s=batch / seconds, peak_gib=peak_gib, baseline=base["mode"])
            row = proof.check("timing", f"{cfg.stem} {imgsz}px batch {batch}: {mode}", measure, claim=False,
                              needs_s=longest)
            longest = max(longest, row.seconds)


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    """The command's flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="proof.json", help="JSON record (written atomically, also during the run)")
    p.add_argument("--device", default="0", help="CUDA index such as 0 (default), or cpu (only with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (tiny model, 64 px, 1 epoch): the CPU check, with --device cpu")
    p.add_argument("--budget", type=float, default=None,
                   help="claims' wall-clock seconds; claims not started by then are INCOMPLETE (exit 3)")
    p.add_argument("--jobs", type=int, default=None, help="training processes at once (default 6 on CUDA, 2 on CPU)")
    p.add_argument("--workdir", default=None,
                   help="folder that gets a new subfolder for data, runs and logs, kept (default runs/gpu_proof)")
    p.add_argument("--replay", default=None, metavar="TABLE",
                   help="with --quick: replay a JSON table of a device's outcomes on the CPU "
                        "(see benchmarks/gpu_proof/device.py)")
    args = p.parse_args(argv)
    if args.replay and not args.quick:
        raise UserError(f"--replay {args.replay}: a replay runs the quick plan on the CPU; add --quick")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be at least 1")
    if args.budget is not None and args.budget <= 0:
        raise UserError(f"--budget {args.budget}: must be a positive number of seconds")
    if not args.device.strip():  # select_device would quietly pick the CPU: the proof must name its device
        raise UserError("--device '': name the device to prove: a CUDA index such as 0, or cpu with "
                        "--quick (the CPU check, --device cpu --quick)")
    if args.device.strip().lower() == "cpu" and not args.quick:
        raise UserError("--device cpu: the full plan is sized for a GPU (on a 2-core CPU it ran over 14 minutes "
                        "near 12 GB); the CPU check is --device cpu --quick")
    return args


def prove(proof: Proof, plan: Plan, layer: LiveDevice, work: Path, sizes: tuple) -> None:
    """Run every section into ``proof`` on ``layer``'s device; ``sizes``: (training processes at once,
    loader workers each), from :func:`preflight.sizes`."""
    jobs, workers = sizes
    ops_section(proof, layer)
    twin_rows.twin_section(proof, layer.run_device, quick=layer.run_device.type != "cuda")
    data_yaml = make_data(work, plan)
    child_device = layer.child_device()
    threads = None if layer.run_device.type == "cuda" else max(1, (os.cpu_count() or 1) // jobs)
    runs = RunSettings(data_yaml, work / "runs", child_device, plan.imgsz, plan.epochs, plan.batch_size, workers,
                       threads=threads, extra=["--hyp", str(make_hyp(work))])
    block = proof_modules.flagged_block(layer.run_device.type)
    scam_cfg = proof_modules.write_scam_variant(plan.scam_base, block, work)
    scam_runs = RunSettings(data_yaml, work / "runs", child_device, plan.imgsz, 1, plan.batch_size, workers,
                            custom_modules=True, threads=threads)
    deadline = time.monotonic() + max(proof.remaining(), 10)  # the claims' budget: runs still going then are undecided
    with ThreadPoolExecutor(jobs) as pool:
        reruns = start_reruns(pool, layer, runs, plan.rerun_models, deadline)
        scam = start_scam_runs(pool, layer, scam_runs, scam_cfg, deadline)
        _, zoo = twin_rows.start_zoo_runs(pool, layer, scam_runs, work, deadline)
        scam_section(proof, layer, scam, scam_cfg, block, plan.imgsz)
        for cfg, futures in reruns.items():
            rerun_rows(proof, cfg, futures, layer.device.type == "cuda")
        twin_rows.zoo_rows(proof, zoo)
    timing_section(proof, plan, layer, data_yaml)


def chosen_device(request: str) -> torch.device:
    """The device to prove; never a quiet fall-back to the CPU (select_device has not started the driver before)."""
    try:
        return select_device(request)
    except UserError as e:
        raise UserError(f"{e} (the proof's CPU check is --device cpu --quick)") from None


def start_lines(layer: LiveDevice, ready: str, work: Path) -> list:
    """What the proof prints before its first row: cuBLAS, torch and table, preflight, work folder."""
    lines = [] if CUBLAS_FOUND in (None, *DETERMINISTIC_CUBLAS) else [
        f"CUBLAS_WORKSPACE_CONFIG was {CUBLAS_FOUND!r}, not deterministic: set to {DETERMINISTIC_CUBLAS[0]}"]
    return lines + [layer.table_line(), ready, f"work folder (kept): {work}"]


@exit_on_user_error
def main(argv=None) -> int:
    """Run the proof, print the table, write ``--out``; 0 every claim passed, 1 a claim FAILs, 3 incomplete
    (a claim row ERROR or INCOMPLETE, none FAILs)."""
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    budget = args.budget or plan.budget_s
    layer = ReplayDevice.from_file(args.replay, budget) if args.replay else LiveDevice(chosen_device(args.device))
    sizes = preflight.sizes(layer.run_device.type == "cuda", plan.workers, args.jobs)
    ready = preflight.check(preflight.shm_mib(), layer.compute_mode(), *sizes)
    workdir = Path(args.workdir or DEFAULT_WORKDIR)  # a fresh folder inside it, so a rerun finds nothing in the way
    workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_proof_", dir=workdir)).resolve()
    for line in start_lines(layer, ready, work):
        print(line, flush=True)
    proof = Proof(Path(args.out), budget,
                  {"command": " ".join(sys.argv), "device": str(layer.device), "quick": args.quick,
                   "replay": args.replay, "proved_torch": layer.torch_version, "table": layer.table_name(),
                   "preflight": ready, "workdir": str(work), "cublas_found": CUBLAS_FOUND,
                   "environment": environment_report()}, clock=layer.clock, info_budget_s=plan.info_budget_s)
    return proof.conclude(lambda: prove(proof, plan, layer, work, sizes), work)


if __name__ == "__main__":
    sys.exit(main())
