"""The project's release version, in one place: ``utils.__version__``, ``--version``, CITATION.cff and CHANGELOG.md
agree with it (tests/test_docs_pages.py checks that).

``--version`` also says which code is running. A release is the commit tagged ``v<version>``; run from that
commit with no uncommitted change, it prints the bare version (``1.0.0``). Run from any other commit of a git
checkout, it appends the commit as a local version label (``1.0.0+g1a2b3c4``), and ``.dirty`` when tracked
files differ from that commit (``1.0.0+g1a2b3c4.dirty``). Without git, or outside a checkout (an installed copy,
a container built without ``.git``), it prints the bare version.
"""

import argparse
import os
import re
import subprocess
from pathlib import Path

__version__ = "1.0.0"

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# ``git describe --long``: "v1.0.0-3-g1a2b3c4-dirty" past the tag, "1a2b3c4" when the tag is not an ancestor
_DESCRIBED = re.compile(r"^(?:v(?P<tag>[^\s]+)-(?P<ahead>\d+)-g)?(?P<commit>[0-9a-f]{4,40})(?P<dirty>-dirty)?$")


def version_of_description(described: str | None, version: str = __version__) -> str:
    """The version to print for ``git describe``'s output (None: no git answer)."""
    match = _DESCRIBED.match(described.strip()) if described else None
    if match is None:
        return version
    is_release = match["tag"] == version and match["ahead"] == "0" and not match["dirty"]
    return version if is_release else f"{version}+g{match['commit'][:7]}{'.dirty' if match['dirty'] else ''}"


def git_description(root: Path = PROJECT_ROOT, version: str = __version__) -> str | None:
    """``git describe`` of the checkout at ``root`` against the release tag, or None without git or a checkout."""
    if not (root / ".git").exists():  # never describe an enclosing repository that is not this project
        return None
    command = ["git", "-C", str(root), "describe", "--tags", "--long", "--always", "--dirty", "--abbrev=7",
               "--match", f"v{version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):  # no git binary, or git hung
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def describe_version(root: Path = PROJECT_ROOT) -> str:
    """``1.0.0`` for the release itself or a copy without git, else ``1.0.0+g<commit>[.dirty]``."""
    return version_of_description(git_description(root))


class VersionAction(argparse.Action):
    """``--version``: print ``<prog> <version>`` and exit 0; git is asked only when the flag is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the project's version (and the git commit outside a release) and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {describe_version()}")
        parser.exit()


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=VersionAction)
