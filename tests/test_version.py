"""utils/version.py: ``--version`` names the release, and the git commit whenever the code is not that release."""

import shutil
import subprocess

import pytest

from utils import version
from utils.version import describe_version, git_description, version_of_description


@pytest.mark.parametrize("described, printed", [
    ("v1.0.0-0-g1a2b3c4", "1.0.0"),  # the tagged release, clean
    ("v1.0.0-0-g1a2b3c4-dirty", "1.0.0+g1a2b3c4.dirty"),  # the release with uncommitted changes
    ("v1.0.0-5-g1a2b3c4", "1.0.0+g1a2b3c4"),  # five commits after the release
    ("1a2b3c4", "1.0.0+g1a2b3c4"),  # no release tag reachable from this commit
    ("1a2b3c4-dirty", "1.0.0+g1a2b3c4.dirty"),
    ("v0.9.0-0-g1a2b3c4", "1.0.0+g1a2b3c4"),  # another version's tag never makes this the release
    (None, "1.0.0"),  # no git, or not a checkout
    ("fatal: something unexpected", "1.0.0"),
])
def test_the_printed_version_follows_git_describe(described, printed):
    assert version_of_description(described, "1.0.0") == printed


def test_without_a_checkout_or_without_git_the_bare_version(tmp_path, monkeypatch):
    assert git_description(tmp_path) is None  # no .git: an installed copy or a container image

    def no_git(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "git")

    (tmp_path / ".git").mkdir()
    monkeypatch.setattr(version.subprocess, "run", no_git)
    assert git_description(tmp_path) is None
    assert describe_version(tmp_path) == version.__version__


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_checkout_prints_its_commit_until_it_is_the_tagged_release(tmp_path):
    (tmp_path / "a.txt").write_text("1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    release = version.__version__
    assert describe_version(tmp_path) == f"{release}+g{head}"  # untagged: which commit it is
    git(tmp_path, "tag", f"v{release}")
    assert describe_version(tmp_path) == release
    (tmp_path / "a.txt").write_text("2\n")
    assert describe_version(tmp_path) == f"{release}+g{head}.dirty"
    (tmp_path / "untracked.txt").write_text("x\n")  # a run folder or a download is not a code change
    git(tmp_path, "checkout", "-q", "a.txt")
    assert describe_version(tmp_path) == release
