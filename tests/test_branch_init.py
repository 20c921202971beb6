"""FEM and SCAM's zero-initialised residual branch (``init='zero_last'``, SCAM's default since issue 38) and
the authors' initialisation (``init='published'``, FEM's default): the published layer list and parameter
count stay, a zero-initialised module starts as its shortcut, and its branch still receives a gradient."""

import pytest
import torch

from benchmarks.accuracy.variants import variant_yaml
from models.ffca import FEM, SCAM
from models.yolo import Model


def _shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _scam_and_fem_inits(model) -> list[bool]:
    """Per FEM/SCAM module, whether its branch's last scale starts at zero."""
    zero = []
    for m in model.modules():
        if isinstance(m, SCAM):
            zero.append(bool(torch.all(m.context_proj[0].weight == 0)))
        elif isinstance(m, FEM):
            zero.append(bool(torch.all(m.project.bn.weight == 0)))
    return zero


def test_both_inits_keep_the_published_layers_and_parameter_count(tmp_path):
    default = Model("models/ffca-yolo-n.yaml", nc=10)
    published = Model(variant_yaml("ffca-yolo-n-published", tmp_path), nc=10)
    assert sum(p.numel() for p in default.parameters()) == 594_177  # the authors' parser builds the same
    assert sum(p.numel() for p in published.parameters()) == 594_177
    assert _shapes(published) == _shapes(default)
    assert [type(m).__name__ for m in published.model] == [type(m).__name__ for m in default.model]


def test_shipped_ffca_models_start_scam_at_zero_and_fem_as_published(tmp_path):
    for cfg in ("models/ffca-yolo-n.yaml", "models/ffca-yolo.yaml", "models/l-ffca-yolo.yaml"):
        assert _scam_and_fem_inits(Model(cfg, nc=10)) == [False, False, True, True, True], cfg  # 2 FEM, 3 SCAM
    assert not any(_scam_and_fem_inits(Model(variant_yaml("ffca-yolo-n-published", tmp_path), nc=10)))
    assert all(_scam_and_fem_inits(Model(variant_yaml("ffca-yolo-n-zeroinit", tmp_path), nc=10)))


def test_variants_differ_from_the_default_only_in_the_zeroed_scales(tmp_path):
    torch.manual_seed(0)
    default = Model("models/ffca-yolo-n.yaml", nc=10).state_dict()
    for name in ("ffca-yolo-n-published", "ffca-yolo-n-zeroinit"):
        torch.manual_seed(0)
        variant = Model(variant_yaml(name, tmp_path), nc=10).state_dict()
        differing = {k for k in default if not torch.equal(default[k], variant[k])}
        zeroed = {k for k in default if k.endswith(("context_proj.0.weight", "project.bn.weight"))}
        assert differing and differing <= zeroed, name


def test_zero_last_starts_scam_as_identity_and_fem_as_its_shortcut():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    scam, fem = SCAM(16).train(), FEM(16, 16, init="zero_last").train()
    assert torch.equal(scam(x), x)
    assert torch.allclose(fem(x), torch.relu(fem.shortcut(x)), atol=1e-6)
    published_scam, published_fem = SCAM(16, init="published").train(), FEM(16, 16, init="published").train()
    assert not torch.allclose(published_scam(x), x, atol=1e-3)
    assert not torch.allclose(published_fem(x), torch.relu(published_fem.shortcut(x)), atol=1e-3)


def test_zero_last_branches_still_learn():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8, 8)
    scam, fem = SCAM(16).train(), FEM(16, 16, init="zero_last").train()
    (scam(x) * torch.randn(2, 16, 8, 8)).sum().backward()
    (fem(x) * torch.randn(2, 16, 8, 8)).sum().backward()
    assert scam.context_proj[0].weight.grad.abs().sum() > 0
    assert fem.project.bn.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("module", [lambda: SCAM(16, init="default"), lambda: FEM(16, 16, init="zeros")])
def test_an_unknown_init_is_refused(module):
    with pytest.raises(ValueError, match="init must be one of"):
        module()
