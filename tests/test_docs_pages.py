"""The release files and the handbook's rules that a program can check: the license is the whole AGPL-3.0,
the version agrees everywhere it is written, and the citation names the FFCA-YOLO paper."""

import re
from pathlib import Path

import yaml

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


def changelog_versions(markdown: str) -> list:
    return re.findall(r"^## (\d+\.\d+\.\d+)\b", markdown, flags=re.M)


def test_the_version_is_the_same_in_the_code_the_citation_and_the_changelog():
    citation = yaml.safe_load(read("CITATION.cff"))
    assert str(citation["version"]) == __version__
    assert changelog_versions(read("CHANGELOG.md"))[0] == __version__


def test_changelog_versions_are_newest_first():
    assert changelog_versions("## 1.1.0 (unreleased)\n\n## 1.0.0\n") == ["1.1.0", "1.0.0"]
    versions = [tuple(map(int, v.split("."))) for v in changelog_versions(read("CHANGELOG.md"))]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)


def test_the_citation_refers_to_the_ffca_yolo_paper():
    citation = yaml.safe_load(read("CITATION.cff"))
    assert citation["cff-version"] == "1.2.0" and citation["authors"] and citation["license"].startswith("AGPL-3.0")
    paper = next(r for r in citation["references"] if r.get("doi") == PAPER_DOI)
    assert [a["family-names"] for a in paper["authors"]] == ["Zhang", "Ye", "Zhu", "Liu", "Guo", "Yan"]
    assert paper["year"] == 2024 and "Remote Sensing" in paper["journal"]
