"""The project's own files, for the tests that scan its sources: never a virtual environment made inside the
checkout (``python -m venv .venv``), whose packages' files (torch's tests use syntax newer than some Pythons
parse) are not the project's, nor a hidden folder's untracked files (caches, tool state)."""

import os
import subprocess
from pathlib import Path, PurePosixPath

VENV_MARKER = "pyvenv.cfg"  # what every venv and virtualenv folder holds


def project_files(folder: Path, suffix: str) -> list[Path]:
    """Sorted files ending in ``suffix`` under ``folder``. In a git checkout: the tracked ones, and the untracked
    ones git does not ignore, outside hidden folders; elsewhere (an unpacked archive, a copy without .git) every
    such file outside hidden folders. Either way none inside a folder holding ``pyvenv.cfg``."""
    folder = Path(folder)
    tracked, untracked = _git_files(folder, "--cached"), _git_files(folder, "--others", "--exclude-standard")
    if tracked is None or untracked is None:
        candidates = _walk(folder)
    else:
        candidates = tracked + [p for p in untracked if not _in_hidden_folder(p)]
    files = {p for p in candidates if p.endswith(suffix) and (folder / p).is_file()}
    return sorted(folder / p for p in files if not _in_venv(folder, p))


def _git_files(folder: Path, *which: str) -> list[str] | None:
    """Paths relative to ``folder`` that ``git ls-files`` lists with the options ``which``; None where git is
    missing or ``folder`` is not in a checkout."""
    try:
        listed = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", *which], capture_output=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [name for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if name]


def _walk(folder: Path) -> list[str]:
    """Every file under ``folder`` outside hidden folders and venvs (not entered at all), relative to it."""
    found = []
    for current, subfolders, names in os.walk(folder):
        subfolders[:] = sorted(d for d in subfolders
                               if not d.startswith(".") and not os.path.isfile(os.path.join(current, d, VENV_MARKER)))
        relative = Path(current).relative_to(folder)
        found += [(relative / name).as_posix() for name in names]
    return found


def _in_hidden_folder(relative: str) -> bool:
    return any(part.startswith(".") for part in PurePosixPath(relative).parts[:-1])


def _in_venv(folder: Path, relative: str) -> bool:
    """Whether a folder below ``folder`` that holds the file holds ``pyvenv.cfg`` too."""
    parts = PurePosixPath(relative).parts[:-1]
    return any((folder.joinpath(*parts[:depth]) / VENV_MARKER).is_file() for depth in range(1, len(parts) + 1))
