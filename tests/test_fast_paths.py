"""Speed-ups that must not change a single bit: the EMA's ``_foreach`` update and the eval fast path."""

import copy

import torch
from torch import nn

from models.backends import PyTorchBackend
from models.yolo import Model
from utils.torch_utils import ModelEMA


def _reference_ema_update(ema_model, model, d):
    """The per-tensor EMA update the ``_foreach`` version replaced."""
    model_state = model.state_dict()
    with torch.no_grad():
        for k, v in ema_model.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(d).add_(model_state[k].detach().to(v.dtype), alpha=1 - d)


def _small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 4, 1))


def test_foreach_ema_update_is_bit_identical_to_per_tensor_update():
    net = _small_net()
    ema = ModelEMA(net, decay=0.9999, tau=5.0)
    reference = copy.deepcopy(ema.ema)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        net.train()
        loss = net(torch.randn((2, 3, 8, 8), generator=generator)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update(net)
        _reference_ema_update(reference, net, ema.decay(ema.updates))
    got, expected = ema.ema.state_dict(), reference.state_dict()
    assert got.keys() == expected.keys()
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    assert not torch.equal(got["1.running_mean"], net.state_dict()["1.running_mean"]), "EMA must lag the model"
    assert got["1.num_batches_tracked"] == 0, "integer buffers are not averaged"


def test_fused_channels_last_backend_keeps_predictions(tiny_cfg):
    """The eval fast path val.py and detect.py take (BatchNorm folded, channels-last) predicts as the model does."""
    torch.manual_seed(0)
    model = Model(tiny_cfg).eval()
    x = torch.rand((2, 3, 64, 64))
    with torch.no_grad():
        expected = model(x)[0]
        fast = PyTorchBackend(copy.deepcopy(model).fuse())
        got = fast.forward(x)[0]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fast.model.modules()), "BatchNorm must be folded"
    assert fast.model.model[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-3)
    assert not fast.model.training
