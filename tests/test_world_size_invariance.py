"""``--micro-batch N``: the same run gives the same bits on 1, 2 and 4 processes (gloo on CPU), and a
resume may change the number of processes."""

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from tests.conftest import write_shapes_dataset
from tests.support.launchers import launcher_env, saved_position, sigterm_at
from tests.support.run_outputs import assert_identical
from utils.dataset.sampling import DeterministicBatchSampler
from utils.errors import UserError
from utils.training import micro_batches
from utils.training.micro_batches import BatchNormStats, check_micro_batch, tree_sum

pytestmark = pytest.mark.usefixtures("audit_once_per_model")  # tests/support/shared_audit.py

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 400


class Images:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def step_contents(n: int, world_size: int, batch: int, micro: int, epoch: int = 1) -> dict:
    """{(step, micro-batch index): image indices} over every rank of ``world_size``."""
    contents = {}
    for rank in range(world_size):
        sampler = DeterministicBatchSampler(Images(n), micro, shuffle=True, seed=5, rank=rank if world_size > 1 else -1,
                                            world_size=world_size, global_batch=batch)
        sampler.set_epoch(epoch)
        delivered = iter(sampler.batches())
        for step in range(sampler.steps()):
            for index in sampler.step_share(step):
                contents[(step, index)] = [key[0] for key in next(delivered)]
        assert next(delivered, None) is None
    return contents


@pytest.mark.parametrize("n", [37, 40, 3])
def test_a_step_holds_the_same_micro_batches_whatever_the_world_size(n):
    one = step_contents(n, 1, batch=16, micro=4)
    assert step_contents(n, 2, batch=16, micro=4) == one == step_contents(n, 4, batch=16, micro=4)
    assert sorted(i for images in one.values() for i in images) == list(range(n)), "each image once, no padding"


def test_a_resumed_epoch_skips_whole_steps_on_every_rank():
    sampler = DeterministicBatchSampler(Images(37), 4, shuffle=True, seed=5, rank=1, world_size=2, global_batch=16)
    sampler.set_epoch(0)
    full = sampler.batches()
    sampler.set_epoch(0, start_batch=2)
    assert list(sampler) == full[sum(len(sampler.step_share(s)) for s in range(2)):]
    assert [len(sampler.step_share(s)) for s in range(sampler.steps())] == [2, 2, 0], "37 = 16 + 16 + 5 images"


def test_the_tree_sum_is_the_same_split_at_any_power_of_two():
    torch.manual_seed(0)
    leaves = [torch.randn(1000) * 10 ** torch.randint(-6, 6, (1000,)) for _ in range(8)]
    whole = tree_sum(leaves, 0, 8)
    for world_size in (2, 4, 8):
        per_rank = 8 // world_size
        partials = [tree_sum(leaves, r * per_rank, (r + 1) * per_rank) for r in range(world_size)]
        assert torch.equal(tree_sum(partials, 0, world_size), whole)
    assert not torch.equal(sum(leaves), whole), "a left-to-right sum differs: the test can tell orders apart"


def test_a_short_step_s_missing_leaves_change_nothing():
    leaves = [torch.tensor([0.1]), torch.tensor([0.2]), torch.tensor([0.3]), None]
    assert torch.equal(tree_sum(leaves, 0, 4), (leaves[0] + leaves[1]) + leaves[2])
    assert tree_sum([None, None], 0, 2) is None


@pytest.mark.parametrize("world_size, message", [
    (3, "makes 4 micro-batches a step, which 3 processes cannot share exactly; use 1, 2, 4 process(es)"),
    (8, "which 8 processes cannot share exactly; use 1, 2, 4 process(es)"),
])
def test_a_world_size_that_cannot_keep_the_result_is_refused_naming_those_that_can(world_size, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_micro_batch(4, 16, world_size, SimpleNamespace())


@pytest.mark.parametrize("micro, batch, opt, message", [
    (3, 16, {}, "--micro-batch 3: must divide --batch-size 16"),
    (4, -1, {}, "--micro-batch 4: must divide --batch-size -1"),
    (4, 16, {"rect": True}, "--micro-batch with --rect: not supported"),
    (4, 16, {"sync_bn": True}, "--micro-batch with --sync-bn: not supported"),
])
def test_bad_micro_batch_settings_are_one_line(micro, batch, opt, message):
    with pytest.raises(UserError, match=message):
        check_micro_batch(micro, batch, 1, SimpleNamespace(**opt))


def test_batch_norm_statistics_are_captured_then_folded_in_order():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, momentum=0.1).train()
    stats = BatchNormStats(nn.Sequential(bn))
    inputs = [torch.randn(4, 3, 5, 5) + i for i in range(3)]
    captured = []
    for x in inputs:
        stats.begin()
        bn(x).sum().backward()
        captured.append(stats.end())
        assert torch.equal(bn.running_mean, torch.zeros(3)) and int(bn.num_batches_tracked) == 0
    assert torch.allclose(captured[1][0][0][0], inputs[1].mean((0, 2, 3))), "layer 0, call 0, mean"
    stats.fold(captured)
    reference = nn.BatchNorm2d(3, momentum=0.1).train()
    for x in inputs:
        reference(x)
    assert torch.allclose(bn.running_mean, reference.running_mean) and int(bn.num_batches_tracked) == 3


def captured_and_folded(module: nn.Module, inputs: list) -> nn.Module:
    """``module`` after its micro-batches ``inputs`` ran with their statistics captured, then folded in order."""
    stats = BatchNormStats(module)
    captured = []
    for x in inputs:
        stats.begin()
        module(x).sum().backward()
        captured.append(stats.end())
    stats.fold(captured)
    return module


def test_a_cumulative_average_batch_norm_folds_like_batch_norm_itself():
    torch.manual_seed(0)
    inputs = [torch.randn(4, 3, 5, 5) * (i + 1) + i for i in range(3)]
    folded = captured_and_folded(nn.Sequential(nn.BatchNorm2d(3, momentum=None).train()), inputs)[0]
    reference = nn.BatchNorm2d(3, momentum=None).train()
    for x in inputs:
        reference(x)
    assert int(folded.num_batches_tracked) == 3
    assert torch.allclose(folded.running_mean, reference.running_mean)
    assert torch.allclose(folded.running_var, reference.running_var)
    assert not torch.allclose(reference.running_mean, inputs[-1].mean((0, 2, 3))), "the average has memory"


class TwiceNormed(nn.Module):
    """One BatchNorm called twice in a forward pass, on different inputs (as a shared-norm block does)."""

    def __init__(self, momentum):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3, momentum=momentum)

    def forward(self, x):
        return self.bn(self.conv(self.bn(x)) * 3 + 1)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_batch_norm_called_twice_folds_both_calls(momentum, micro_batches):
    torch.manual_seed(0)
    full = torch.randn(8, 3, 5, 5) * 2 + 1
    model = TwiceNormed(momentum).train()
    reference = copy.deepcopy(model)
    folded = captured_and_folded(model, list(full.chunk(micro_batches)))
    with torch.no_grad():
        for x in full.chunk(micro_batches):  # each micro-batch's forward on its own, in order
            reference(x)
    assert int(folded.bn.num_batches_tracked) == int(reference.bn.num_batches_tracked) == 2 * micro_batches
    assert torch.allclose(folded.bn.running_mean, reference.bn.running_mean)
    assert torch.allclose(folded.bn.running_var, reference.bn.running_var)


def test_the_sampler_alone_shares_micro_batches_out():
    assert not hasattr(micro_batches, "rank_share"), "a second copy of DeterministicBatchSampler.step_share"


# ------------------------------------------------------------------------------------------ training runs


def torchrun(nproc: int, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py",
           *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def train_args(data: Path, project: Path, name: str, *extra) -> list:
    return ["--data", data, "--cfg", ROOT / "tests" / "models" / "tiny.yaml", "--project", project, "--name", name,
            "--imgsz", "64", "--batch-size", "8", "--micro-batch", "2", "--epochs", "2", "--device", "cpu",
            "--workers", "0", "--noplots", "--exist-ok", "--seed", "3", *extra]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_shapes_dataset(tmp_path_factory.mktemp("invariance"), n_train=36, n_val=4)  # a short last step


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory) -> Path:
    project = tmp_path_factory.mktemp("one")
    proc = subprocess.run([sys.executable, "train.py", *map(str, train_args(data, project, "w1", "--save-interval",
                                                                            "0"))],
                          cwd=ROOT, env=launcher_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return project / "w1"


# Four processes: the stopped run below trains epoch 0 (its short last step included, two ranks idle) and the
# start of epoch 1 on 4 ranks and must still end with one process's bits, so a whole 4-process run adds nothing.
@pytest.mark.slow
def test_the_same_run_on_two_processes_gives_one_process_s_bits(data, one_process, tmp_path):
    proc = torchrun(2, *train_args(data, tmp_path, "many", "--save-interval", "0"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_identical(tmp_path / "many", one_process)


@pytest.mark.slow
def test_four_processes_stopped_mid_epoch_resume_on_two_with_the_same_bits(data, one_process, tmp_path):
    last_pt = tmp_path / "stopped" / "weights" / "last.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "train.py",
           *map(str, train_args(data, tmp_path, "stopped", "--save-interval", "0.001"))]
    stopped = sigterm_at(cmd, last_pt, tmp_path / "stopped.log", position=(1, 0), timeout=TIMEOUT_S)
    assert stopped.returncode != 0, "the run finished before SIGTERM reached it: " + stopped.stdout[-2000:]
    epoch, batch = saved_position(last_pt) or (None, None)
    assert epoch == 1 and 0 < batch < 5, (epoch, batch, stopped.stdout[-3000:])
    resumed = torchrun(2, "--resume", last_pt)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_identical(tmp_path / "stopped", one_process)
