"""FEM and SCAM's optional zero-initialised residual branch (``init='zero_last'``): the published layer list
and parameter count stay, the module starts as its shortcut, and the branch still receives a gradient."""

import pytest
import torch

from benchmarks.accuracy.variants import variant_yaml
from models.ffca import FEM, SCAM
from models.yolo import Model


def _shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_zero_init_variant_keeps_the_published_layers_and_parameter_count(tmp_path):
    published = Model("models/ffca-yolo-n.yaml", nc=10)
    zero = Model(variant_yaml("ffca-yolo-n-zeroinit", tmp_path), nc=10)
    assert sum(p.numel() for p in published.parameters()) == 594_177  # the authors' parser builds the same
    assert sum(p.numel() for p in zero.parameters()) == 594_177
    assert _shapes(zero) == _shapes(published)
    assert [type(m).__name__ for m in zero.model] == [type(m).__name__ for m in published.model]


def test_zero_last_starts_scam_as_identity_and_fem_as_its_shortcut():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    scam, fem = SCAM(16, init="zero_last").train(), FEM(16, 16, init="zero_last").train()
    assert torch.equal(scam(x), x)
    assert torch.allclose(fem(x), torch.relu(fem.shortcut(x)), atol=1e-6)
    default_scam, default_fem = SCAM(16).train(), FEM(16, 16).train()
    assert not torch.allclose(default_scam(x), x, atol=1e-3)
    assert not torch.allclose(default_fem(x), torch.relu(default_fem.shortcut(x)), atol=1e-3)


def test_zero_last_branches_still_learn():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    scam, fem = SCAM(16, init="zero_last").train(), FEM(16, 16, init="zero_last").train()
    (scam(x) * torch.randn(2, 16, 8, 8)).sum().backward()
    (fem(x) * torch.randn(2, 16, 8, 8)).sum().backward()
    assert scam.context_proj[0].weight.grad.abs().sum() > 0
    assert fem.project.bn.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("module", [lambda: SCAM(16, init="zeros"), lambda: FEM(16, 16, init="zeros")])
def test_an_unknown_init_is_refused(module):
    with pytest.raises(ValueError, match="init must be one of"):
        module()
