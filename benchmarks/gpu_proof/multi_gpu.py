"""The multi-GPU proof: what one GPU cannot show, checked on 4 GPUs or more (NCCL) in at most 8 minutes.

    benchmarks/gpu_proof/multi_gpu.sh OUT_DIR                                # 4+ CUDA GPUs
    python -m benchmarks.gpu_proof.multi_gpu --out multi_gpu.json            # the same, without the wrapper
    python -m benchmarks.gpu_proof.multi_gpu --device cpu --quick --out m.json   # the dry run: gloo on the CPU

Every run is ``torchrun --standalone --nproc_per_node=N train.py --deterministic strict``, one
process per GPU. Rows (claims; ``benchmarks/gpu_proof/report.py``):

1. N processes: the reference run finishes and prints its final EMA checksum;
2. N processes: a rerun ends with the same checksum;
3. N processes: a run stopped by SIGTERM mid-epoch (sent to torchrun, as a scheduler does) and
   resumed with ``--resume`` on N processes ends with the reference's checksum;
4. N processes with ``--micro-batch``: the reference run of the world-size switch;
5. N -> N/2 processes with ``--micro-batch``: a run stopped by SIGTERM mid-epoch and resumed on
   N/2 processes ends with row 4's checksum.

Exit code: 0 every row passed; 1 a row FAILs; 3 incomplete (no FAIL, but a row ERROR, e.g. a run
that crashed or ran out of memory, or a run still going at the deadline); 2 bad arguments or a
machine with fewer GPUs than processes. ``--nproc 2 --quick --device cpu`` is the test suite's
plan (2 -> 1).
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.gpu_proof import preflight
from benchmarks.gpu_proof.proof import make_data, same_checksum
from benchmarks.gpu_proof.report import DeadlineExceeded, Proof, verdict
from benchmarks.gpu_proof.runs import RunResult, RunSettings, child_env, finished, read_log, run_to_end
from utils.errors import UserError, exit_on_user_error

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = ROOT / "runs" / "multi_gpu_proof"
ROW_GRACE_S = 30  # rows may start this long after the runs' deadline: they only read finished runs


@dataclass(frozen=True)
class Plan:
    """Sizes of one multi-GPU proof."""

    cfg: Path
    imgsz: int
    epochs: int
    batch_size: int
    micro_batch: int
    workers: int
    n_train: int
    n_val: int
    budget_s: float  # rows may start until then; runs still going then are killed (INCOMPLETE)
    jobs: int  # runs at once


# 96 images at batch 16: 6 steps an epoch, so a SIGTERM after the first saved step lands mid-epoch;
# --micro-batch 2 makes 8 micro-batches a step, 2 per process on 4 GPUs and 4 on 2. The default
# hyperparameters' warm-up starts accumulation at 1 batch, so the optimizer steps from the first batch.
FULL = Plan(ROOT / "models" / "ffca-yolo-n.yaml", imgsz=256, epochs=2, batch_size=16, micro_batch=2, workers=1,
            n_train=96, n_val=16, budget_s=420, jobs=2)
# The CPU dry run: 36 images at batch 8 make 5 steps (the last one short), 2 images a micro-batch.
QUICK = Plan(ROOT / "tests" / "models" / "tiny.yaml", imgsz=64, epochs=1, batch_size=8, micro_batch=2, workers=0,
             n_train=36, n_val=4, budget_s=1800, jobs=1)


def torchrun(nproc: int) -> list:
    """``python -m torch.distributed.run`` on this machine with ``nproc`` processes, then train.py."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]


def devices(device: str, nproc: int) -> str:
    """train.py's ``--device`` for ``nproc`` processes: ``cpu``, or the first ``nproc`` GPU indices."""
    return "cpu" if device == "cpu" else ",".join(map(str, range(nproc)))


# ----------------------------------------------------------------------------- SIGTERM mid-epoch


def child_pids(pid: int) -> list:
    """The direct children of ``pid`` (Linux /proc): torchrun's worker processes."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def _status(pid: int) -> dict:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _stopped_or_gone(pid: int) -> bool:
    return _status(pid).get("State", "X")[0] in "TZX"


def _sigterm_pending(pid: int) -> bool:
    status = _status(pid)
    return not status or any(int(status[f], 16) >> (signal.SIGTERM - 1) & 1 for f in ("SigPnd", "ShdPnd"))


def _wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for the stopped workers")
        time.sleep(0.01)


@contextlib.contextmanager
def workers_stopped(launcher: subprocess.Popen, timeout: float = 120):
    """SIGSTOP torchrun's workers until the block ends, so that ``last.pt`` cannot change while it is read.

    A worker that has the SIGSTOP pending but is not yet stopped would take a SIGTERM first, so the
    block starts only once every worker is seen stopped.
    """
    workers = child_pids(launcher.pid)
    try:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        _wait_until(lambda: all(_stopped_or_gone(pid) for pid in workers), timeout)
        yield workers
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def saved_position(last_pt: Path) -> tuple | None:
    """``(epoch, batch)`` that ``last.pt`` resumes at, or None while it is absent or being replaced."""
    try:
        return tuple(torch.load(last_pt, weights_only=True, map_location="cpu")["next_position"])
    except (FileNotFoundError, RuntimeError, EOFError, KeyError):
        return None


def sigterm_mid_epoch(cmd: list, project: Path, name: str, timeout: float, threads: int | None) -> tuple:
    """Start ``cmd`` (torchrun); SIGTERM it once ``last.pt`` holds a mid-epoch position, wait for the end.

    The look at ``last.pt`` and the SIGTERM happen with the workers stopped, so they handle the signal
    in the step they were stopped in, on a fast GPU as on a loaded CPU. Returns ``(the position the
    stopped run saved, RunResult)``.
    """
    log_file, last_pt = project / f"{name}.log", project / name / "weights" / "last.pt"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0, deadline, sent = time.monotonic(), time.monotonic() + max(timeout, 1), False
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(threads), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while not sent and proc.poll() is None and time.monotonic() < deadline:
            if child_pids(proc.pid):
                with workers_stopped(proc) as workers:
                    position = saved_position(last_pt)
                    if position is not None and position[1] > 0:
                        proc.send_signal(signal.SIGTERM)  # torchrun passes it on to every worker
                        _wait_until(lambda: all(_sigterm_pending(pid) for pid in workers), 120)
                        sent = True
            time.sleep(0.05)
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass  # still going at the deadline: killed below
    finally:
        timed_out = proc.poll() is None
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run = RunResult(name, proc.returncode, read_log(log_file), project / name, time.monotonic() - t0, timed_out)
    return (saved_position(last_pt) if sent else None), run


# ----------------------------------------------------------------------------- the runs


@dataclass
class MultiRuns:
    """Launches the proof's runs: ``settings`` hold the flags every run shares."""

    settings: RunSettings
    cfg: Path
    nproc: int
    device: str
    deadline: float  # time.monotonic() at which runs still going are killed

    def flags(self, name: str, nproc: int, *extra: str) -> list:
        return self.settings.flags(self.cfg, name, "--device", devices(self.device, nproc), *extra)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, *extra: str) -> RunResult:
        """A run on ``nproc`` processes, to the end or the deadline."""
        return run_to_end(torchrun(self.nproc) + self.flags(name, self.nproc, *extra), self.settings.project, name,
                          self.remaining(), self.settings.threads)

    def stop_and_resume(self, name: str, resume_nproc: int, *extra: str) -> tuple:
        """A run on ``nproc`` processes saving after every step, SIGTERMed mid-epoch, resumed on ``resume_nproc``.

        Returns ``(position, the resumed RunResult)``; raises (ERROR or INCOMPLETE) when the stop did not happen.
        """
        cmd = torchrun(self.nproc) + self.flags(name, self.nproc, *extra, "--save-interval", "0.0001")
        position, stopped = sigterm_mid_epoch(cmd, self.settings.project, name, self.remaining(),
                                              self.settings.threads)
        if stopped.timed_out:
            raise DeadlineExceeded(f"{name} was still running at the proof's deadline and was killed")
        if position is None or position[1] <= 0:
            raise RuntimeError(f"{name}: not stopped mid-epoch (saved position {position}, exit "
                               f"{stopped.returncode}): {stopped.tail()}")
        last_pt = stopped.run_dir / "weights" / "last.pt"
        cmd = torchrun(resume_nproc) + ["--resume", str(last_pt), "--device", devices(self.device, resume_nproc),
                                        "--save-interval", "0"]
        resumed = run_to_end(cmd, self.settings.project, f"{name}-resume", self.remaining(), self.settings.threads)
        return position, RunResult(resumed.name, resumed.returncode, resumed.log, stopped.run_dir, resumed.seconds,
                                   resumed.timed_out)


def start_runs(pool, runs: MultiRuns, micro_batch: int) -> dict:
    """Submit every run; the stop-and-resume chains, the longest, first."""
    half, micro = runs.nproc // 2, ("--micro-batch", str(micro_batch))
    return {"stopped": pool.submit(runs.stop_and_resume, "stopped", runs.nproc),
            "switched": pool.submit(runs.stop_and_resume, "switched", half, *micro),
            "first": pool.submit(runs.run, "first"),
            "again": pool.submit(runs.run, "again"),
            "micro": pool.submit(runs.run, "micro", *micro)}


def reference_row(run: RunResult, nproc: int, other: RunResult | None = None):
    """The run finished on ``nproc`` processes and printed the checksum of its weights (and, given the plain
    run ``other``, ended elsewhere: had neither trained, both would hold the same initial weights)."""
    finished(run)
    world_size = run.report().get("world_size")
    ok = world_size == nproc and run.printed_checksum() == run.checksum()
    detail = (f"exit 0 in {run.seconds:.0f} s on {world_size} processes, sha256 {run.checksum()[:16]} "
              f"(printed {str(run.printed_checksum())[:16]})")
    if other is not None:
        finished(other)
        ok = ok and run.checksum() != other.checksum()
        detail += f"; {'differs from' if run.checksum() != other.checksum() else 'SAME AS'} the plain run's"
    return verdict(ok, detail, sha256=run.checksum(), seconds=run.seconds)


def resumed_row(reference: RunResult, chained: tuple, what: str):
    """The resumed run (``chained`` = (position, run)) ended with ``reference``'s checksum."""
    (epoch, batch), run = chained
    result = same_checksum(reference, run, f"SIGTERM at epoch {epoch} batch {batch}, {what}")
    result.data["position"] = [epoch, batch]
    return result


def check_rows(proof: Proof, futures: dict, nproc: int, micro_batch: int) -> None:
    """One row per claim, in the order of the module's docstring."""
    half, section = nproc // 2, "multi"
    first = lambda: futures["first"].result()  # noqa: E731
    proof.check(section, f"{nproc} processes: reference run, checksum", lambda: reference_row(first(), nproc))
    proof.check(section, f"{nproc} processes: rerun bit-identical",
                lambda: same_checksum(first(), futures["again"].result(), "rerun"))
    proof.check(section, f"{nproc} processes: SIGTERM mid-epoch + --resume bit-identical",
                lambda: resumed_row(first(), futures["stopped"].result(), f"--resume on {nproc}"))
    proof.check(section, f"{nproc} processes --micro-batch {micro_batch}: reference run, checksum",
                lambda: reference_row(futures["micro"].result(), nproc, first()))
    proof.check(section, f"{nproc} -> {half} processes --micro-batch {micro_batch}: SIGTERM + --resume bit-identical",
                lambda: resumed_row(futures["micro"].result(), futures["switched"].result(), f"--resume on {half}"))


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    """The command's flags, checked."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="multi_gpu.json", help="JSON record (written atomically, also during the run)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (NCCL, default) or cpu (gloo)")
    p.add_argument("--quick", action="store_true", help="the dry-run sizes (tiny model, 64 px, 1 epoch); for --device cpu")
    p.add_argument("--nproc", type=int, default=4, help="processes of each run (the switch goes to half as many)")
    p.add_argument("--budget", type=float, default=None, help="seconds until runs still going are killed")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs at once (default 2 on CUDA, 1 in Exclusive_Process compute mode and on the CPU)")
    p.add_argument("--workdir", default=None, help="folder that gets a new subfolder per proof (default "
                                                   "runs/multi_gpu_proof)")
    args = p.parse_args(argv)
    if args.nproc < 2 or args.nproc & (args.nproc - 1):
        raise UserError(f"--nproc {args.nproc}: must be a power of two from 2 (the switch halves it)")
    if args.budget is not None and args.budget <= 0:
        raise UserError(f"--budget {args.budget}: must be a positive number of seconds")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be at least 1")
    if args.device == "cpu" and not args.quick:
        raise UserError("--device cpu: the full plan is sized for GPUs; the dry run is --device cpu --quick")
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        raise UserError(f"--nproc {args.nproc}: this machine has {torch.cuda.device_count()} CUDA GPU(s); the "
                        "multi-GPU proof needs one per process (the dry run is --device cpu --quick)")
    return args


def runs_at_once(args, plan: Plan) -> int:
    """Runs at once: ``--jobs``, else 1 on the CPU, or on GPUs whose compute mode lets one process in each; a
    UserError when ``/dev/shm`` is too small for the data loaders and NCCL."""
    shm = preflight.shm_mib()
    if shm is not None and shm[0] < preflight.SHM_NEEDED_MIB:
        raise UserError(f"/dev/shm has {shm[0]:.0f} MiB free; the runs' data loaders and NCCL need "
                        f"{preflight.SHM_NEEDED_MIB} MiB: start the container with --shm-size=2g or --ipc=host")
    if args.jobs or args.device == "cpu":
        return args.jobs or 1
    return 1 if preflight.compute_mode(0).startswith(preflight.EXCLUSIVE) else plan.jobs


@exit_on_user_error
def main(argv=None) -> int:
    """Run the proof, print the table, write ``--out``; 0 every row passed, 1 a row FAILs, 3 incomplete."""
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    budget, jobs = args.budget or plan.budget_s, runs_at_once(args, plan)
    workdir = Path(args.workdir or DEFAULT_WORKDIR)
    workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="multi_gpu_", dir=workdir)).resolve()
    print(f"{args.nproc} processes a run on {args.device}, {jobs} run(s) at once; work folder (kept): {work}",
          flush=True)
    meta = {"command": " ".join(sys.argv), "device": args.device, "nproc": args.nproc, "quick": args.quick,
            "workdir": str(work), "torch": torch.__version__}
    proof = Proof(Path(args.out), budget + ROW_GRACE_S, meta)  # a row whose runs ended in time still starts
    settings = RunSettings(make_data(work, plan), work / "runs", args.device, plan.imgsz, plan.epochs,
                           plan.batch_size, plan.workers, threads=1 if args.device == "cpu" else None,
                           extra=["--seed", "3"])
    runs = MultiRuns(settings, plan.cfg, args.nproc, args.device, time.monotonic() + budget)

    def rows():
        with ThreadPoolExecutor(jobs) as pool:
            check_rows(proof, start_runs(pool, runs, plan.micro_batch), args.nproc, plan.micro_batch)

    return proof.conclude(rows, work)


if __name__ == "__main__":
    sys.exit(main())
