"""Two torchrun launchers on one machine acting as two nodes (gloo on CPU): a node lost as a machine fails.

Killing one node must make the other exit non-zero, with one line, instead of hanging. The two-node run that
must end with a one-node run's weights and results.csv, stopped by SIGTERM to one node and resumed on both,
is in tests/test_ddp.py: it compares with that file's two-process run, which a test here would launch again.
"""

import time

import pytest

from tests.support.two_nodes import TIMEOUT_S, kill_node, start_two_nodes, stop_all, wait_for_line

COMMON = ["--imgsz", "64", "--batch-size", "8", "--device", "cpu", "--workers", "0", "--noplots", "--exist-ok",
          "--save-interval", "0"]


@pytest.mark.slow
def test_a_killed_node_makes_the_other_exit_non_zero_within_the_timeout(shapes_data, tiny_cfg, tmp_path):
    """SIGKILL node 1's launcher once training has started: node 0 must fail, not hang (process-group timeout 30 s)."""
    args = ["--data", shapes_data, "--cfg", tiny_cfg, "--project", tmp_path, "--name", "killed", *COMMON,
            "--epochs", "50"]  # long enough to be killed mid-run
    logs = tmp_path.parent / f"{tmp_path.name}-logs"
    procs = start_two_nodes(args, logs, FFCA_DDP_TIMEOUT_MIN="0.5")
    try:
        wait_for_line(procs[0], logs / "node0.log", "Starting training")  # node 0's rank 0 logs for the run
        kill_node(procs[1])
        killed_at = time.monotonic()
        code = procs[0].wait(timeout=TIMEOUT_S)
        waited = time.monotonic() - killed_at
    finally:
        stop_all(procs)
    output = (logs / "node0.log").read_text()
    assert code != 0, output[-3000:]
    assert waited < 30 + 120, waited  # the 30 s timeout plus the launcher's own shutdown on a loaded machine
    assert "epochs completed" not in output  # it stopped, it did not finish
    # one line naming the lost rank and the timeout instead of gloo's traceback
    assert "ERROR: rank 0 lost rank 1 at [127.0.0.1]:" in output and "FFCA_DDP_TIMEOUT_MIN=0.5 min" in output
    assert "[rank0]: Traceback" not in output and "exitcode  : 1 " in output, output[-3000:]
