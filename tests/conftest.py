"""Shared fixtures: the repository on sys.path, a tiny generated data set, clean global state."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TINY_CFG = ROOT / "tests" / "models" / "tiny.yaml"


def _load_shapes_generator():
    spec = importlib.util.spec_from_file_location("make_shapes", ROOT / "data" / "scripts" / "make_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_shapes


def write_shapes_dataset(root: Path, n_train: int = 16, n_val: int = 8, seed: int = 0) -> Path:
    """Generate a small shapes data set under ``root`` and return its data YAML."""
    _load_shapes_generator()(root / "shapes", n_train=n_train, n_val=n_val, seed=seed)
    yaml_file = root / "shapes.yaml"
    yaml_file.write_text(f"path: {root / 'shapes'}\ntrain: images/train\nval: images/val\n"
                         "names: [circle, square, triangle, cross]\n")
    return yaml_file


@pytest.fixture(scope="session")
def shapes_data(tmp_path_factory) -> Path:
    """A 16-train / 8-val image shapes data set (YAML path), shared by the whole session."""
    return write_shapes_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def tiny_cfg() -> Path:
    return TINY_CFG


@pytest.fixture(autouse=True)
def restore_global_determinism():
    """Each test starts and ends with PyTorch's global determinism switches as they were."""
    state = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = state[2], state[3]


@pytest.fixture
def log_lines():
    """Messages the project logger emits during the test (it does not propagate to pytest's caplog)."""
    import logging

    from utils.logging import LOGGER

    from utils.logging import ProjectFormatter

    lines = []
    handler = logging.Handler()
    handler.setFormatter(ProjectFormatter())
    handler.emit = lambda record: lines.append(handler.format(record))
    LOGGER.addHandler(handler)
    yield lines
    LOGGER.removeHandler(handler)
