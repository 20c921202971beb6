"""SIGTERM in the middle of an epoch and ``--resume`` under DDP with 3 ranks (gloo on CPU).

With two ranks every element-wise gradient sum is ``a + b == b + a``, so a resume that reduces in
another order cannot show. From three ranks on ``(a + b) + c != a + (b + c)`` in the last bit, and a
fresh DDP object (which every ``--resume`` builds) starts on other gradient buckets than the
uninterrupted run is using by then. These runs end with the uninterrupted run's checksum only when
the reduction order is independent of the bucket layout (utils/ddp.py, ``rank_ordered_mean_hook``).

Three ranks are the fewest on which the order shows, and the hook is one code path for every world size:
tests/test_ddp_reduction.py checks it bit for bit on 4 ranks, and tests/test_world_size_invariance.py stops
a 4-process run mid-epoch and resumes it (on 2) to the same bits, so a fourth rank here would prove nothing new.

One epoch is enough: DDP lays its buckets out anew after its first step, and the stop comes once a step is
saved, so the resumed run's fresh DDP takes its first step on other buckets than the uninterrupted run uses
there (with ``--deterministic off``, DDP's own all-reduce, this run ends with another checksum). A stop in a
later epoch of a multi-process run is tests/test_world_size_invariance.py's (epoch 1 of 2, ``--micro-batch``).
The stopped and the resumed run read the uninterrupted run's start-up audit from a cache
(``audit_once_per_model``, tests/conftest.py).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_shapes_dataset
from tests.support.launchers import launcher_env, saved_position, sigterm_at
from tests.support.run_outputs import assert_identical

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
BATCHES_PER_EPOCH = 5  # room for a stop after the first saved step that still lands mid-epoch
TIMEOUT_S = 400


def torchrun_cmd(nproc: int, *args) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "train.py", *map(str, args)]


def train_args(data: Path, project: Path, name: str, nproc: int) -> list:
    # --save-interval 0.001 min writes last.pt after every step: where the watcher can see the position
    return ["--data", data, "--cfg", ROOT / "tests" / "models" / "tiny.yaml", "--project", project, "--name", name,
            "--imgsz", "64", "--batch-size", 2 * nproc, "--epochs", "1", "--device", "cpu", "--workers", "0",
            "--noplots", "--noval", "--exist-ok", "--save-interval", "0.001", "--seed", "3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ddp_resume_data")


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [3])
def test_sigterm_mid_epoch_then_resume_matches_uninterrupted(nproc, data, tmp_path):
    data_yaml = write_shapes_dataset(data / f"n{nproc}", n_train=BATCHES_PER_EPOCH * 2 * nproc, n_val=4)
    whole = subprocess.run(torchrun_cmd(nproc, *train_args(data_yaml, tmp_path, "whole", nproc)), cwd=ROOT,
                           env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]

    last_pt = tmp_path / "stopped" / "weights" / "last.pt"
    stopped = sigterm_at(torchrun_cmd(nproc, *train_args(data_yaml, tmp_path, "stopped", nproc)), last_pt,
                         tmp_path / "stopped.log", position=(0, 1))
    assert stopped.returncode != 0, "the run finished before SIGTERM reached it: " + stopped.stdout[-2000:]
    epoch, batch = saved_position(last_pt) or (None, None)
    # after a step (DDP's buckets laid out anew) and before the epoch's end
    assert epoch == 0 and 0 < batch < BATCHES_PER_EPOCH, (epoch, batch, stopped.stdout[-3000:])

    resumed = subprocess.run(torchrun_cmd(nproc, "--resume", last_pt), cwd=ROOT, env=launcher_env(),
                             capture_output=True, text=True, timeout=TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_identical(tmp_path / "stopped", tmp_path / "whole")
