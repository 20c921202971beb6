"""The dependency rules of docs/architecture.md, checked on the source: no import cycles (function-level
imports included), no arrow back up (utils/ -> models/ or an entry script, models/ -> an entry script),
no code loaded by file path in product code (which hides an import from both checks); benchmarks/ is a
package: no sys.path edits in it, and tests reach it by module name, never by file path."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.project_files import project_files

ROOT = Path(__file__).resolve().parents[1]
ENTRY_SCRIPTS = {"train", "val", "detect", "audit", "export", "hubconf", "convert_checkpoint"}
NOT_PROJECT_CODE = {"tests", "benchmarks", "data", "runs", ".git"}


def project_modules(root: Path) -> dict:
    """``{dotted module name: path}`` for every project .py file outside tests, benchmarks and data (never one
    in a venv made inside the checkout: tests/support/project_files.py)."""
    modules = {}
    for path in project_files(root, ".py"):
        parts = path.relative_to(root).with_suffix("").parts
        if set(parts) & NOT_PROJECT_CODE or any(p.startswith(".") for p in parts):
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imported_names(source: str, module: str, is_package: bool = False) -> set:
    """Every dotted name ``source`` imports anywhere (module level, functions, ``__main__`` blocks).

    ``from X import Y`` yields ``X`` and ``X.Y`` (Y may be a submodule); relative imports are made
    absolute from ``module`` (a package's ``__init__`` counts as the package itself).
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return {n for n in names if n}


def resolve(name: str, known: set) -> str | None:
    """The longest known module that ``name`` is, or lies inside (``utils.ops.xywh2xyxy`` -> ``utils.ops``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> dict:
    """``{module: set of project modules it imports}``; imports of the module itself are dropped."""
    modules = project_modules(root)
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        imported = imported_names(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        targets = {resolve(n, known) for n in imported}
        graph[name] = {t for t in targets if t and t != name and not name.startswith(f"{t}.")}
    return graph


def find_cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (each a cycle), sorted."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def upward_imports(graph: dict) -> list:
    """``'importer -> imported'`` for utils/ importing models/ or an entry script, and models/ an entry script."""
    found = []
    for module, targets in sorted(graph.items()):
        layer = module.split(".")[0]
        for target in sorted(targets):
            to_entry = target in ENTRY_SCRIPTS
            if (layer == "utils" and (to_entry or target.split(".")[0] == "models")) or (layer == "models" and to_entry):
                found.append(f"{module} -> {target}")
    return found


# calls that load or run code by file path or by a module name held in a string: the import graph cannot see them
FILE_PATH_LOADERS = {"spec_from_file_location", "SourceFileLoader", "SourcelessFileLoader", "run_path", "run_module",
                     "load_source"}


def file_path_loads(source: str) -> list:
    """``'line N: name'`` for every call of a :data:`FILE_PATH_LOADERS` name, as a function or an attribute
    (``importlib.util.spec_from_file_location(...)``, ``runpy.run_path(...)``, ``SourceFileLoader(...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in FILE_PATH_LOADERS:
            found.append((node.lineno, node.col_offset, name))
    return [f"line {line}: {name}" for line, _, name in sorted(found)]


def hidden_imports(root: Path) -> dict:
    """``{module: file_path_loads(...)}`` for the project modules (utils/, models/, entry scripts) that have any."""
    found = {}
    for name, path in project_modules(root).items():
        hits = file_path_loads(path.read_text(encoding="utf-8"))
        if hits:
            found[name] = hits
    return found


def sys_path_uses(folder: Path) -> list:
    """``'file:line'`` of every ``sys.path`` expression in the .py files under ``folder``."""
    found = []
    for path in project_files(folder, ".py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                found.append(f"{path.relative_to(folder)}:{node.lineno}")
    return found


BENCHMARK_FILE = re.compile(r"benchmarks[/\\][\w/\\]*\.py")


def benchmark_file_paths(folder: Path) -> list:
    """``'file:line'`` of every string (docstrings aside) that is a path to a .py file under benchmarks/."""
    found = []
    for path in project_files(folder, ".py"):
        source = path.read_text(encoding="utf-8")
        if not BENCHMARK_FILE.search(source):
            continue
        tree = ast.parse(source)
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and BENCHMARK_FILE.fullmatch(node.value)):
                found.append(f"{path.relative_to(folder)}:{node.lineno}")
    return found


def imports_of_test_modules(folder: Path) -> list:
    """``'file:line -> tests.test_x'`` for every import, anywhere in a .py file under ``folder`` (the tests/
    package), of a test module: shared helpers belong in tests/support/, never in another test file."""
    found = []
    for path in project_files(folder, ".py"):
        package = [folder.name, *path.parent.relative_to(folder).parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[:len(package) - (node.level - 1)], *([base] if base else [])])
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            hits = sorted({".".join(n.split(".")[:2]) for n in names if re.fullmatch(r"tests\.test_\w+(\..*)?", n)})
            found.extend(f"{path.relative_to(folder)}:{node.lineno} -> {hit}" for hit in hits)
    return found


# ----------------------------------------------------------------------------- the checker itself


def test_find_cycles_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert find_cycles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imported_names_sees_every_import_form():
    source = """
import os.path
import utils.ops as ops
from . import files
from .metrics import box_iou
from .. import train

def late():
    from models.yolo import Model

if __name__ == "__main__":
    import audit
"""
    names = imported_names(source, "utils.plots")
    assert {"os.path", "utils.ops", "utils", "utils.files", "utils.metrics", "utils.metrics.box_iou",
            "train", "models.yolo", "models.yolo.Model", "audit"} <= names
    assert "utils.files" in imported_names("from . import files", "utils", is_package=True)


def test_checker_flags_a_planted_cycle_and_upward_imports(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "utils" / "helpers.py").write_text("def f():\n    from models.net import Net\n")
    (tmp_path / "models" / "net.py").write_text("from utils.helpers import f\nimport train\n")
    (tmp_path / "train.py").write_text("from models import net\n")
    (tmp_path / "tests" / "test_x.py").write_text("import train\nimport utils.helpers\n")
    graph = import_graph(tmp_path)
    assert "tests.test_x" not in graph
    assert find_cycles(graph) == [["models.net", "train", "utils.helpers"]]
    assert upward_imports(graph) == ["models.net -> train", "utils.helpers -> models.net"]


def test_file_path_loads_sees_every_loader_form():
    source = """
import importlib.util
import runpy
from importlib.machinery import SourceFileLoader
from importlib.util import spec_from_file_location

spec = importlib.util.spec_from_file_location("gen", "data/scripts/make_shapes.py")
runpy.run_path("tool.py")

def late():
    SourceFileLoader("x", "x.py").load_module()
    return spec_from_file_location("y", "y.py"), runpy.run_module("utils.tool")

importlib.import_module("onnx")  # a named optional package: visible enough, not flagged
"""
    assert file_path_loads(source) == ["line 7: spec_from_file_location", "line 8: run_path",
                                       "line 11: SourceFileLoader", "line 12: spec_from_file_location",
                                       "line 12: run_module"]
    assert file_path_loads("import importlib.util\nfrom utils import ops\n") == []


def test_checker_flags_a_planted_file_path_load_in_product_code_only(tmp_path):
    for folder in ("utils", "models", "tests", "benchmarks", "data"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "loader.py").write_text("import runpy\nrunpy.run_path('data/scripts/make.py')\n")
    (tmp_path / "train.py").write_text("import importlib.util\n\nimportlib.util.spec_from_file_location('a', 'a')\n")
    assert hidden_imports(tmp_path) == {"utils.loader": ["line 2: run_path"], "models.loader": ["line 2: run_path"],
                                        "train": ["line 3: spec_from_file_location"]}


def test_benchmark_checks_flag_a_path_edit_and_a_file_path_launch(tmp_path):
    (tmp_path / "bench.py").write_text('"""benchmarks/x.py: a docstring may name the file."""\nimport sys\n'
                                       'sys.path.insert(0, "..")\n')
    (tmp_path / "test_b.py").write_text('import subprocess, sys\nsubprocess.run([sys.executable, "benchmarks/x.py"])\n'
                                        'subprocess.run([sys.executable, "-m", "benchmarks.x"])\n')
    assert sys_path_uses(tmp_path) == ["bench.py:3"]
    assert benchmark_file_paths(tmp_path) == ["test_b.py:2"]


def test_checker_flags_a_planted_import_of_one_test_module_by_another(tmp_path):
    tests = tmp_path / "tests"
    (tests / "support").mkdir(parents=True)
    (tests / "test_a.py").write_text("import tests.test_b\nfrom tests.support.runs import train_run\n\n\n"
                                     "def test_x():\n    from tests.test_c import helper\n")
    (tests / "test_d.py").write_text("from . import test_a, support\nfrom .test_b import thing\n"
                                     "from tests import test_e\nimport tests.testing_tools\n")
    (tests / "support" / "runs.py").write_text("from ..test_f import x\nfrom tests.support import other\n")
    assert imports_of_test_modules(tests) == [
        "support/runs.py:1 -> tests.test_f", "test_a.py:1 -> tests.test_b", "test_a.py:6 -> tests.test_c",
        "test_d.py:1 -> tests.test_a", "test_d.py:2 -> tests.test_b", "test_d.py:3 -> tests.test_e"]


def _plant_a_checkout(root: Path) -> None:
    """Project files beside two venvs (each holding a file no Python parses), a hidden cache folder and a tracked
    tool in a hidden folder."""
    files = {"utils/a.py": "import os\n", "deep/sub/ok.py": "", "utils/notes.txt": "", ".ci/tool.py": "",
             ".cache/stale.py": "", "ignored/q.py": "", ".gitignore": "ignored/\n",
             "venv/pyvenv.cfg": "", "venv/lib/site-packages/torch/broken.py": "def broken(:\n",
             ".newvenv/pyvenv.cfg": "", ".newvenv/lib/mod.py": "def broken(:\n",
             "deep/sub/env/pyvenv.cfg": "", "deep/sub/env/lib/mod.py": "def broken(:\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_scans_read_only_the_projects_files_never_a_venv_inside_the_checkout(tmp_path):
    """``python -m venv .venv`` in the checkout put torch's own tests (Python 3.12 syntax) into the scans."""
    _plant_a_checkout(tmp_path)
    relative = lambda paths: [p.relative_to(tmp_path).as_posix() for p in paths]  # noqa: E731
    assert relative(project_files(tmp_path, ".py")) == ["deep/sub/ok.py", "ignored/q.py", "utils/a.py"]
    assert set(project_modules(tmp_path)) == {"utils.a", "deep.sub.ok", "ignored.q"}


def test_in_a_git_checkout_scans_read_tracked_files_and_untracked_ones_git_does_not_ignore(tmp_path):
    _plant_a_checkout(tmp_path)
    try:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, capture_output=True, timeout=60)
        subprocess.run(["git", "-C", str(tmp_path), "add", "utils/a.py", ".ci/tool.py"], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no usable git here ({e})")
    relative = [p.relative_to(tmp_path).as_posix() for p in project_files(tmp_path, ".py")]
    assert relative == [".ci/tool.py", "deep/sub/ok.py", "utils/a.py"]  # a tracked file in a hidden folder counts
    assert set(project_modules(tmp_path)) == {"utils.a", "deep.sub.ok"}


# ----------------------------------------------------------------------------- the project


@pytest.fixture(scope="module")
def graph() -> dict:
    return import_graph(ROOT)


def test_the_graph_covers_the_project(graph):
    assert {"train", "val", "audit", "models.yolo", "utils.torch_utils", "utils.determinism.op_audit"} <= set(graph)
    assert "utils.torch_utils" in graph["utils.determinism.op_audit"]


def test_project_has_no_import_cycles(graph):
    assert find_cycles(graph) == []


def test_no_import_runs_back_up(graph):
    assert upward_imports(graph) == []


# The one loader by path on purpose: the user's own block files named with --modules, which live outside the
# project and its import graph (utils/user_modules.py).
USER_FILE_LOADERS = {"utils.user_modules": ["spec_from_file_location"]}


def test_no_product_code_loads_code_by_file_path():
    found = {module: [hit.split(": ", 1)[1] for hit in hits] for module, hits in hidden_imports(ROOT).items()}
    assert found == USER_FILE_LOADERS


def test_benchmarks_are_a_package_without_path_edits():
    folders = {path.parent for path in project_files(ROOT / "benchmarks", ".py")}
    assert [str(f) for f in sorted(folders) if not (f / "__init__.py").is_file()] == []
    assert sys_path_uses(ROOT / "benchmarks") == []


def test_tests_reach_benchmarks_by_module_name():
    assert benchmark_file_paths(ROOT / "tests") == []


def test_no_test_file_imports_another_test_file():
    assert imports_of_test_modules(ROOT / "tests") == []
