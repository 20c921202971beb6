"""Chinese documentation stays in step with the English: every command it shows exists in the English,
and the two READMEs show the same commands and the same numbers."""

import re
from functools import cache
from pathlib import Path

import pytest

from tests.support.markdown import commands, normal

ROOT = Path(__file__).resolve().parents[1]
PAIRS = [("README.zh-CN.md", "README.md"), ("docs/datasets.zh-CN.md", "docs/datasets.md"),
         ("docs/determinism.zh-CN.md", "docs/determinism.md")]
ERROR = "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation"


def numbers(markdown: str) -> set:
    """Every number written in a Markdown text (``1,872,157``, ``0.922``, ``50`` of ``mAP50``), as written."""
    return set(re.findall(r"\d+(?:[.,]\d+)*", markdown))


def missing_commands(chinese: str, english: str) -> list:
    """Commands of ``chinese`` that appear neither as a command nor verbatim (whole words) in ``english``."""
    english_commands, english_text = commands(english), normal(english)
    return sorted(c for c in commands(chinese)
                  if c not in english_commands and not re.search(re.escape(c) + r"(?!\S)", english_text))


@pytest.mark.parametrize("chinese, english", PAIRS)
def test_every_chinese_command_exists_in_the_english(chinese, english):
    zh, en = (ROOT / chinese).read_text(encoding="utf-8"), (ROOT / english).read_text(encoding="utf-8")
    assert len(commands(zh)) >= 2  # the checker really found commands
    assert missing_commands(zh, en) == []


def test_checker_reports_a_command_that_drifted():
    english = "```bash\npython train.py --epochs 300   # train\n```\nUse `python val.py --img 640`.\n"
    chinese = ("```bash\npython train.py --epochs 300   # 训练\npython train.py --epochs 30\n```\n"
               "用 `python val.py --img 640` 和 `python detect.py --source x`。\n")
    assert missing_commands(chinese, english) == ["python detect.py --source x", "python train.py --epochs 30"]


def test_the_readmes_show_the_same_commands_and_numbers():
    en, zh = ((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "README.zh-CN.md"))
    assert len(commands(en)) >= 10  # both READMEs' commands were really found
    assert sorted(commands(zh) ^ commands(en)) == []
    assert sorted(numbers(zh) ^ numbers(en)) == []


def test_number_checker_sees_a_changed_figure():
    english = "It reached mAP50 0.922 on 1,872,157 parameters in 5 min 15 s."
    assert numbers(english) == {"50", "0.922", "1,872,157", "5", "15"}
    chinese = "达到 mAP50 0.92，参数 1,872,157，用时 5 min 15 s。"
    assert numbers(chinese) ^ numbers(english) == {"0.92", "0.922"}


def test_every_english_conversion_command_is_in_the_chinese_guide():
    en = commands((ROOT / "docs" / "datasets.md").read_text(encoding="utf-8"))
    zh = commands((ROOT / "docs" / "datasets.zh-CN.md").read_text(encoding="utf-8"))
    steps = {c for c in en if c.startswith(("python data/scripts/convert.py", "python train.py"))}
    assert len(steps) >= 10 and steps <= zh


def test_readmes_link_each_other_and_cover_the_determinism_error():
    en_head = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:5])
    zh = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert "(README.zh-CN.md)" in en_head and "(README.md)" in "\n".join(zh.splitlines()[:5])
    assert ERROR in zh and ERROR in (ROOT / "docs" / "determinism.zh-CN.md").read_text(encoding="utf-8")
    for mode in ("off", "warn", "scoped", "strict"):  # a row per mode; the default's row may say so after the name
        assert re.search(rf"^\| `{mode}`[^|`]* \|", zh, flags=re.M), mode
    assert re.search(r"^\| `scoped`（默认） \|", zh, flags=re.M)


PAGES = ["README.md", "README.zh-CN.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    """Links and pictures of the READMEs and the handbook point at files that exist (anchors not checked)."""
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        assert (path.parent / target).exists(), f"{page}: link {target} points at nothing"


def heading_anchors(markdown: str) -> set:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats -1, -2."""
    seen, anchors = {}, set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_heading_anchors_follow_github():
    text = "# A title\n## Issue 38: the `--x` flag (new)\n```\n# not a heading\n```\n## A title\n"
    assert heading_anchors(text) == {"a-title", "issue-38-the---x-flag-new", "a-title-1"}


@cache
def page_anchors(path: Path) -> frozenset:
    return frozenset(heading_anchors(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES)
def test_link_anchors_name_a_heading(page):
    """A link to ``page.md#anchor`` or ``#anchor`` lands on a heading of that page."""
    path = ROOT / page
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)#([^)\s]+)\)", path.read_text(encoding="utf-8")):
        linked = (path.parent / target) if target else path
        if linked.suffix == ".md":
            assert anchor in page_anchors(linked.resolve()), f"{page}: link {target}#{anchor} names no heading"


@pytest.mark.parametrize("index", ["README.md", "docs/README.md"])
def test_the_readme_and_the_handbook_index_link_every_doc_page(index):
    text = (ROOT / index).read_text(encoding="utf-8")
    base = (ROOT / index).parent
    linked = {(base / target).resolve() for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert sorted(p.name for p in pages - linked) == []
