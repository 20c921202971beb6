"""The suite's own scheduling hints (tests/conftest.py) name files that exist."""

from pathlib import Path

from tests.conftest import LONGEST_FILES_FIRST


def test_every_file_scheduled_first_exists():
    here = Path(__file__).resolve().parent
    assert [name for name in LONGEST_FILES_FIRST if not (here / name).is_file()] == []
    assert len(set(LONGEST_FILES_FIRST)) == len(LONGEST_FILES_FIRST)
