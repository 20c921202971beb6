"""Ctrl-C, SIGTERM and SIGUSR1 outside the training loop (start-up, audit, data scan, final validation, val.py,
detect.py): one line, exit code 128 + the signal, no traceback, and what was on disk stays whole.

Each run sends the signal to itself from inside a chosen function (tests/support/stop_launcher.py)."""

import signal
import subprocess
import sys

import pytest

from tests.support.checkpoints import write_tiny_checkpoint
from tests.support.launchers import ROOT, launcher_env
from utils.stop_signals import StopSignal, stop_line, stop_stage
from utils.training.checkpoints import load_checkpoint

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py


def stopped(script: str, target: str, name: str, *arguments, timeout: float = 240) -> tuple[int, str]:
    """(exit code, output) of ``script`` signalled with SIG``name`` when ``target`` is called."""
    cmd = [sys.executable, "tests/support/stop_launcher.py", script, target, name, *map(str, arguments)]
    proc = subprocess.run(cmd, cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def the_stop_line(output: str) -> str:
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if " stopped by SIG" in line]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def test_the_line_names_the_signal_and_the_innermost_stage():
    with pytest.raises(StopSignal) as caught:
        with stop_stage("before its first step; no checkpoint was written"), stop_stage(lambda: "after training"):
            raise StopSignal(signal.SIGTERM)
    assert stop_line("training", caught.value) == "Training stopped by SIGTERM after training."
    assert stop_line("validation", KeyboardInterrupt()) == "Validation stopped by SIGINT before it finished."


@pytest.mark.slow
def test_ctrl_c_during_the_start_up_audit_is_one_line_and_exit_130(tmp_path, tiny_cfg, shapes_data):
    code, output = stopped("train", "train:start_up_audit", "INT", "--cfg", tiny_cfg, "--data", shapes_data,
                           "--imgsz", 64, "--epochs", 1, "--device", "cpu", "--workers", 0,
                           "--project", tmp_path, "--name", "exp")
    assert code == 130, output[-3000:]
    assert the_stop_line(output) == "Training stopped by SIGINT before its first step; no checkpoint was written."
    assert not (tmp_path / "exp").exists()


@pytest.mark.slow
def test_sigterm_during_the_final_validation_keeps_the_finished_weights(tmp_path, tiny_cfg, shapes_data):
    code, output = stopped("train", "train:load_backend", "TERM", "--cfg", tiny_cfg, "--data", shapes_data,
                           "--imgsz", 64, "--epochs", 1, "--batch-size", 8, "--device", "cpu", "--workers", 0,
                           "--noplots", "--project", tmp_path, "--name", "exp")
    assert code == 143, output[-3000:]
    weights = tmp_path / "exp" / "weights"
    assert the_stop_line(output) == (f"Training stopped by SIGTERM after training finished. On disk in {weights}: "
                                     "last.pt after epoch 0 with the final weights; best.pt from epoch 0.")
    assert load_checkpoint(weights / "last.pt").get("optimizer") is None  # stripped: the run is complete
    assert (weights / "sha256.txt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("script,target,name,code", [
    ("val", "utils.dataset.label_cache:_cached_scan", "TERM", 143),
    ("detect", "detect:open_source", "INT", 130),
])
def test_val_and_detect_stop_with_one_line(tmp_path, tiny_cfg, shapes_data, script, target, name, code):
    weights = write_tiny_checkpoint(tiny_cfg, tmp_path / "tiny.pt")
    where = ["--data", shapes_data] if script == "val" else ["--source", shapes_data.parent / "shapes/images/val"]
    exit_code, output = stopped(script, target, name, "--weights", weights, *where, "--imgsz", 64,
                                "--device", "cpu", "--project", tmp_path / "runs")
    assert exit_code == code, output[-3000:]
    program = "Validation" if script == "val" else "Detection"
    assert the_stop_line(output) == f"{program} stopped by SIG{name} before it finished."


@pytest.mark.slow
def test_ctrl_c_while_a_loader_starts_its_workers_exits_without_waiting_for_them(tmp_path, tiny_cfg, shapes_data):
    """The half-made loader's destructor printed a traceback, and the exit waited forever for its workers, which
    leave stop signals to the main process."""
    weights = write_tiny_checkpoint(tiny_cfg, tmp_path / "tiny.pt")
    code, output = stopped("val", "torch.utils.data._utils.signal_handling:_set_SIGCHLD_handler", "raise",
                           "--weights", weights, "--data", shapes_data, "--imgsz", 64, "--batch-size", 4,
                           "--workers", 2, "--device", "cpu", "--project", tmp_path / "runs", timeout=120)
    assert code == 130, output[-3000:]
    assert the_stop_line(output) == "Validation stopped by SIGINT before it finished."
