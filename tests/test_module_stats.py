"""``module_stats --trained``: the FFCA modules' state in a trained checkpoint, without training (issue 38)."""

import pytest
import torch

from benchmarks.accuracy import module_stats
from benchmarks.accuracy.variants import variant_yaml
from models.yolo import Model


def _checkpoint(path, cfg, data, **extra):
    torch.manual_seed(0)
    model = Model(cfg, nc=4)
    torch.save({"model_cfg": model.yaml, "model": model.state_dict(), "ema": None, "nc": 4,
                "opt": {"data": str(data), "imgsz": 64}, **extra}, path)
    return path


def _fem_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if " FEM: " in line]


def test_trained_reports_fem_branch_and_its_batchnorm_scale(shapes_data, tmp_path, capsys):
    zero = _checkpoint(tmp_path / "zero.pt", variant_yaml("ffca-yolo-n-zeroinit", tmp_path), shapes_data)
    published = _checkpoint(tmp_path / "published.pt", variant_yaml("ffca-yolo-n-published", tmp_path), shapes_data)
    module_stats.main(["--trained", str(zero), str(published), "--batch", "4"])
    out = capsys.readouterr().out
    zero_part, published_part = out.split(str(published))
    assert len(_fem_lines(zero_part)) == 2 and len(_fem_lines(published_part)) == 2
    assert all("branch/shortcut RMS 0.0000 (projection BN mean |gamma| 0.0000)" in line for line in _fem_lines(zero_part))
    assert all("(projection BN mean |gamma| 1.0000)" in line for line in _fem_lines(published_part))
    assert all("branch/shortcut RMS 0.0000" not in line for line in _fem_lines(published_part))
    assert zero_part.count(" SCAM: ") == 3


@pytest.mark.parametrize("case", ["missing file", "no opt"])
def test_trained_rejects_what_it_cannot_measure_in_one_line(case, shapes_data, tmp_path, capsys):
    path = tmp_path / "x.pt"
    if case == "no opt":
        _checkpoint(path, "models/ffca-yolo-n.yaml", shapes_data, opt=None)
    with pytest.raises(SystemExit) as exit_:
        module_stats.main(["--trained", str(path)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and str(path) in err
    assert ("not found" if case == "missing file" else "opt.data") in err
