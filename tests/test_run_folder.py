"""One training process per run folder (utils/training/run_folder.py): the lock, a bare --resume, and train.py
refusing a folder another training writes in."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from utils.errors import UserError
from utils.training.run_folder import (LOCK_NAME, check_run_folder_free, claim_new_folder, holder_pid,
                                       hold_run_folder, latest_checkpoint)

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]


def make_run(folder: Path, mtime: float) -> Path:
    last = folder / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"checkpoint")
    os.utime(last, (mtime, mtime))
    return last


def test_a_held_folder_names_its_holder_and_is_free_again_after_the_block(tmp_path):
    assert holder_pid(tmp_path) is None  # no lock file yet
    with hold_run_folder(tmp_path, "--name exp"):
        assert holder_pid(tmp_path) == os.getpid()
        with pytest.raises(UserError, match=rf"^--resume x: {tmp_path} is in use: process {os.getpid()} is training"):
            check_run_folder_free(tmp_path, "--resume x")
        with pytest.raises(UserError, match=f"--name exp: {tmp_path} is in use"):
            with hold_run_folder(tmp_path, "--name exp"):  # a second holder, even in the same process
                pass
    assert (tmp_path / LOCK_NAME).is_file() and holder_pid(tmp_path) is None
    check_run_folder_free(tmp_path, "--resume x")


@pytest.mark.slow
def test_the_lock_dies_with_the_training_even_while_a_forked_worker_lives_on(tmp_path):
    """SIGKILL of a training whose data loader workers (forked) outlive it for a moment: --resume at once must
    find the folder free (the GPU proof's kill-and-resume row found it held by the dead training's pid)."""
    code = ("import multiprocessing, os, signal, sys, time\n"
            "from utils.training.run_folder import hold_run_folder\n"
            "with hold_run_folder(sys.argv[1], 'x'):\n"
            "    child = multiprocessing.get_context('fork').Process(target=time.sleep, args=(60,))\n"
            "    child.start()\n"
            "    open(os.path.join(sys.argv[1], 'child.pid'), 'w').write(str(child.pid))\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)  # no pipes: the living child would hold them open
    assert done.returncode == -signal.SIGKILL
    child = int((tmp_path / "child.pid").read_text())
    try:
        assert Path(f"/proc/{child}").exists()  # the worker lives on
        assert holder_pid(tmp_path) is None
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_bare_resume_never_picks_a_run_that_is_still_training(tmp_path):
    older = make_run(tmp_path / "exp", 1_000_000)
    newer = make_run(tmp_path / "exp2", 2_000_000)
    assert latest_checkpoint(tmp_path) == newer
    with hold_run_folder(tmp_path / "exp2", "--name exp2"):
        with pytest.raises(UserError) as raised:
            latest_checkpoint(tmp_path)
        message = str(raised.value)
        assert f"the newest last.pt is {newer}" in message and f"e.g. --resume {older}" in message
        with hold_run_folder(tmp_path / "exp", "--name exp"):
            with pytest.raises(UserError, match="wait for that run to end"):
                latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path) == newer


def test_no_checkpoint_to_resume_is_one_line(tmp_path):
    with pytest.raises(UserError, match=f"no last.pt found under {tmp_path}"):
        latest_checkpoint(tmp_path)


@pytest.mark.slow
def test_train_refuses_a_folder_another_training_writes_and_the_lock_dies_with_it(shapes_data, tiny_cfg, tmp_path):
    """A second train.py into the live run's folder (--exist-ok, or --resume of it) exits 2 with one line and
    changes nothing there; SIGKILL of the live run leaves no stale lock."""
    run = tmp_path / "exp"
    live = subprocess.Popen(
        [sys.executable, "train.py", "--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64",
         "--batch-size", "2", "--epochs", "200", "--workers", "0", "--device", "cpu", "--noplots",
         "--project", str(tmp_path), "--name", "exp"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        for line in live.stdout:
            if line.startswith("Starting training"):
                break
        assert live.poll() is None and holder_pid(run) == live.pid
        # Paused, it holds its lock as it did running, and leaves the CPU to the two refused runs below.
        live.send_signal(signal.SIGSTOP)
        start_files = ("hyp.yaml", "opt.yaml", "environment.yaml")  # what a second run would write first
        written = {name: (run / name).read_bytes() for name in start_files}
        second = ["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64", "--epochs", "1",
                  "--device", "cpu", "--project", str(tmp_path), "--name", "exp", "--exist-ok"]
        for flags in (second, ["--resume", str(run)]):
            out = subprocess.run([sys.executable, "train.py", *flags], cwd=ROOT, capture_output=True, text=True,
                                 timeout=300)
            assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
            error = [line for line in out.stderr.splitlines() if line.strip()][-1]
            assert error.startswith("ERROR: --") and f"{run} is in use: process {live.pid} is training" in error
            assert "Traceback" not in out.stderr
        assert live.poll() is None
        assert {name: (run / name).read_bytes() for name in start_files} == written
    finally:
        live.send_signal(signal.SIGKILL)
        live.communicate(timeout=60)
    assert holder_pid(run) is None


def test_a_folder_where_the_lock_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(UserError, match=rf"^--name exp: cannot write in {tmp_path} \(Permission denied\); choose"):
        with hold_run_folder(tmp_path, "--name exp"):
            pass


def test_a_new_run_whose_name_was_taken_since_start_up_takes_the_next_free_one(tmp_path):
    base = tmp_path / "exp"
    assert claim_new_folder(base, base) == base and base.is_dir()
    assert claim_new_folder(base, base) == tmp_path / "exp2"  # made by a run launched beside it
    assert claim_new_folder(tmp_path / "exp2", base) == tmp_path / "exp3"
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert claim_new_folder(blocked / "exp", blocked / "exp") == blocked / "exp"  # left to the write check's line


@pytest.mark.slow
def test_runs_launched_together_under_one_name_train_into_their_own_folders(shapes_data, tiny_cfg, tmp_path):
    """Both chose runs/exp at start-up; the one that makes its folder second trains in exp2."""
    import train
    from utils.ddp import dist_info_from_env

    opt = train.parse_opt(["--cfg", str(tiny_cfg), "--data", str(shapes_data), "--imgsz", "64", "--batch-size", "4",
                           "--epochs", "1", "--workers", "0", "--device", "cpu", "--noplots", "--project",
                           str(tmp_path), "--name", "exp"])
    opt, _ = train.resolve_options(opt, [])
    assert Path(opt.save_dir) == tmp_path / "exp"
    (tmp_path / "exp").mkdir()  # the other run's folder, made while this one read its data
    with hold_run_folder(tmp_path / "exp", "--name exp"):
        train.train(train.load_hyp(opt), opt, torch.device("cpu"), dist_info_from_env())
    assert opt.save_dir == str(tmp_path / "exp2")
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == [LOCK_NAME]
    assert (tmp_path / "exp2" / "weights" / "last.pt").is_file()
    assert yaml.safe_load((tmp_path / "exp2" / "opt.yaml").read_text())["save_dir"] == str(tmp_path / "exp2")


def test_a_file_system_that_cannot_lock_trains_unchecked_with_one_warning(tmp_path, monkeypatch, log_lines):
    import errno

    from utils.training import run_folder

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_folder.fcntl, "flock", no_locks)
    with hold_run_folder(tmp_path, "--name exp"):
        assert holder_pid(tmp_path) is None
    assert [m for m in log_lines if "cannot lock" in m] == [
        f"WARNING ⚠️ {tmp_path}: this file system cannot lock files, so nothing stops a second training from writing in this "
        "run folder; start one run per folder"]
