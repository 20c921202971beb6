"""Training runs started in a session of their own, watched through their output, signalled as a cluster does
(the process walks are tests/support/process_tree.py)."""

import re
import subprocess
import time
from pathlib import Path

from tests.support.launchers import ROOT, launcher_env, wait_for
from tests.support.process_tree import group_members

# tqdm's count of finished batches, e.g. "| 3/12 [": at least one batch done (the count only grows)
FINISHED_BATCH = re.compile(r"\|\s*[1-9]\d*/\d+ \[")


def start_in_own_session(cmd: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` as the leader of a new session and process group, its output going to ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**launcher_env(), "PYTHONUNBUFFERED": "1", **(env or {})},
                                start_new_session=True)


def wait_for_text(proc: subprocess.Popen, log: Path, pattern, timeout: float = 300, what: str = "") -> str:
    """Poll ``log`` until ``pattern`` (a regex) matches; fail if ``proc`` ends first. Returns the log so far."""
    pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
    deadline = time.time() + timeout
    while True:
        text = log.read_text(errors="replace")
        if pattern.search(text):
            return text
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before {what or pattern.pattern}:\n{text[-3000:]}"
        assert time.time() < deadline, f"no {what or pattern.pattern} within {timeout} s:\n{text[-3000:]}"
        time.sleep(0.05)


def wait_for_a_finished_batch(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    """Wait until training has finished at least one batch (the progress bar counts it)."""
    return wait_for_text(proc, log, FINISHED_BATCH, timeout, "finished training batch")


def wait_until_group_is_gone(pgid: int, timeout: float) -> None:
    wait_for(lambda: not group_members(pgid), timeout, f"every process of group {pgid} has ended")


def tracebacks(output: str) -> list:
    """Each Python traceback printed in ``output``, from its header to the next header."""
    return output.split("Traceback (most recent call last):")[1:]


def assert_only_torchrun_tracebacks(output: str) -> None:
    """torchrun ends with its own traceback (SignalException) after passing a signal on; no other may appear."""
    for block in tracebacks(output):
        assert "torch/distributed/elastic" in block and "SignalException" in block, block[:3000]
    assert "Second SIG" not in output and "DataLoader worker" not in output, output[-3000:]


def saved_mid_epoch_0(last_pt: Path, batches: int) -> int:
    """The batch of epoch 0 after which ``last_pt`` holds a resumable state (asserted mid-epoch)."""
    import torch

    ckpt = torch.load(last_pt, weights_only=True)
    epoch, batch = ckpt["next_position"]
    assert ckpt["optimizer"] is not None and epoch == 0 and 0 < batch < batches, (epoch, batch)
    return batch
