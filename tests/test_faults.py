"""Fault injection: full disks, read-only folders, writes that fail halfway, signals at awkward moments.

Every case checks the exit code, the message, and that each file left on disk loads with
``weights_only=True`` and is what the message says it is.

Runs that end by a signal, run as another user, or fill a real tmpfs are child processes. The injected full disk
and the read-only resume end through train.py's ``cli()`` called in this process (:func:`cli_in_process`): the
same error handling, ERROR line and exit code as the command, without a second interpreter and torch import.
"""

import contextlib
import errno
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import write_shapes_dataset
from utils.training import checkpoints, run_state
from utils.training.checkpoints import state_dict_sha256
from utils.errors import UserError
from utils.files import atomic_write_bytes, ensure_writable_dir, remove_orphaned_temp_files, replace_folder
from utils.training.run_state import CheckpointNotSaved, CheckpointSaver

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "models" / "tiny.yaml"
NOBODY = 65534
POSITION = re.compile(r"last\.pt (?:after epoch (\d+)|at epoch (\d+) batch (\d+))")


pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


# ------------------------------------------------------------------------------------ helpers


def fake_state(position, value: float = 1.0) -> dict:
    """A small checkpoint-shaped state at ``position`` (weights filled with ``value``)."""
    weights = {"w": torch.full((4,), value), "b": torch.zeros(2)}
    return {"model_cfg": {}, "model": weights, "ema": dict(weights), "optimizer": {"state": {}},
            "next_position": list(position)}


def saver_in(folder: Path, **kwargs) -> CheckpointSaver:
    return CheckpointSaver(folder / "last.pt", folder / "best.pt", folder, **kwargs)


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str):
    """A tmpfs at ``where`` (root with mount rights only); skips the test with a reason otherwise."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); the injected-fault variant covers this case")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"mounting a tmpfs is not allowed here ({made.stderr.strip()}); "
                    "the injected-fault variant covers this case")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path, leave_free: int) -> None:
    """Fill the file system of ``folder`` until about ``leave_free`` bytes remain."""
    stats = os.statvfs(folder)
    size = stats.f_bavail * stats.f_frsize - leave_free
    if size > 0:
        (folder / "filler").write_bytes(b"\0" * size)


def position_in_message(text: str):
    """The last.pt position a message reports as (epoch, batch), or None if it says there is none."""
    found = POSITION.findall(text)
    if not found:
        return None
    after, epoch, batch = found[-1]
    return (int(after) + 1, 0) if after else (int(epoch), int(batch))


def assert_disk_matches(weights: Path, output: str) -> dict:
    """Every file in ``weights`` loads, no temporary file is left, and last.pt is where the output says."""
    assert not list(weights.glob(".*.tmp")), sorted(p.name for p in weights.glob(".*"))
    loaded = {p.name: torch.load(p, weights_only=True) for p in weights.glob("*.pt")}
    claimed = position_in_message(output)
    if claimed is None:
        assert "no last.pt" in output and "last.pt" not in loaded, output[-1500:]
    else:
        assert tuple(loaded["last.pt"]["next_position"]) == claimed, output[-1500:]
    if "no best.pt" in output:
        assert "best.pt" not in loaded
    return loaded


def world_readable_tmp(prefix: str) -> Path:
    """A fresh folder others (the nobody user) can read and traverse."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def small_data():
    """4 train / 2 val images in a folder every user can read (for runs as nobody)."""
    root = world_readable_tmp("faults-data-")
    yaml_file = write_shapes_dataset(root, n_train=4, n_val=2)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield yaml_file
    shutil.rmtree(root, ignore_errors=True)


def train_args(data, project: Path, *extra) -> list:
    return ["--cfg", str(TINY), "--data", str(data), "--imgsz", "64", "--batch-size", "2", "--epochs", "2",
            "--workers", "0", "--device", "cpu", "--noplots", "--noautoanchor", "--save-interval", "0",
            "--project", str(project), "--name", "exp", *extra]


def train_cmd(data, project: Path, fault: str = "none", *extra) -> list:
    return [sys.executable, str(ROOT / "tests" / "support" / "fault_launcher.py"), fault,
            *train_args(data, project, *extra)]


def cli_in_process(args: list, monkeypatch, capfd, log_lines, fault: str = "none") -> subprocess.CompletedProcess:
    """train.py's ``cli()`` (the command line's own error handling and exit codes) run in this process with
    ``args`` as its arguments and ``fault`` injected as tests/support/fault_launcher.py injects it: what a
    child process would exit with, and print (stdout: the log's lines, then what else reached stdout;
    stderr: what reached stderr, the ERROR line), without starting Python and torch again."""
    import train
    from tests.support import fault_launcher

    monkeypatch.setattr(checkpoints, "atomic_open", checkpoints.atomic_open)  # restored after the test
    fault_launcher.install(fault)
    monkeypatch.setattr(sys, "argv", ["train.py", *map(str, args)])
    capfd.readouterr()
    logged = len(log_lines)
    with pytest.raises(SystemExit) as exited:
        train.cli()
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, exited.value.code, "\n".join(log_lines[logged:]) + "\n" + out, err)


def run_train(cmd, timeout: float = 600, prefix=()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLCONFIGDIR": tempfile.gettempdir()}
    return subprocess.run([*prefix, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def full_checkpoint_size(data) -> int:
    """Bytes of a tiny-model training checkpoint (model, EMA, optimizer state, gradients)."""
    from models.yolo import Model
    from utils.torch_utils import ModelEMA, smart_optimizer

    model = Model(str(TINY), nc=4)
    optimizer = smart_optimizer(model, "SGD", 0.01, 0.9, 0.0005)
    model(torch.zeros(1, 3, 64, 64))[0].sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "ema": ModelEMA(model).ema.state_dict(), "optimizer": optimizer.state_dict(),
             "grads": [p.grad for p in model.parameters()]}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.tell()


# ------------------------------------------------------------------------------------ files


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "a.yaml", b"x: 1\n")
        checkpoints.save_checkpoint(fake_state((1, 0)), tmp_path / "last.pt")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.yaml").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "last.pt").stat().st_mode) == mode


def test_orphaned_checkpoint_temp_files_are_removed_at_the_next_save(tmp_path, log_lines):
    orphans = [tmp_path / ".last.pt.k2j3h4.tmp", tmp_path / ".best.pt.abc_12.tmp"]
    for orphan in orphans:
        orphan.write_bytes(b"\0" * 1000)
    unrelated = [tmp_path / ".results.csv.x1y2.tmp", tmp_path / "notes.tmp"]
    for path in unrelated:
        path.write_bytes(b"keep")
    assert saver_in(tmp_path).save_last(fake_state((0, 3)))
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in unrelated)
    assert "Removed 2 temporary file(s)" in "\n".join(log_lines)
    assert remove_orphaned_temp_files(tmp_path) == []


def test_writable_dir_check_names_the_option_and_the_folder(tmp_path):
    assert ensure_writable_dir(tmp_path / "new" / "weights", "--project x").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    with pytest.raises(UserError, match=r"^--project p: cannot write in .*file/exp \(.+\); choose a writable"):
        ensure_writable_dir(blocker / "exp", "--project p")


def test_read_only_tmpfs_is_one_user_error(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        with pytest.raises(UserError, match="Read-only file system"):
            ensure_writable_dir(ro / "exp" / "weights", f"--project {ro}")


# ------------------------------------------------------------------------------------ saver


def failing_save(error=OSError(errno.ENOSPC, "No space left on device")):
    def save(*args, **kwargs):
        raise error
    return save


def test_failed_first_save_stops_the_run_with_nothing_on_disk(tmp_path, monkeypatch):
    saver = saver_in(tmp_path)
    monkeypatch.setattr(run_state, "save_checkpoint", failing_save())
    with pytest.raises(CheckpointNotSaved, match=r"last.pt \(No space left on device\); no earlier last.pt .* "
                                                 r"nothing is saved"):
        saver.save_epoch(fake_state((1, 0)), 0, improved=True)
    assert not saver.save_last(fake_state((1, 2)), required=False)  # an interrupt save reports, never raises
    assert saver.describe().endswith("no last.pt; no best.pt.") and saver.resume_command() is None


def test_failed_save_after_a_good_one_warns_how_far_behind_and_keeps_the_file(tmp_path, monkeypatch, log_lines):
    saver = saver_in(tmp_path)
    saver.save_epoch(fake_state((1, 0)), 0, improved=True)
    before = (tmp_path / "last.pt").read_bytes()
    monkeypatch.setattr(run_state, "save_checkpoint", failing_save())
    saver.save_epoch(fake_state((2, 0), 2.0), 1, improved=True)
    saver.save_epoch(fake_state((3, 0), 3.0), 2, improved=False)
    log = "\n".join(log_lines)
    assert "last.pt still holds after epoch 0, 1 epoch behind; training continues" in log
    assert "last.pt still holds after epoch 0, 2 epochs behind; training continues" in log
    assert "best.pt still holds epoch 0, not the new best epoch 1" in log
    assert (tmp_path / "last.pt").read_bytes() == before
    assert "last.pt after epoch 0 (resumable); best.pt from epoch 0 (stale" in saver.describe()


def test_finish_refuses_a_stale_last_pt_and_leaves_it_resumable(tmp_path, monkeypatch):
    saver = saver_in(tmp_path)
    saver.save_epoch(fake_state((1, 0)), 0, improved=True)
    monkeypatch.setattr(run_state, "save_checkpoint", failing_save())
    saver.save_epoch(fake_state((2, 0), 2.0), 1, improved=True)
    with pytest.raises(CheckpointNotSaved, match=r"the final weights \(after epoch 1\) could not be saved\. "
                                                 r"On disk in .*: last.pt after epoch 0 \(resumable\).*--resume"):
        saver.finish((2, 0))
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert "finished" not in ckpt and ckpt["optimizer"] is not None and ckpt["next_position"] == [1, 0]
    assert not (tmp_path.parent / "weights" / "sha256.txt").exists() and not (tmp_path / "sha256.txt").exists()


def test_finish_checksums_the_weights_in_the_file_and_skips_a_stale_best(tmp_path, monkeypatch, log_lines):
    weights = tmp_path / "weights"
    saver = saver_in(weights)
    saver.save_epoch(fake_state((1, 0)), 0, improved=True)
    real_save = run_state.save_checkpoint
    monkeypatch.setattr(run_state, "save_checkpoint",
                        lambda state, path, on_commit=None: failing_save()() if path.name == "best.pt"
                        else real_save(state, path, on_commit=on_commit))
    saver.save_epoch(fake_state((2, 0), 2.0), 1, improved=True)
    expected = state_dict_sha256(torch.load(weights / "last.pt", weights_only=True)["ema"])
    assert saver.finish((2, 0)) == weights / "last.pt"  # the stale best.pt is not the result
    assert (weights / "sha256.txt").read_text().split()[0] == expected
    assert torch.load(weights / "last.pt", weights_only=True)["finished"] is True
    best = torch.load(weights / "best.pt", weights_only=True)
    assert "finished" not in best and best["next_position"] == [1, 0]
    assert "best.pt is stale (epoch 0; the best epoch 1 could not be saved)" in "\n".join(log_lines)


def test_a_write_that_fails_halfway_leaves_the_previous_file_and_no_temp(tmp_path, monkeypatch):
    saver = saver_in(tmp_path)
    saver.save_last(fake_state((0, 1)))
    before = (tmp_path / "last.pt").read_bytes()
    from tests.support import fault_launcher

    monkeypatch.setattr(checkpoints, "atomic_open", checkpoints.atomic_open)  # restored after the test
    fault_launcher.install("enospc:0")
    assert not saver.save_last(fake_state((0, 2), 5.0))
    assert (tmp_path / "last.pt").read_bytes() == before and not list(tmp_path.glob(".*.tmp"))
    assert saver.last_position == (0, 1)


def folder_files(folder):
    """{relative path: bytes} of every file under ``folder``."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_replace_folder_swaps_whole_folders_and_restores_on_failure(tmp_path, monkeypatch):
    dst, src = tmp_path / "m_openvino_model", tmp_path / ".new"
    for folder, files in ((dst, {"m.xml": b"old", "stale.bin": b"old"}), (src, {"m.xml": b"new", "m.bin": b"new"})):
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
    real_replace = os.replace

    def fail_moving_src(a, b):
        if Path(a) == src:
            raise OSError(errno.EXDEV, "cross-device link")
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", fail_moving_src)
    with pytest.raises(OSError):
        replace_folder(src, dst)
    assert folder_files(dst) == {"m.xml": b"old", "stale.bin": b"old"} and src.is_dir()
    monkeypatch.setattr(os, "replace", real_replace)
    replace_folder(src, dst)
    assert folder_files(dst) == {"m.bin": b"new", "m.xml": b"new"}  # no file of the old folder survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m_openvino_model"]


def test_read_only_folder_on_a_tmpfs_keeps_training_honest(tmp_path, log_lines):
    with mounted_tmpfs(tmp_path / "disk", "size=2m") as disk:
        saver = saver_in(disk)
        saver.save_last(fake_state((0, 1)))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        saver.save_epoch(fake_state((1, 0)), 0, improved=True)
        assert "Read-only file system" in "\n".join(log_lines)
        assert "no best.pt exists" in "\n".join(log_lines)  # never "the previous best.pt is intact"
        assert_disk_matches(disk, saver.describe())


# ------------------------------------------------------------------------------------ signals

LONG_OP = """
import sys, torch
sys.path.insert(0, {root!r})
from utils.files import atomic_open
from utils.training.interrupts import GracefulInterrupt
torch.set_num_threads(1)
a = torch.randn(1800, 1800, dtype=torch.float64)
with GracefulInterrupt(describe_saved=lambda: "On disk: the old target.") as g:
    with atomic_open({target!r}) as f:
        f.write(b"partial new content")
        print("ready", flush=True)
        torch.linalg.svd(a)  # one long op: both signals arrive while it runs
        print("op finished", flush=True)
"""


@pytest.mark.slow
def test_second_signal_within_one_long_op_abandons_the_write_and_exits_at_once(tmp_path):
    target = tmp_path / "last.pt"
    target.write_bytes(b"old complete content")
    script = LONG_OP.format(root=str(ROOT), target=str(target))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "op finished" not in out
    assert "Second SIGTERM: exiting now; abandoned the unfinished write of last.pt. On disk: the old target." in out
    assert target.read_bytes() == b"old complete content" and not list(tmp_path.glob(".*.tmp"))


FORKED_WORKER = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from utils.training.interrupts import GracefulInterrupt
with GracefulInterrupt() as g:
    release_r, release_w = os.pipe()
    pid = os.fork()  # as a data-loader worker is started
    if pid == 0:
        os.read(release_r, 1)  # alive until the parent has signalled it, however slow the machine
        os._exit(0)
    time.sleep(0.5)
    os.kill(pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the workers too
    os.kill(pid, signal.SIGINT)
    time.sleep(0.5)  # the worker handles both while it is alive
    os.write(release_w, b"x")
    os.waitpid(pid, 0)
    time.sleep(0.5)
    print("parent count", g.count, flush=True)
"""


@pytest.mark.slow
def test_signals_to_a_forked_worker_are_not_counted_by_the_parent():
    script = FORKED_WORKER.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "parent count 0" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------------------------------ training runs


@pytest.mark.slow
def test_full_disk_from_the_start_exits_non_zero_with_nothing_claimed(small_data, tmp_path, monkeypatch, capfd,
                                                                     log_lines):
    result = cli_in_process(train_args(small_data, tmp_path), monkeypatch, capfd, log_lines, "enospc:0")
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-3000:]
    assert re.search(r"ERROR: Could not write \S+/last.pt \(No space left on device\); no earlier last.pt of this "
                     r"run exists, so nothing is saved", out), out[-3000:]
    assert "Results saved" not in out and "Traceback" not in out
    weights = tmp_path / "exp" / "weights"
    assert not list(weights.iterdir())


@pytest.mark.slow
def test_full_tmpfs_from_the_start_exits_non_zero(small_data, tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "size=2m") as disk:
        fill(disk, 64 * 1024)
        result = run_train(train_cmd(small_data, disk))
        out = result.stdout + result.stderr
        assert result.returncode == 2, out[-3000:]
        assert "(No space left on device); no earlier last.pt of this run exists, so nothing is saved" in out
        assert "Traceback" not in out
        assert_disk_matches(disk / "exp" / "weights", "no last.pt; no best.pt")


def assert_stale_run(result, weights: Path) -> None:
    """A run whose disk filled after the first save: warned, exit 2, epoch-0 last.pt left resumable."""
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-3000:]
    assert "last.pt still holds after epoch 0, 1 epoch behind; training continues" in out
    final = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert len(final) == 1 and "the final weights (after epoch 1) could not be saved" in final[0], out[-3000:]
    assert "last.pt after epoch 0 (resumable); no best.pt" in final[0] and "--resume" in final[0]
    loaded = assert_disk_matches(weights, final[0])
    assert loaded["last.pt"]["optimizer"] is not None and "finished" not in loaded["last.pt"]
    assert not (weights / "sha256.txt").exists() and "Results saved" not in out


@pytest.mark.slow
def test_disk_filling_after_the_first_save_never_marks_a_stale_file_finished(small_data, tmp_path, monkeypatch,
                                                                             capfd, log_lines):
    # best.pt and later writes fail halfway
    result = cli_in_process(train_args(small_data, tmp_path), monkeypatch, capfd, log_lines, "enospc:1")
    assert_stale_run(result, tmp_path / "exp" / "weights")


@pytest.mark.slow
def test_tmpfs_filling_after_the_first_save_then_read_only_resume(small_data, tmp_path, monkeypatch, capfd,
                                                                  log_lines):
    with mounted_tmpfs(tmp_path / "disk", "size=4m") as disk:
        fill(disk, int(full_checkpoint_size(small_data) * 1.5) + 32 * 1024)
        result = run_train(train_cmd(small_data, disk))
        weights = disk / "exp" / "weights"
        assert_stale_run(result, weights)
        before = (weights / "last.pt").read_bytes()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        resumed = cli_in_process(["--resume", weights / "last.pt"], monkeypatch, capfd, log_lines)
        assert resumed.returncode == 2 and "Traceback" not in resumed.stderr
        assert f"ERROR: --resume {weights / 'last.pt'}: cannot write in {weights} (Read-only file system)" \
               in resumed.stderr
        assert (weights / "last.pt").read_bytes() == before


TORCH_THEN_WRITE = "import importlib.util, sys; open(importlib.util.find_spec('torch').origin).close(); " \
                   "open(sys.argv[1], 'w')"


def without_root_override() -> list:
    """A command prefix under which permission bits bind (root ignores them otherwise).

    As root: drop the capabilities that override them (``setpriv --bounding-set``), else run as
    the nobody user; skips with the reason when neither works here.
    """
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a chmod-ed folder stays writable for root, cannot test")
    probe_dir = world_readable_tmp("faults-probe-")
    probe_dir.chmod(0o555)
    reasons = []
    try:
        for prefix in (["setpriv", "--bounding-set=-dac_override,-dac_read_search"],
                       ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]):
            # torch's package must be readable under the prefix (finding and opening it, not importing it: fast)
            probe = subprocess.run([*prefix, sys.executable, "-c", TORCH_THEN_WRITE, str(probe_dir / "x")],
                                   capture_output=True, text=True, cwd=tempfile.gettempdir())
            if "PermissionError" in probe.stderr:
                return prefix
            reasons.append(probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else "write succeeded")
    finally:
        probe_dir.chmod(0o755)
        shutil.rmtree(probe_dir, ignore_errors=True)
    pytest.skip(f"cannot drop root's permission override here ({'; '.join(reasons)})")


@pytest.mark.slow
def test_read_only_project_folder_is_one_line_and_exit_2(small_data):
    prefix = without_root_override()
    project = world_readable_tmp("faults-ro-")
    try:
        project.chmod(0o555)
        result = run_train(train_cmd(small_data, project), prefix=prefix)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        assert "Traceback" not in result.stderr  # the label scan's progress may come first (no cache yet)
        assert result.stderr.strip().splitlines()[-1] == (
            f"ERROR: --project {project} --name exp: cannot write in {project / 'exp' / 'weights'} "
            "(Permission denied); choose a writable folder or fix its permissions")
        assert list(project.iterdir()) == []
    finally:
        project.chmod(0o755)
        shutil.rmtree(project, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["data", "quad"])
def test_rejected_data_yaml_or_option_leaves_no_run_folder(bad, small_data, tmp_path):
    import train

    options = dict(cfg=str(TINY), data=str(small_data), imgsz=64, batch_size=2, epochs=1, workers=0, device="cpu",
                   noplots=True, project=str(tmp_path / "runs"), name="exp")
    if bad == "data":
        options["data"] = str(tmp_path / "bad.yaml")
        Path(options["data"]).write_text("train: nowhere/images\nval: nowhere/images\nnames: [a]\n")
    else:
        options["quad"] = True
    with pytest.raises(UserError):
        train.run(**options)
    assert not (tmp_path / "runs").exists()


def start_with_marker(cmd, marker: str):
    """Start ``cmd``; return (process, output so far) once a line starts with ``marker``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(marker):
            return proc, seen
    proc.wait()
    pytest.fail(f"{marker!r} never printed:\n{''.join(seen)[-3000:]}")


@pytest.mark.slow
def test_one_sigterm_during_a_save_lets_it_finish_and_reports_what_is_saved(small_data, tmp_path):
    proc, seen = start_with_marker(train_cmd(small_data, tmp_path, "slow:2"), "FAULT: writing last.pt")
    proc.send_signal(signal.SIGTERM)
    out = "".join(seen) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "Training interrupted. On disk in" in out and "last.pt is saved" not in out
    report = out[out.index("Training interrupted."):]
    loaded = assert_disk_matches(tmp_path / "exp" / "weights", report)
    assert loaded["last.pt"]["optimizer"] is not None and "(resumable)" in report and "Resume with" in report


@pytest.mark.slow
def test_two_sigterms_during_a_save_abandon_it_and_exit_at_once(small_data, tmp_path):
    proc, seen = start_with_marker(train_cmd(small_data, tmp_path, "slow:20"), "FAULT: writing last.pt")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = "".join(seen) + proc.communicate(timeout=15)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "FAULT: wrote" not in out
    line = re.search(r"Second SIGTERM.*", out)[0]
    assert "abandoned the unfinished write of last.pt" in line and "no last.pt; no best.pt" in line
    assert_disk_matches(tmp_path / "exp" / "weights", line)


@pytest.mark.slow
def test_two_sigterms_within_a_batch_exit_with_an_honest_report(small_data, tmp_path):
    proc, seen = start_with_marker(train_cmd(small_data, tmp_path, "none", "--epochs", "20"), "Starting training")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = "".join(seen) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    second = re.search(r"Second SIGTERM.*", out)
    report = second[0] if second else out[out.index("Training interrupted."):]
    assert "last.pt is saved" not in out
    assert_disk_matches(tmp_path / "exp" / "weights", report)


@pytest.mark.slow
def test_sigterm_on_a_full_disk_says_nothing_was_saved(small_data, tmp_path):
    proc, seen = start_with_marker(train_cmd(small_data, tmp_path, "enospc:0", "--epochs", "20"), "Starting training")
    proc.send_signal(signal.SIGTERM)
    out = "".join(seen) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    report = re.search(r"Training interrupted\..*", out)[0]
    assert report.endswith("no last.pt; no best.pt.") and "Resume with" not in out, out[-3000:]
    assert_disk_matches(tmp_path / "exp" / "weights", report)


def test_finish_that_cannot_strip_last_pt_is_not_a_success(tmp_path, monkeypatch):
    saver = saver_in(tmp_path)
    saver.save_epoch(fake_state((1, 0)), 0, improved=False)
    before = (tmp_path / "last.pt").read_bytes()
    monkeypatch.setattr(run_state, "save_checkpoint", failing_save())
    with pytest.raises(CheckpointNotSaved, match=r"complete but not stripped or marked finished .*--resume"):
        saver.finish((1, 0))
    assert (tmp_path / "last.pt").read_bytes() == before
