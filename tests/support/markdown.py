"""Reading the handbook's Markdown: the shell commands a page shows, and the pages that count as user pages."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_PREFIXES = ("python ", "pip ", "torchrun ", "docker ")


def normal(text: str) -> str:
    return " ".join(text.split())


def commands(markdown: str) -> set:
    """Shell commands of a Markdown text: fenced lines (continuations joined, comments cut) and inline code."""
    found = set()
    for block in re.findall(r"```[a-z]*\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#\s.*$", "", line).strip()
            if line.startswith(COMMAND_PREFIXES):
                found.add(normal(line))
    outside = re.sub(r"```.*?```", "", markdown, flags=re.S)
    found |= {normal(span) for span in re.findall(r"`([^`\n]+)`", outside) if span.startswith(COMMAND_PREFIXES)}
    return found


def user_pages() -> list:
    """The handbook as users read it: the READMEs, the release files and docs/ without the study log."""
    pages = ["README.md", "README.zh-CN.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/images/README.md"]
    return pages + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
