"""Users' own model blocks, imported from files named with ``--modules FILE.py``.

A file passed with ``--modules`` (train.py, val.py, detect.py, export.py, audit.py; repeatable) is
imported before any model is built, so the blocks it decorates with ``@register_module``
(``models/yolo.py``) can be named in a model YAML without editing the project. Each file is
imported once per process, under a module name of its own (``ffca_user_modules.<stem>_<digest>``),
so two files with the same name do not replace each other. A file that fails to import is one
UserError line naming the file, the line and the error. Checkpoints record each loaded file's name
and SHA-256 (:func:`module_records`); a checkpoint whose blocks are not registered names the
file to pass (:func:`missing_blocks_message`).
"""

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path

from utils.errors import UserError, first_line

CHECKPOINT_KEY = "user_modules"  # a checkpoint's [{"file": name, "sha256": hex}] of the --modules files
_PACKAGE = "ffca_user_modules"
_loaded: dict = {}  # resolved path -> {"file", "sha256", "module"}


def _failure_line(error: BaseException, path: Path) -> str:
    """`` at line N`` of ``path`` where ``error`` arose (a syntax error's own line), or ''."""
    if isinstance(error, SyntaxError) and error.lineno:
        return f" at line {error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if Path(f.filename).resolve() == path]
    return f" at line {frames[-1].lineno}" if frames else ""


def _import_file(path: Path, digest: str, flag: str):
    """Import ``path`` under a unique module name; any failure is one UserError line."""
    name = f"{_PACKAGE}.{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: whatever it raises is reported in one line
        del sys.modules[name]
        raise UserError(f"{flag}: importing it failed{_failure_line(e, path)} ({type(e).__name__}: "
                        f"{first_line(e)}); fix the file or leave the flag out") from None
    return module


def load_user_modules(paths) -> list:
    """Import each ``--modules`` file (once per process); returns their records ``{"file", "sha256"}``.

    A missing file, a file that is not Python source, or one that fails to import is a UserError
    naming it. A file already imported in this process (same path and content) is not imported again.
    """
    records = []
    for value in [paths] if isinstance(paths, (str, Path)) else list(paths or ()):
        flag = f"--modules {value}"
        path = Path(value).expanduser()
        if not path.is_file():
            raise UserError(f"{flag}: file not found; give the path of a Python file whose blocks use "
                            "@register_module (models/yolo.py)")
        if path.suffix != ".py":
            raise UserError(f"{flag}: not a .py file; give the Python file that defines and registers the blocks")
        path = path.resolve()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        known = _loaded.get(path)
        if known is not None and known["sha256"] != digest:
            raise UserError(f"{flag}: the file changed after it was imported in this process; restart to use it")
        if known is None:
            known = _loaded[path] = {"file": path.name, "sha256": digest, "module": _import_file(path, digest, flag)}
        records.append({"file": known["file"], "sha256": known["sha256"]})
    return records


def module_records(paths) -> list:
    """``[{"file": name, "sha256": hex}]`` of the ``--modules`` files ``paths`` imported in this process (for a
    run's checkpoints: the files its own options name, not every file the process has imported)."""
    resolved = [Path(value).expanduser().resolve() for value in ([paths] if isinstance(paths, (str, Path))
                                                                 else list(paths or ()))]
    return [{"file": _loaded[path]["file"], "sha256": _loaded[path]["sha256"]} for path in resolved if path in _loaded]


def recorded_files(ckpt: dict) -> list:
    """The ``--modules`` records a checkpoint holds, as well-formed ``{"file", "sha256"}`` dicts."""
    records = ckpt.get(CHECKPOINT_KEY) if isinstance(ckpt, dict) else None
    if not isinstance(records, list):
        return []
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("file"), str)
            and isinstance(r.get("sha256"), str)]


def missing_blocks_message(source: str, blocks: list, records: list) -> str:
    """One line: ``source``'s model uses ``blocks`` that no loaded file registers, and the file(s) to pass."""
    names = ", ".join(sorted(set(blocks)))
    if records:
        files = " ".join(f"--modules path/{r['file']}" for r in records)
        digests = ", ".join(f"{r['file']} SHA-256 {r['sha256'][:12]}" for r in records)
        return (f"{source}: the model uses blocks that are not registered ({names}); it was trained with "
                f"{digests}: pass {files}")
    return (f"{source}: the model uses blocks that are not registered ({names}); pass --modules FILE.py with "
            "the file that registers them with @register_module")


def changed_files(ckpt: dict) -> list:
    """Lines for each file the checkpoint records whose name only files with another SHA-256 loaded now carry."""
    loaded: dict = {}
    for entry in _loaded.values():
        loaded.setdefault(entry["file"], set()).add(entry["sha256"])
    return [f"--modules {r['file']}: not the file the checkpoint was trained with (SHA-256 "
            f"{', '.join(sorted(d[:12] for d in loaded[r['file']]))}, recorded {r['sha256'][:12]}); its blocks "
            "load if their parameters still fit"
            for r in recorded_files(ckpt) if r["file"] in loaded and r["sha256"] not in loaded[r["file"]]]
