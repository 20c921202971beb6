"""The release files and the handbook's rules that a program can check: the license is the whole AGPL-3.0,
the version agrees everywhere it is written, the citation names the FFCA-YOLO paper, user pages name no issue
numbers or commit hashes, the first command's figure is one median and range everywhere, and every command
the README shows parses."""

import argparse
import datetime
import importlib
import importlib.util
import re
import shlex
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.markdown import SHELL_LANGUAGES, commands, fenced_blocks, fenced_command_lines, user_pages
from utils import __version__

ROOT = Path(__file__).resolve().parents[1]
PAPER_DOI = "10.1109/TGRS.2024.3363057"


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def test_license_is_the_complete_agpl_3():
    text = read("LICENSE")
    lines = text.splitlines()
    assert lines[0].strip() == "GNU AFFERO GENERAL PUBLIC LICENSE"
    assert lines[1].strip() == "Version 3, 19 November 2007"
    sections = re.findall(r"^ {2}(\d+)\. [A-Z]", text, flags=re.M)
    assert sections == [str(n) for n in range(18)]  # 0. Definitions ... 17. Interpretation of Sections 15 and 16
    assert "13. Remote Network Interaction; Use with the GNU General Public License." in text
    assert "END OF TERMS AND CONDITIONS" in text and len(lines) == 661


def test_the_version_is_the_same_in_the_code_the_citation_and_the_changelog():
    citation = yaml.safe_load(read("CITATION.cff"))
    assert str(citation["version"]) == __version__
    assert keep_a_changelog(read("CHANGELOG.md"))[1][0] == __version__  # the newest release, after Unreleased


def test_the_citation_refers_to_the_ffca_yolo_paper():
    citation = yaml.safe_load(read("CITATION.cff"))
    assert citation["cff-version"] == "1.2.0" and citation["authors"] and citation["license"].startswith("AGPL-3.0")
    paper = next(r for r in citation["references"] if r.get("doi") == PAPER_DOI)
    assert [a["family-names"] for a in paper["authors"]] == ["Zhang", "Ye", "Zhu", "Liu", "Guo", "Yan"]
    assert paper["year"] == 2024 and "Remote Sensing" in paper["journal"]


ISSUE_NUMBER = re.compile(r"\bissues?[ -]#?\d+|\bPR ?#?\d+|\bpull request #?\d+", flags=re.I)
# 7 to 40 hex digits with at least one letter and one digit, not part of a longer word, path or number
COMMIT_HASH = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?=-dirty\b|(?![\w-]))")


def lab_log_marks(markdown: str) -> list:
    return ISSUE_NUMBER.findall(markdown) + COMMIT_HASH.findall(markdown)


def test_the_lab_log_checker_finds_issue_numbers_and_hashes_only():
    text = "As issue 40 found (see #issue-38-x), at e19b661 and 60cc776-dirty, in PR 12."
    assert lab_log_marks(text) == ["issue 40", "issue-38", "PR 12", "e19b661", "60cc776"]
    clean = ("1,872,157 params, 0.517 mAP, cu128, AVX512, SHA-256, 4096:8, yolov5n-p2, decade, "
             "github.com/yemu1138178251/FFCA-YOLO/issues/13, 2026-12-05-initialisation.md")
    assert lab_log_marks(clean) == []


@pytest.mark.parametrize("page", user_pages())
def test_user_pages_name_no_issue_numbers_or_commit_hashes(page):
    """The handbook is for users, who cannot follow an issue number or a commit; the study log keeps them."""
    assert lab_log_marks(read(page)) == [], page


def first_command_table(results: str) -> dict:
    """docs/results.md's first-command table: ``{"seeds": {seed: (mAP50, mAP50-95)}, "median": row text}``."""
    section = results.split("## The first command", 1)[1].split("\n## ", 1)[0]
    seeds = {int(seed): (float(m50), float(m5095)) for seed, m50, m5095
             in re.findall(r"^\| (\d+) \| (0\.\d{3}) \| (0\.\d{3}) \|$", section, flags=re.M)}
    median = re.search(r"^\| median \(range\) \| (.+) \| (.+) \|$", section, flags=re.M)
    return {"seeds": seeds, "median": median.groups() if median else None}


def median_and_range(values) -> str:
    return f"{statistics.median(values):.3f} (range {min(values):.3f}–{max(values):.3f})"


def test_the_first_command_figure_is_the_median_and_range_of_its_seeds():
    table = first_command_table(read("docs/results.md"))
    assert sorted(table["seeds"]) == [0, 1, 2]
    mAP50, mAP50_95 = zip(*table["seeds"].values())
    assert table["median"] == (median_and_range(mAP50), median_and_range(mAP50_95))


def test_the_readmes_quote_the_first_command_figure_of_the_results():
    mAP50_95 = [m for _, m in first_command_table(read("docs/results.md"))["seeds"].values()]
    median, low, high = (f"{v:.3f}" for v in (statistics.median(mAP50_95), min(mAP50_95), max(mAP50_95)))
    assert f"median **mAP50-95 {median} (range\n{low}–{high})**" in read("README.md")
    assert f"mAP50-95 中位数为 {median}（范围 {low}–{high}）" in read("README.zh-CN.md")


def first_command_figures(markdown: str) -> set:
    """mAP figures written right after ``mAP50``/``mAP50-95`` in paragraphs that speak of the first command."""
    found = set()
    for paragraph in re.split(r"\n\s*\n", markdown):
        if re.search(r"first command|第一条命令", paragraph, flags=re.I):
            found |= set(re.findall(r"mAP50(?:-95)?[^0-9\n]{0,8}?(\d\.\d{3})(?!\d)", paragraph))
    return found


def test_the_figure_finder_reads_only_first_command_paragraphs():
    text = ("The first command reached mAP50 0.839, mAP50-95 **0.517**.\n\n"
            "Another run: mAP50-95 0.600.\n\nThe first command's model on scenes: mAP50 over four scenes 0.615, "
            "mAP50 0.0032.")
    assert first_command_figures(text) == {"0.839", "0.517"}


@pytest.mark.parametrize("page", user_pages())
def test_every_page_quotes_the_same_first_command_figures(page):
    table = first_command_table(read("docs/results.md"))
    measured = {f"{v:.3f}" for pair in table["seeds"].values() for v in pair}
    assert first_command_figures(read(page)) <= measured, page


class Parsed(Exception):
    """Raised instead of running the command once its outermost argument parse has finished."""

    def __init__(self, unknown: list):
        super().__init__(unknown)
        self.unknown = unknown


# README command -> (module, function that parses its arguments); a script run by file path has a module too
PARSERS = {"train.py": ("train", "parse_opt"), "val.py": ("val", "parse_opt"), "detect.py": ("detect", "parse_opt"),
           "export.py": ("export", "parse_opt"), "audit.py": ("audit", "parse_opt"),
           "convert_checkpoint.py": ("convert_checkpoint", "parse_opt"), "models/yolo.py": ("models.yolo", "main"),
           "data/scripts/convert.py": ("utils.converters.cli", "main")}


def python_argv(command: str) -> list | None:
    """``["train.py", "--epochs", "3"]`` or ``["-m", "pkg", ...]`` of a shown command, also inside torchrun or docker."""
    words = shlex.split(command)
    if words[0] == "torchrun":
        return next(words[i:] for i, w in enumerate(words) if w.endswith(".py"))
    starts = [i for i, w in enumerate(words) if w == "python"]
    return words[starts[0] + 1:] if starts else None


def parse_only(argv: list, monkeypatch) -> list:
    """Parse ``argv`` with its script's own parser, in this process, without running it; the unknown arguments."""
    if argv[0] == "-m":
        name, args = argv[1], argv[2:]
        module = importlib.import_module(name)
        if not hasattr(module, "parse_opt") and hasattr(module, "__path__"):
            module = importlib.import_module(f"{name}.__main__")
        parse = getattr(module, "parse_opt", None) or module.main
    else:
        assert argv[0] in PARSERS, f"{argv[0]}: add the script's parser to PARSERS"
        name, function = PARSERS[argv[0]]
        parse, args = getattr(importlib.import_module(name), function), argv[1:]
    original, depth = argparse.ArgumentParser.parse_known_args, [0]

    def parse_and_stop(self, args=None, namespace=None):
        depth[0] += 1
        try:
            namespace, unknown = original(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0]:  # a subcommand's parser, inside the outer parse
            return namespace, unknown
        raise Parsed(unknown)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_and_stop)
    try:
        parse(args)
    except Parsed as parsed:
        return parsed.unknown
    except SystemExit as stopped:  # --version answers and exits 0 inside the parse
        assert stopped.code == 0 and "--version" in args, f"{argv}: the parser exited {stopped.code}"
        return []
    raise AssertionError(f"{argv}: the command ran past its argument parse")


def test_parse_only_sees_an_unknown_flag_and_never_runs_the_command(monkeypatch):
    assert parse_only(["train.py", "--epochs", "3", "--no-such-flag"], monkeypatch) == ["--no-such-flag"]
    assert parse_only(["data/scripts/convert.py", "visdrone", "--src", "a", "--out", "b"], monkeypatch) == []
    assert python_argv("torchrun --nproc_per_node 2 train.py --epochs 1") == ["train.py", "--epochs", "1"]
    assert python_argv('docker run -v "$PWD/r:/r" img python val.py --data d') == ["val.py", "--data", "d"]


def test_every_readme_command_parses(monkeypatch):
    shown = [c for c in sorted(commands(read("README.md"))) if not c.startswith(("pip ", "python -m pytest"))]
    argvs = [argv for argv in map(python_argv, shown) if argv]
    assert len(argvs) >= 10
    for argv in argvs:
        assert parse_only(argv, monkeypatch) == [], " ".join(argv)


def fenced_commands_of_pages() -> list:
    """``(page, command line)`` of every user page's fenced commands."""
    return [(page, line) for page in user_pages() for line in fenced_command_lines(read(page))]


def shown_commands(markdown: str) -> list:
    """A page's fenced command lines and its inline commands (`` `python benchmarks/x.py ...` ``)."""
    return sorted(set(fenced_command_lines(markdown)) | commands(markdown))


# a path into the repository's own folders, or a script at its top level (train.py, audit.py, ...)
REPOSITORY_FOLDERS = ("benchmarks", "data", "docs", "models", "tests", "utils", ".ci")
PLACEHOLDER = re.compile(r"[*<>$]|\b[A-Z]{2,}\b|\.\.\.")  # models/NAME.yaml, X.Y, $VAR, globs: not a real name


USER_FILE_FLAGS = ("--modules",)  # their value is the user's own file, not one of the repository's


def repository_files_named(command: str) -> list:
    """The words of a shell command that name a file or folder of this repository (``models/x.yaml``,
    ``train.py``, ``tests/test_a.py::test_b``)."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: the bash -n check reports it
        return []
    named = []
    for previous, word in zip([""] + words, words):
        if previous in USER_FILE_FLAGS or word.split("=", 1)[0] in USER_FILE_FLAGS:
            continue
        word = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        path = word.split("::", 1)[0]
        if PLACEHOLDER.search(path):
            continue
        top_level_script = "/" not in path and path.endswith((".py", ".sh"))
        if top_level_script or path.split("/", 1)[0] in REPOSITORY_FOLDERS:
            named.append(path)
    return named


def test_the_file_finder_reads_repository_names_only():
    command = ("OMP_NUM_THREADS=1 python train.py --cfg models/ffca-yolo-n.yaml --data /data/mine.yaml "
               "--hyp=data/hyps/hyp.scratch-low.yaml --weights runs/train/exp/weights/best.pt --source images/")
    assert repository_files_named(command) == ["train.py", "models/ffca-yolo-n.yaml", "data/hyps/hyp.scratch-low.yaml"]
    assert repository_files_named("python -m pytest -q tests/test_a.py::test_b models/NAME.yaml docs/*.md") == [
        "tests/test_a.py"]
    assert written_by(["sed 's#a#b#' data/shapes.yaml > data/shapes24.yaml", "echo 2>&1"]) == {"data/shapes24.yaml"}
    assert repository_files_named("python val.py --modules my_blocks.py --modules=blocks2.py --cfg models/a.yaml") == [
        "val.py", "models/a.yaml"]


def written_by(commands: list) -> set:
    """Files the commands themselves write with a redirection (``sed ... > data/x.yaml``)."""
    return {name for command in commands for name in re.findall(r">\s*([\w./-]+)", command)}


def test_every_shown_command_names_repository_files_that_exist():
    """Fenced and inline commands alike: `python benchmarks/gpu_proof.py` once named a module as a file."""
    missing = []
    for page in user_pages():
        commands_shown = shown_commands(read(page))
        made = written_by(commands_shown)
        missing += [(page, name) for command in commands_shown for name in repository_files_named(command)
                    if not (ROOT / name).exists() and name not in made]
    assert missing == []


def python_modules_run(command: str) -> list:
    return re.findall(r"\bpython3? -m ([\w.]+)", command)


def test_every_python_module_of_a_fenced_command_imports():
    """``python -m pkg.mod`` names a module this checkout (or its requirements) provides; found without running."""
    modules = sorted({(page, name) for page, command in fenced_commands_of_pages()
                      for name in python_modules_run(command)})
    assert len(modules) >= 20  # the finder really read the pages' commands
    unresolved = []
    for page, name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found and name not in OPTIONAL_MODULES:
            unresolved.append((page, name))
    assert unresolved == []


# modules a page tells the user to install first (requirements-extras.txt or a benchmark's own step)
OPTIONAL_MODULES = {"mlflow", "tensorboard", "onnxsim", "openvino"}


MACHINE_STORY = re.compile(r"\bthis (?:2-core )?machine\b|本机|这台机器|(?<![\w.])/(?:work|root|home)/[\w.-]+", flags=re.I)


def test_the_machine_story_finder():
    text = "On this machine it took 3 h; see /work/main/runs or /home/me/x, and /root/.cache; 在本机上。"
    assert MACHINE_STORY.findall(text) == ["this machine", "/work/main", "/home/me", "/root/.cache", "本机"]
    assert MACHINE_STORY.findall("a 2-core CPU, /data/mine.yaml, /tmp/yolov5pkg, runs/work/x, a machine") == []


@pytest.mark.parametrize("page", user_pages())
def test_user_pages_tell_no_machine_stories(page):
    """A user has another machine: a page says what was measured and how, not where it happened to run."""
    assert MACHINE_STORY.findall(read(page)) == [], page


CHANGE_TYPES = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE_HEADING = re.compile(r"^\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def keep_a_changelog(markdown: str) -> list:
    """``[(version or "Unreleased", date or None, {change type: [items]})]`` of a Keep a Changelog file,
    newest first; raises ValueError naming the first line that breaks the format."""
    lines = markdown.splitlines()
    if not lines or lines[0] != "# Changelog":
        raise ValueError("the first line must be '# Changelog'")
    releases, kind = [], None
    for number, line in enumerate(lines[1:], start=2):
        if line.startswith("## "):
            release = RELEASE_HEADING.match(line[3:])
            if line == "## [Unreleased]" and not releases:
                releases.append(("Unreleased", None, {}))
            elif release:
                datetime.date.fromisoformat(release[2])
                releases.append((release[1], release[2], {}))
            else:
                raise ValueError(f"line {number}: {line!r} is neither '## [Unreleased]' (first) nor '## [x.y.z] - "
                                 "YYYY-MM-DD'")
            kind = None
        elif line.startswith("### "):
            kind = line[4:]
            if not releases or kind not in CHANGE_TYPES or kind in releases[-1][2]:
                raise ValueError(f"line {number}: {line!r} is not a new Added/Changed/Deprecated/Removed/Fixed/"
                                 "Security heading under a release")
            releases[-1][2][kind] = []
        elif line.startswith("- "):
            if kind is None:
                raise ValueError(f"line {number}: an entry outside a change-type heading")
            releases[-1][2][kind].append(line[2:])
        elif line.startswith("#"):
            raise ValueError(f"line {number}: {line!r}: only ## releases and ### change types")
    if not releases or releases[0][0] != "Unreleased":
        raise ValueError("the first section must be '## [Unreleased]'")
    return releases


def test_the_changelog_reader_refuses_what_keep_a_changelog_does_not_allow():
    good = "# Changelog\n\n## [Unreleased]\n\n### Added\n\n## [1.1.0] - 2027-01-02\n\n### Fixed\n\n- a fix\n  more\n"
    assert keep_a_changelog(good) == [("Unreleased", None, {"Added": []}), ("1.1.0", "2027-01-02", {"Fixed": ["a fix"]})]
    for bad in ("# Changelog\n\n## 1.0.0 (unreleased)\n",  # the form this file had before the release
                "# Changelog\n\n## [1.0.0] - 2026-12-07\n",  # no Unreleased section
                "# Changelog\n\n## [Unreleased]\n\n**Models**\n\n- a line\n",  # a bold topic instead of a type
                "# Changelog\n\n## [Unreleased]\n\n### Improvements\n",
                "# Changelog\n\n## [Unreleased]\n\n## [1.0.0] - 2026-13-07\n"):
        with pytest.raises(ValueError):
            keep_a_changelog(bad)


def test_the_changelog_follows_keep_a_changelog_newest_first():
    releases = keep_a_changelog(read("CHANGELOG.md"))
    versions = [tuple(map(int, v.split("."))) for v, _, _ in releases[1:]]
    dates = [date for _, date, _ in releases[1:]]
    assert versions and versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)
    assert all(items for _, _, changes in releases[1:] for items in changes.values())  # no empty type in a release


def shell_blocks_of_pages() -> list:
    return [(page, block) for page in user_pages() for language, block in fenced_blocks(read(page))
            if language in SHELL_LANGUAGES]


def unparsable_shell_blocks(blocks: list, folder: Path) -> list:
    """The ``(page, block)`` pairs that ``bash -n`` refuses, checked in one bash process."""
    paths = []
    for number, (_, block) in enumerate(blocks):
        paths.append(folder / f"block{number}.sh")
        paths[-1].write_text(block, encoding="utf-8")
    script = 'for f in "$@"; do bash -n "$f" 2>/dev/null || echo "$f"; done'
    refused = subprocess.run(["bash", "-c", script, "bash", *map(str, paths)], capture_output=True, text=True,
                             check=True).stdout.split()
    return [blocks[paths.index(Path(name))] for name in refused]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_every_fenced_shell_block_parses_with_bash_n(tmp_path):
    """A block pasted into a shell must not open a quote or a here-document that swallows the next lines."""
    planted = [("x.md", "git clone <this repository's URL> ffca-yolo\npip install -r requirements.txt\n"),
               ("x.md", 'echo "$HOME"\n')]
    assert unparsable_shell_blocks(planted, tmp_path) == planted[:1]
    blocks = shell_blocks_of_pages()
    assert len(blocks) >= 50
    assert unparsable_shell_blocks(blocks, tmp_path) == []


def test_the_readme_test_command_is_the_one_ci_runs():
    """The install block's test command, alone on its line, is exactly what .ci/run runs."""
    ci = [line.strip() for line in read(".ci/run").splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    assert ci == ["python -m pytest -q"]
    for readme in ("README.md", "README.zh-CN.md"):
        install = next(block for language, block in fenced_blocks(read(readme)) if "pip install -r" in block)
        assert ci[0] in install.splitlines(), readme


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readmes_first_screen_gets_a_newcomer_started(readme):
    """Within 60 lines: the verified-and-expected box, then clone, install, the test command and a training run."""
    first_screen = read(readme).splitlines()[:60]
    steps = ["git clone ", "pip install -r requirements.txt", "python -m pytest -q", "python train.py "]
    found = [next((n for n, line in enumerate(first_screen) if line.startswith(step)), None) for step in steps]
    box = next((n for n, line in enumerate(first_screen) if line.startswith("> **")), None)
    assert None not in found and box is not None, (readme, found, box)
    assert box < found[0] and found == sorted(found), readme
    assert first_screen[found[2]] == "python -m pytest -q"
