"""State that a resume must carry over exactly, on paths that only CUDA runs take (tested on CPU).

AutoBatch's trial steps must leave every random stream as they found it; the CUDA generator saved in a
checkpoint is the training device's; a resume keeps the checkpoint's AMP decision; deterministic modes
pin NCCL's non-deterministic NVLS all-reduce off; the torch floor admits no release lacking what we call.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from utils import rng_state, torch_utils
from utils.autobatch import profile_memory
from utils.ddp import DistInfo
from utils.torch_utils import prepare_cuda_environment
from utils.training import amp as amp_module
from utils.training.amp import amp_for_run

ROOT = Path(__file__).resolve().parents[1]


class DropoutProbe(nn.Module):
    """A model whose training-mode forward draws random numbers, as DropPath in C3_Faster does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.conv(x))


def test_autobatch_trial_steps_leave_the_random_streams_as_they_were():
    model = DropoutProbe()
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    memory = profile_memory(model, 32, False, None, measure=lambda step, device: (step(), 0.5)[1])
    assert memory == [0.5] * 5  # every trial step ran
    assert torch.equal(torch.rand(4), expected)


def test_checkpoint_cuda_generator_is_the_training_devices_not_the_current_one(monkeypatch):
    import train

    monkeypatch.setattr(rng_state, "_cuda_ready", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda index: torch.tensor([index], dtype=torch.uint8))
    loop = SimpleNamespace(device=torch.device("cuda", 1), dist=DistInfo())  # one process, training on cuda:1
    saved = train.TrainLoop.gather_cuda_rng(loop)
    assert [s.tolist() for s in saved] == [[1]]


def test_cpu_training_saves_no_cuda_generator_even_when_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(rng_state, "_cuda_ready", lambda: True)
    assert rng_state.cuda_rng_state(torch.device("cpu")) is None


def test_resume_keeps_the_checkpoints_amp_decision(monkeypatch):
    monkeypatch.setattr(amp_module, "check_amp", lambda model: True)  # the resumed weights would pass the check
    model = nn.Conv2d(3, 4, 1)
    assert amp_for_run(model, {"amp": False, "scaler": {}}) is False
    assert amp_for_run(model, None) is True  # a new run checks


def test_checkpoint_from_before_the_amp_record_tells_by_its_scaler_state(monkeypatch, log_lines):
    monkeypatch.setattr(amp_module, "check_amp", lambda model: pytest.fail("a resume must not check AMP again"))
    model = nn.Conv2d(3, 4, 1)
    assert amp_for_run(model, {"scaler": {}}) is False
    assert amp_for_run(model, {"scaler": {"scale": 65536.0}}) is False  # AMP on CUDA, resumed on CPU: fp32
    assert any("resuming in fp32 on this device" in line for line in log_lines)


def test_training_state_records_the_amp_decision(base_model):
    from utils.torch_utils import EarlyStopping
    from utils.training.run_state import Optimisation, Progress, training_state

    optimizer = torch.optim.SGD(base_model.parameters(), lr=0.01)
    parts = Optimisation(model=base_model, ema=None, optimizer=optimizer,
                         scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0),
                         scaler=torch.amp.GradScaler("cuda", enabled=False), stopper=EarlyStopping())
    state = training_state(parts, Progress(), (1, 0), opt=SimpleNamespace(), hyp={})
    assert state["amp"] is False


@pytest.mark.parametrize("mode", ["scoped", "strict", "warn"])
def test_deterministic_modes_turn_nccl_nvls_off(mode, monkeypatch, log_lines):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setattr(torch_utils, "_ensure_cublas_workspace", lambda: None)
    prepare_cuda_environment(mode)
    assert torch_utils.os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert any("NCCL_NVLS_ENABLE=1 overridden with 0" in line for line in log_lines)


def test_off_leaves_nccl_alone(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    prepare_cuda_environment("off")
    assert torch_utils.os.environ["NCCL_NVLS_ENABLE"] == "1"


def test_torch_floor_has_the_amp_api_train_py_calls():
    text = (ROOT / "requirements.txt").read_text()
    floor = re.search(r"^torch>=(\d+)\.(\d+)", text, re.M)
    assert floor, "requirements.txt names no torch floor"
    assert (int(floor[1]), int(floor[2])) >= (2, 3), "torch.amp.GradScaler('cuda') arrived in torch 2.3"
