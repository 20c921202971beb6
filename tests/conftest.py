"""Shared fixtures: the repository on sys.path, a tiny generated data set, clean global state."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.global_state import kept_determinism_switches  # noqa: E402  (needs ROOT on sys.path)
from tests.support.shared_audit import shared_audit_cache  # noqa: E402
from utils.dataset.synthetic.shapes import make_shapes  # noqa: E402

TINY_CFG = ROOT / "tests" / "models" / "tiny.yaml"


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist (``-n N``) each worker gets ``cpu_count // N`` torch threads, and the processes its tests
    start inherit that through ``OMP_NUM_THREADS``: N workers at full width fight over the cores (two 2-thread
    torch jobs on the 2-core machine ran 10-20x slower than one)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


_share_the_cores_between_workers()

MAX_WORKERS = 4  # more workers than this cost more in start-up and memory (about 1 GB each) than they save


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most MAX_WORKERS (the DDP tests start up to 4 processes of their own)."""
    return min(MAX_WORKERS, os.cpu_count() or 1)


# The files with the longest end-to-end runs, longest first. ``--dist loadfile --no-loadscope-reorder``
# (pytest.ini) hands whole files to the workers in collection order; these go first, so the many short
# files balance the workers at the end instead of one worker starting a long file while the others idle.
# Xdist's own order (most tests first) put the one-test multi-process files last. Only the order changes.
LONGEST_FILES_FIRST = ("test_multi_gpu_proof.py", "test_gpu_proof.py", "test_ddp.py", "test_world_size_invariance.py",
                       "test_cluster_slurm.py", "test_ddp_resume.py", "test_tile_training.py",
                       "test_reproducibility.py", "test_train.py", "test_cluster_signals.py", "test_ddp_multinode.py")


def pytest_collection_modifyitems(config, items):
    """Collect the LONGEST_FILES_FIRST first (a stable sort: every file keeps its tests' order)."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# Every test audits afresh (some patch the op table in-process, which the cache key cannot see) and
# none writes to the user's cache folder; tests/test_audit_cache.py points it at a temporary one, and the
# modules whose runs patch nothing share one per module (tests/support/shared_audit.py).
os.environ["FFCA_AUDIT_CACHE"] = "off"


def write_shapes_dataset(root: Path, n_train: int = 16, n_val: int = 8, seed: int = 0) -> Path:
    """Generate a small shapes data set under ``root`` and return its data YAML."""
    make_shapes(root / "shapes", n_train=n_train, n_val=n_val, seed=seed)
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


@pytest.fixture(scope="module")
def base_model():
    """The loss tests' tiny two-level model (tests/support/loss_inputs.py), seed 0; deep-copy it before training."""
    import copy

    from models.yolo import Model
    from tests.support.loss_inputs import TINY_CFG as LOSS_CFG

    torch.manual_seed(0)
    return Model(copy.deepcopy(LOSS_CFG))


@pytest.fixture(autouse=True)
def restore_global_determinism():
    """Each test starts and ends with PyTorch's global determinism switches as they were, the NaN fill of new
    tensors included."""
    with kept_determinism_switches():
        yield


@pytest.fixture(scope="module")
def audit_once_per_model():
    """The module's runs read the start-up audit from a cache after the first run of each model. A module whose
    runs patch no op table opts in: ``pytestmark = pytest.mark.usefixtures("audit_once_per_model")``
    (tests/support/shared_audit.py)."""
    with shared_audit_cache():
        yield


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


def _inject_write_fault(monkeypatch, root: Path, code: int):
    """Make every write under ``root`` fail with ``code`` (open or os.open for writing, so mkstemp too; mkdir;
    cv2.imwrite), as a full
    disk or read-only mount does; reads and writes elsewhere are untouched. Root ignores mode bits, so this
    stands in for chmod."""
    import builtins
    import errno
    import os

    import cv2

    root = Path(root).resolve()

    def inside(path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(root)

    def fail(path):
        raise OSError(code, os.strerror(code), str(path))

    real_open, real_os_open, real_mkdir, real_imwrite = builtins.open, os.open, Path.mkdir, cv2.imwrite

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)) and any(c in mode for c in "wax+") and inside(file):
            fail(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open(file, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and inside(file):
            fail(file)
        return real_os_open(file, flags, *args, **kwargs)

    def mkdir(self, *args, **kwargs):
        if inside(self) and not (self.is_dir() and kwargs.get("exist_ok")):
            fail(self)
        return real_mkdir(self, *args, **kwargs)

    def imwrite(file, *args, **kwargs):
        return False if inside(file) else real_imwrite(file, *args, **kwargs)  # OpenCV reports failure so

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(cv2, "imwrite", imwrite)
    return errno.errorcode[code]


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(folder)``: from now on every write under ``folder`` fails with ENOSPC."""
    import errno

    return lambda folder: _inject_write_fault(monkeypatch, folder, errno.ENOSPC)


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: from now on every write under ``folder`` fails with EROFS (a read-only mount)."""
    import errno

    return lambda folder: _inject_write_fault(monkeypatch, folder, errno.EROFS)


class _MarkerPayload:
    """Unpickling this object runs ``open(marker, 'w')``, creating the file: a stand-in for a malicious payload."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def hostile_pickle(tmp_path):
    """``(payload, marker)``: put ``payload`` anywhere in a pickle; any unpickler that runs code creates ``marker``
    (a path under tmp_path that does not exist yet)."""
    marker = tmp_path / "hostile_pickle_ran.txt"
    return _MarkerPayload(marker), marker
