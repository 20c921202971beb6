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
    """The handbook as users read it: the READMEs, the release files, the benchmark guides and docs/ without the
    study log."""
    pages = ["README.md", "README.zh-CN.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/images/README.md",
             "benchmarks/README.md", "benchmarks/gpu_proof/README.md"]
    return pages + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))


SHELL_LANGUAGES = ("bash", "sh", "shell")


def fenced_blocks(markdown: str) -> list:
    """``(language, text)`` of every fenced block, in page order (language '' when the fence names none)."""
    return re.findall(r"^```([\w+-]*)[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)


# an unlabelled block mixes commands with their output; these starts mark its command lines
COMMAND_STARTS = re.compile(r"^(\$ |python |pip |torchrun |docker |git |nice |env |OMP_NUM_THREADS=|benchmarks/)")


def fenced_command_lines(markdown: str) -> list:
    """The command lines of a page's fenced blocks: every line of a shell block, the lines of an unlabelled block
    that start like a command; continuations joined, comments and a ``$`` prompt cut."""
    lines = []
    for language, block in fenced_blocks(markdown):
        if language not in SHELL_LANGUAGES and language:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            if not language and not COMMAND_STARTS.match(line):
                continue
            line = re.sub(r"(^|\s)#.*$", "", line.removeprefix("$ ")).strip()
            if line:
                lines.append(line)
    return lines
