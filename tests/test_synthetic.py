"""The synthetic data sets' command lines (data/scripts/make_*.py) are thin wrappers around
utils/dataset/synthetic/: for the same flags they write, byte for byte, what the modules write."""

import subprocess
import sys
from pathlib import Path

import pytest

from utils.dataset.synthetic import glyphs, shapes, tiny_shapes, very_tiny

ROOT = Path(__file__).resolve().parents[1]

# script, its flags after --root, the module call that should write the same files (2 train + 1 val images)
CASES = [
    ("make_shapes.py", ["--seed", "3", "--img-size", "96", "--min-side", "6", "--max-side", "12",
                        "--objects", "3", "6"],
     lambda root: shapes.make_shapes(root, 2, 1, seed=3, size=96, sides=(6, 12), objects=(3, 6))),
    ("make_tiny_shapes.py", ["--seed", "1"], lambda root: tiny_shapes.make_tiny_shapes(root, 2, 1, seed=1)),
    ("make_glyphs.py", ["--seed", "2", "--img-size", "96", "--min-side", "8", "--max-side", "16"],
     lambda root: glyphs.make_glyphs(root, 2, 1, seed=2, size=96, sides=(8, 16))),
    ("make_very_tiny.py", ["--img-size", "128", "--objects", "6", "10"],
     lambda root: very_tiny.make_very_tiny(root, 2, 1, seed=0, size=128, objects=(6, 10))),
]


def written(folder: Path) -> dict:
    """{relative path: bytes} of every file under ``folder``, the data YAML's own ``path:`` line left out."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".yaml":
            data = b"\n".join(line for line in data.splitlines() if not line.startswith(b"path: "))
        files[path.relative_to(folder).as_posix()] = data
    return files


@pytest.mark.parametrize("script, flags, generate", CASES, ids=[case[0] for case in CASES])
def test_command_line_writes_what_the_module_writes(tmp_path, script, flags, generate):
    (tmp_path / "cli").mkdir()
    (tmp_path / "module").mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "data" / "scripts" / script), "--root",
                           str(tmp_path / "cli" / "set"), "--n-train", "2", "--n-val", "1", *flags],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Wrote 2 train + 1 val images")
    generate(tmp_path / "module" / "set")
    from_cli, from_module = written(tmp_path / "cli"), written(tmp_path / "module")
    assert sum(name.endswith(".jpg") for name in from_cli) == 3
    assert sum(name.endswith(".txt") for name in from_cli) == 3
    assert from_cli == from_module
