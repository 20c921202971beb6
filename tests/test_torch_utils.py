"""Generic torch helpers: devices, EMA, optimizer groups, early stopping, model info, RNG state, env report."""

import io
import logging
import math
import os
import random
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from utils import torch_utils
from utils.errors import UserError
from utils.logging import LOGGER
from utils.rng_state import cuda_rng_state, get_rng_state, set_rng_state
from utils.torch_utils import (EarlyStopping, ModelEMA, de_parallel, intersect_dicts, is_parallel, model_info,
                               select_device, smart_optimizer, time_sync)


def small_net() -> nn.Sequential:
    """Conv(3->4, bias) + BN(4) + Conv(4->2, bias): 2 biases, 2 conv weights, 1 BN weight, 1 BN bias."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))


@pytest.fixture
def log_lines():
    """Captured LOGGER output, one string per record."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    LOGGER.addHandler(handler)
    yield lambda: stream.getvalue().splitlines()
    LOGGER.removeHandler(handler)


# ----------------------------------------------------------------------------- devices


@pytest.mark.parametrize("request_text", ["cpu", "CPU", " cpu "])
def test_select_cpu(request_text):
    assert select_device(request_text) == torch.device("cpu")


def test_empty_request_uses_cuda_when_available():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device("").type == expected


def test_torch_spelling_cuda_is_the_default_gpu_and_needs_cuda(two_gpu_driver, monkeypatch):
    """``device='cuda'`` (torch.device's spelling, common in Python code) picks GPU 0 and exports no mask."""
    assert select_device("cuda") == select_device(torch.device("cuda")) == torch.device("cuda", 0)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="^--device 'cuda': CUDA is not available on this machine.*; use --device cpu$"):
        select_device("cuda")


@pytest.mark.parametrize("bad", ["gpu", "0,0", "-1", "1.5", "0;1", "cuda:x"])
def test_malformed_device_is_user_error(bad, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(UserError, match="--device") as error:
        select_device(bad)
    assert bad == "0,0" or "'cuda' (the default GPU)" in str(error.value), "the message lists every accepted form"


def no_gpu_mask(monkeypatch):
    """Unset CUDA_VISIBLE_DEVICES for one test; select_device's export is undone after it too."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # records the value to restore
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch_utils, "_exported_mask", None)


def test_cuda_request_without_cuda_is_user_error(monkeypatch):
    no_gpu_mask(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="--device '0': CUDA is not available.*--device cpu"):
        select_device("0")


@pytest.fixture
def two_gpu_driver(monkeypatch):
    """A CUDA driver with two GPUs that, like the real one, reads CUDA_VISIBLE_DEVICES once, at its first call.

    Yields the list of masks it read (one at most); the visible count stops at the first invalid index.
    """
    no_gpu_mask(monkeypatch)
    masks = []

    def visible():
        if not masks:
            masks.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        if masks[0] is None:
            return 2
        count = 0
        for part in masks[0].split(","):
            if not part.isdigit() or int(part) >= 2:
                break
            count += 1
        return count

    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible() > 0)
    monkeypatch.setattr(torch.cuda, "device_count", visible)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch_utils, "_describe_cuda", lambda index: f"CUDA:{index}")
    return masks


@pytest.mark.parametrize("request_text, mask, index", [("1", "1", 0), ("0", "0", 0), ("1,0", "1,0", 0)])
def test_gpu_list_is_exported_before_the_driver_first_reads_it(two_gpu_driver, request_text, mask, index):
    assert select_device(request_text) == torch.device("cuda", index)
    assert two_gpu_driver == [mask] and os.environ["CUDA_VISIBLE_DEVICES"] == mask


@pytest.mark.parametrize("inherited, request_text, mask",
                         [("1", "0", "1"), ("1,0", "1", "0"), ("1,0", "1,0", "0,1")])
def test_indices_count_within_the_mask_the_process_was_started_with(two_gpu_driver, monkeypatch, inherited,
                                                                     request_text, mask):
    """A user's CUDA_VISIBLE_DEVICES, or the GPU proof's child runs told --device 0 under the parent's mask."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", inherited)
    assert select_device(request_text) == torch.device("cuda", 0)
    assert two_gpu_driver == [mask] and os.environ["CUDA_VISIBLE_DEVICES"] == mask


def test_an_index_outside_the_inherited_mask_is_user_error(two_gpu_driver, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(UserError, match="--device '1': CUDA_VISIBLE_DEVICES='1' leaves 1 GPU\\(s\\) visible"):
        select_device("1")
    assert two_gpu_driver == []


def test_a_second_selection_in_the_same_process_keeps_its_own_mask(two_gpu_driver):
    assert select_device("1") == select_device("1") == torch.device("cuda", 0)
    assert two_gpu_driver == ["1"] and os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_preparing_determinism_leaves_the_driver_to_select_device(two_gpu_driver, monkeypatch):
    """train.py exports CUBLAS_WORKSPACE_CONFIG first; asking is_available() there started the driver unmasked."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # records the value to restore
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    torch_utils.prepare_cuda_environment("strict")
    assert select_device("1") == torch.device("cuda", 0)
    assert two_gpu_driver == ["1"] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == torch_utils.CUBLAS_WORKSPACE_CONFIG


@pytest.mark.parametrize("request_text, match", [("2", "--device '2'.*device\\(s\\) 2.*nvidia-smi -L"),
                                                 ("0,5", "--device '0,5': only 1 of CUDA device\\(s\\) 0,5")])
def test_missing_gpu_index_is_user_error(two_gpu_driver, request_text, match):
    with pytest.raises(UserError, match=match):
        select_device(request_text)


def test_batch_size_must_divide_over_gpus(two_gpu_driver):
    with pytest.raises(UserError, match="--batch-size 3"):
        select_device("0,1", batch_size=3)


@pytest.mark.parametrize("initialised", [True, False])
def test_time_sync_waits_for_cuda_only_once_it_is_initialised(initialised, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: calls.append("sync"))
    monkeypatch.setattr(time, "perf_counter", lambda: calls.append("clock") or 12.5)
    assert time_sync() == 12.5
    assert calls == (["sync", "clock"] if initialised else ["clock"])  # the clock is read after the wait


def test_de_parallel_unwraps_data_parallel():
    net = small_net()
    wrapped = nn.DataParallel(net)
    assert is_parallel(wrapped) and not is_parallel(net)
    assert de_parallel(wrapped) is net and de_parallel(net) is net


# ----------------------------------------------------------------------------- models


def test_intersect_dicts_keeps_matching_keys_and_shapes():
    da = {"a.weight": torch.zeros(2, 3), "b.weight": torch.zeros(4), "anchors": torch.zeros(3),
          "only_a": torch.zeros(1)}
    db = {"a.weight": torch.ones(2, 3), "b.weight": torch.ones(5), "anchors": torch.ones(3)}
    kept = intersect_dicts(da, db, exclude=("anchor",))
    assert list(kept) == ["a.weight"] and kept["a.weight"] is da["a.weight"]


def test_model_info_counts_and_scales_flops(log_lines):
    net = small_net()
    net[0].weight.requires_grad_(False)
    layers, params, grads, gflops_64 = model_info(net, imgsz=64)
    assert layers == 4
    assert params == sum(p.numel() for p in net.parameters())
    assert grads == params - net[0].weight.numel()
    assert gflops_64 > 0
    assert model_info(net, imgsz=128)[3] == pytest.approx(4 * gflops_64)
    summary = [line for line in log_lines() if "summary:" in line]
    assert summary[0] == f"Sequential summary: 4 layers, {params} parameters, {grads} gradients, {gflops_64:.1f} GFLOPs"


def test_model_info_survives_unprofilable_model(log_lines):
    class NeedsTwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 1, 1)

        def forward(self, x, y):
            return self.conv(x) + y

    assert model_info(NeedsTwoInputs())[3] is None
    assert log_lines()[-1] == "NeedsTwoInputs summary: 2 layers, 4 parameters, 4 gradients"


def test_ema_ramps_decay_and_stays_frozen_fp32():
    net = small_net().double()
    ema = ModelEMA(net, decay=0.9, tau=1.0)
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in ema.ema.parameters())
    assert not ema.ema.training
    start = ema.ema[0].weight.clone()
    with torch.no_grad():
        net[0].weight.add_(1.0)
    ema.update(net)
    d = 0.9 * (1 - math.exp(-1.0))
    expected = d * start + (1 - d) * net[0].weight.float()
    assert ema.updates == 1
    assert torch.allclose(ema.ema[0].weight, expected)
    assert torch.equal(ema.ema[1].num_batches_tracked, net[1].num_batches_tracked)


def test_ema_update_attr_copies_plain_attributes():
    net = small_net()
    ema = ModelEMA(net)
    net.names, net.nc, net.reducer = ["a", "b"], 2, object()
    ema.update_attr(net, include=("names", "nc", "reducer"))
    assert ema.ema.names == ["a", "b"] and ema.ema.nc == 2 and not hasattr(ema.ema, "reducer")


def test_smart_optimizer_groups():
    net = small_net()
    opt = smart_optimizer(net, "SGD", lr=0.01, momentum=0.8, decay=5e-4)
    biases, weights, norm = opt.param_groups
    assert {id(p) for p in biases["params"]} == {id(net[0].bias), id(net[1].bias), id(net[2].bias)}
    assert {id(p) for p in weights["params"]} == {id(net[0].weight), id(net[2].weight)}
    assert [id(p) for p in norm["params"]] == [id(net[1].weight)]
    assert (biases["weight_decay"], weights["weight_decay"], norm["weight_decay"]) == (0, 5e-4, 0.0)
    assert biases["nesterov"] and biases["momentum"] == 0.8


@pytest.mark.parametrize("name, cls", [("Adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_smart_optimizer_adam_betas(name, cls):
    opt = smart_optimizer(small_net(), name, momentum=0.937)
    assert isinstance(opt, cls) and opt.param_groups[0]["betas"] == (0.937, 0.999)


def test_smart_optimizer_unknown_name_is_user_error():
    with pytest.raises(UserError, match="--optimizer 'Lion'"):
        smart_optimizer(small_net(), "Lion")


def test_early_stopping_and_resume():
    stopper = EarlyStopping(patience=2)
    assert [stopper(epoch, f) for epoch, f in enumerate([0.1, 0.3, 0.2])] == [False, False, False]
    assert stopper.possible_stop
    resumed = EarlyStopping(patience=2)
    resumed.load_state_dict(stopper.state_dict())
    assert resumed(3, 0.25) is True and stopper(3, 0.25) is True
    assert resumed.state_dict() == stopper.state_dict()


def test_a_resume_may_change_the_patience():
    stopper = EarlyStopping(patience=2)
    assert not any(stopper(epoch, f) for epoch, f in enumerate([0.1, 0.3, 0.2]))
    assert stopper.possible_stop  # one more epoch without a new best stops it
    never, later = EarlyStopping(patience=0), EarlyStopping(patience=4)
    for resumed in (never, later):
        resumed.load_state_dict(stopper.state_dict())
        assert not resumed.possible_stop
    assert not any(never(epoch, 0.1) for epoch in range(3, 40))
    assert [later(epoch, 0.1) for epoch in (3, 4, 5)] == [False, False, True]
    assert later.state_dict()["best_epoch"] == 1 and stopper(3, 0.1) is True


def test_early_stopping_zero_patience_never_stops():
    stopper = EarlyStopping(patience=0)
    assert not any(stopper(epoch, 0.5 if epoch == 0 else 0.1) for epoch in range(50))


# ----------------------------------------------------------------------------- RNG state


def draw() -> tuple:
    return random.random(), random.gauss(0, 1), np.random.rand(4).tolist(), np.random.randn(), torch.rand(4).tolist()


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.randn()
    path = tmp_path / "rng.pt"
    torch.save({"rng": get_rng_state()}, path)
    expected = draw()
    set_rng_state(torch.load(path, weights_only=True)["rng"])
    assert draw() == expected


class FakeCudaWorld:
    """A two-GPU machine on a CPU: per-device generator states behind monkeypatched torch.cuda calls."""

    def __init__(self, monkeypatch, n_devices: int = 2):
        self.states = {i: torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(n_devices)}
        self.current = 0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n_devices)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: self.states[device].clone())
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: self.states.update({device: state}))

    def values(self) -> dict:
        return {i: int(s[0]) for i, s in self.states.items()}


def test_each_rank_saves_and_restores_its_own_cuda_generator(tmp_path, monkeypatch):
    world = FakeCudaWorld(monkeypatch)
    # every DDP rank reads the generator of its own device; the saving rank stores the gathered list
    gathered = [cuda_rng_state(torch.device("cuda", rank)) for rank in (0, 1)]
    torch.save({"rng": get_rng_state(cuda_by_rank=gathered)}, tmp_path / "rng.pt")
    state = torch.load(tmp_path / "rng.pt", weights_only=True)["rng"]
    assert [int(s[0]) for s in state["cuda"]] == [10, 11]
    world.states = {0: torch.zeros(16, dtype=torch.uint8), 1: torch.zeros(16, dtype=torch.uint8)}
    set_rng_state(state, rank=1, device=torch.device("cuda", 1))
    assert world.values() == {0: 0, 1: 11}  # rank 1 restored its own stream and touched no other device
    set_rng_state(state, rank=0, device=torch.device("cuda", 0))
    assert world.values() == {0: 10, 1: 11}


def test_single_process_saves_its_current_device_as_rank_zero(monkeypatch):
    world = FakeCudaWorld(monkeypatch)
    world.current = 1
    state = get_rng_state()
    assert [int(s[0]) for s in state["cuda"]] == [11]
    world.states[1] = torch.zeros(16, dtype=torch.uint8)
    set_rng_state(state)
    assert world.values() == {0: 10, 1: 11}


def test_rank_missing_from_the_checkpoint_keeps_its_stream_and_says_so(monkeypatch, log_lines):
    world = FakeCudaWorld(monkeypatch)
    state = get_rng_state(cuda_by_rank=[cuda_rng_state(0)])
    world.states[1] = torch.zeros(16, dtype=torch.uint8)
    set_rng_state(state, rank=1, device=1)
    assert world.values() == {0: 10, 1: 0}
    assert any("rank 1" in line and "restarts from the seed" in line for line in log_lines())


def test_malformed_rng_state_is_user_error():
    with pytest.raises(UserError, match="RNG state"):
        set_rng_state({"python": [3, [1, 2]], "numpy": [], "torch": torch.zeros(1)})


# ----------------------------------------------------------------------------- environment report


def test_environment_report_is_plain_and_complete(capsys):
    from utils.determinism.env import environment_report, main

    report = environment_report()
    assert report["torch"] == torch.__version__ and report["numpy"] == np.__version__
    assert report["cuda_available"] == torch.cuda.is_available()
    assert len(report["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for key in ("deterministic_algorithms", "warn_only", "debug_mode", "cudnn_deterministic",
                "cudnn_benchmark", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"):
        assert key in report["determinism"]
    torch.save(report, io.BytesIO())  # plain data: serialisable without custom classes
    assert main() == 0
    assert f"torch: {torch.__version__}" in capsys.readouterr().out


@pytest.mark.slow
def test_environment_report_names_the_cpu_kernels_in_use_not_the_processors_best():
    """Two machines' runs differ when ATen's CPU kernels differ in vector width (docs/research/): the report
    gives the width in use, which ATEN_CPU_CAPABILITY can lower below what the processor offers."""
    import subprocess
    import sys
    from pathlib import Path

    from utils.determinism.env import environment_report

    root = Path(__file__).resolve().parents[1]
    report = environment_report()
    assert report["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert report["cpu"] is None or (isinstance(report["cpu"], str) and report["cpu"])
    lowered = subprocess.run([sys.executable, "-m", "utils.determinism.env"], cwd=root, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert lowered.returncode == 0, lowered.stderr[-2000:]
    assert "cpu_capability: DEFAULT" in lowered.stdout.splitlines()


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_optimizer_for_a_model_without_biases_keeps_three_groups(name):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False))
    groups = smart_optimizer(model, name, lr=0.01, momentum=0.9, decay=5e-4).param_groups
    assert [len(g["params"]) for g in groups] == [0, 1, 0]
    assert [g["weight_decay"] for g in groups] == [0.0, 5e-4, 0.0]


def test_deterministic_switch_matches_torchs_and_reaches_inductor_without_importing_it():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, torch, os\n"
            "from utils.torch_utils import configure_determinism, set_deterministic_algorithms\n"
            "configure_determinism('warn')\n"
            "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
            " 'torch._inductor' in sys.modules, os.environ['TORCHINDUCTOR_DETERMINISTIC'])\n"
            "import torch._inductor.config as c\n"
            "print(c.deterministic)\n"
            "set_deterministic_algorithms(False)\n"
            "print(torch.are_deterministic_algorithms_enabled(), c.deterministic)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "False", "1", "True", "False", "False"]


def _cpu_machine_with_a_cuda_build(monkeypatch):
    """torch built with cuDNN on a machine without a usable GPU; asking cuDNN's version would load the library."""
    def load_cudnn():
        raise AssertionError("cuDNN was loaded on a machine without CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", load_cudnn)


def test_nothing_loads_cudnn_where_cuda_is_not_available(monkeypatch):
    """Under ``ulimit -v`` that load aborted training (SIGABRT) after --cache ram's warning."""
    from types import SimpleNamespace

    from utils.ddp import DistInfo
    from utils.determinism.env import environment_report
    from utils.determinism.reproducibility import determinism_report
    from utils.torch_utils import configure_determinism, cudnn_version

    _cpu_machine_with_a_cuda_build(monkeypatch)
    assert cudnn_version() is None and environment_report()["cudnn_version"] is None
    report = determinism_report(policy=configure_determinism("scoped"), audit=None,
                                opt=SimpleNamespace(seed=0, workers=0), dist=DistInfo(),
                                dataset=SimpleNamespace(im_files=[], label_files=[]), device=torch.device("cpu"))
    assert report["versions"]["cudnn"] is None


ADDRESS_SPACE_CHILD = """
import re, resource, sys
from types import SimpleNamespace
import torch
from utils.ddp import DistInfo
from utils.determinism.env import environment_report
from utils.determinism.reproducibility import determinism_report
from utils.torch_utils import configure_determinism
size = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 48 * 2**20, resource.RLIM_INFINITY))
if sys.argv[1] == "cudnn":
    torch.backends.cudnn.version()
else:
    environment_report()
    determinism_report(policy=configure_determinism("scoped"), audit=None, opt=SimpleNamespace(seed=0, workers=0),
                       dist=DistInfo(), dataset=SimpleNamespace(im_files=[], label_files=[]), device=torch.device("cpu"))
print("reported")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or not torch.backends.cudnn.is_available() or
                    not os.path.exists("/proc/self/status"), reason="needs a CUDA build of torch on a machine without "
                    "a GPU, on Linux")
def test_the_run_records_are_written_under_an_address_space_limit_that_cudnn_does_not_fit():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = lambda what: subprocess.run([sys.executable, "-c", ADDRESS_SPACE_CHILD, what], cwd=root,  # noqa: E731
                                      capture_output=True, text=True, timeout=120)
    control = run("cudnn")
    if control.returncode == 0:
        pytest.skip("cuDNN loads within 48 MB of address space here: the limit cannot show the fault")
    records = run("records")
    assert records.returncode == 0 and records.stdout.strip() == "reported", records.stderr[-2000:]
