"""Environment variables: docs/environment.md's table is the list, each row's bad value stops or warns as it says,
and no code outside utils/env_vars.py reads the environment."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from utils import env_vars
from utils.errors import UserError
from tests.support.project_files import project_files

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "environment.md"


def _table(title: str) -> list[list[str]]:
    """The rows (cells without backticks) of the table under the heading ``title``."""
    section = DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip().replace("`", "") for cell in row] for row in rows]


ROWS = _table("Variables the project interprets")


def test_the_tables_list_exactly_the_variables_the_code_reads():
    assert sorted(row[0] for row in ROWS) == sorted(env_vars.VARIABLES)
    assert sorted(row[0] for row in _table("Variables recorded or passed on, not interpreted")) == sorted(
        env_vars.RECORDED)


def _bad_value(tried: str, tmp_path: Path) -> str:
    if tried == "a file":
        (tmp_path / "file").write_text("")
        return str(tmp_path / "file")
    return str(tmp_path / "missing") if tried == "a missing folder" else tried


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_each_variable_stops_or_warns_on_its_bad_value(row, tmp_path, monkeypatch, log_lines):
    name, outcome, tried = row[0], row[-2], row[-1]
    monkeypatch.delenv(name, raising=False)
    default = env_vars.read(name)
    if outcome == "—":  # any value is valid: even an odd one is taken as it is
        monkeypatch.setenv(name, "ünïcode / name")
        assert env_vars.read(name) == "ünïcode / name"
        return
    bad = _bad_value(tried, tmp_path)
    monkeypatch.setenv(name, bad)
    if outcome == "stops":
        with pytest.raises(UserError) as error:
            env_vars.read(name)
        assert str(error.value).startswith(f"{name}={bad!r}: expected {env_vars.VARIABLES[name].accepted}")
        assert not log_lines
    else:
        assert outcome == "warns", row
        assert env_vars.read(name) == default
        assert len(log_lines) == 1 and log_lines[0].startswith(f"WARNING ⚠️ {name}={bad!r}: expected"), log_lines


def test_a_valid_value_is_used(monkeypatch, tmp_path):
    for name, value, expected in [("FFCA_DDP_TIMEOUT_MIN", "0.5", 0.5), ("PIN_MEMORY", "False", False),
                                  ("FFCA_AUDIT_CACHE", "off", None),
                                  ("FFCA_AUDIT_CACHE", str(tmp_path / "new"), tmp_path / "new"),
                                  ("MLFLOW_TRACKING_URI", "http://host:5000", "http://host:5000")]:
        monkeypatch.setenv(name, value)
        assert env_vars.read(name) == expected, name


def test_rank_must_lie_below_the_world_size(monkeypatch):
    from utils.ddp import dist_info_from_env

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UserError, match="RANK=2 with WORLD_SIZE=2"):
        dist_info_from_env()


def _environment_reads(tree: ast.AST) -> list[int]:
    """Line numbers of ``os.getenv(...)``, ``os.environ.get(...)``, ``os.environ[...]`` loads and ``in os.environ``."""
    def environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    lines = []
    for node in ast.walk(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if call and (node.func.attr == "getenv" or (node.func.attr == "get" and environ(node.func.value))):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and environ(node.value) and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return lines


def environment_reads(root: Path) -> dict:
    """``{path: lines that read the environment}`` for the project's .py files under ``root``, tests and run
    folders aside (tests/support/project_files.py: never a venv made inside the checkout)."""
    sources = [p for p in project_files(root, ".py") if not {"tests", "runs"} & set(p.relative_to(root).parts)]
    return {p.relative_to(root).as_posix(): _environment_reads(ast.parse(p.read_text())) for p in sources}


def test_no_code_outside_the_config_module_reads_the_environment():
    found = environment_reads(ROOT)
    readers = {path: lines for path, lines in found.items() if lines and path != "utils/env_vars.py"}
    assert readers == {}
    assert found["utils/env_vars.py"]  # the check sees reads where they are


def test_the_scan_leaves_out_a_venv_made_inside_the_checkout(tmp_path):
    """A venv in the checkout holds torch's own tests, in syntax newer than some Pythons parse: the scan walked
    into it and failed with a SyntaxError."""
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "reader.py").write_text("import os\nos.environ.get('X')\n")
    for venv in ("venv", ".newvenv"):
        package = tmp_path / venv / "lib" / "python3.11" / "site-packages" / "torch"
        package.mkdir(parents=True)
        (tmp_path / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (package / "new_syntax.py").write_text("type Alias[T] = list[T]\n")  # Python 3.12 syntax
        (package / "broken.py").write_text("def broken(:\n")
        (package / "reads.py").write_text("import os\nos.getenv('Y')\n")
    assert environment_reads(tmp_path) == {"utils/reader.py": [2]}


def test_bad_values_in_every_variable_break_no_import():
    """Reading at import made a bad FFCA_DDP_TIMEOUT_MIN (or WORLD_SIZE) fail every entry point before it started."""
    bad = {row[0]: row[-1] for row in ROWS if row[-2] == "stops" and not row[-1].startswith("a ")}
    env = {**os.environ, **bad, "FFCA_DDP_TIMEOUT_MIN": "abc", "PIN_MEMORY": "maybe"}
    code = "import train, val, detect, export, audit, convert_checkpoint; print('imported')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("imported"), done.stderr[-2000:]
    assert re.search(r"ERROR|Traceback", done.stdout + done.stderr) is None
