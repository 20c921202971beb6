"""The project's release version, in one place: ``utils.__version__``, ``--version``, CITATION.cff and CHANGELOG.md
agree with it (tests/test_docs_pages.py checks that)."""

__version__ = "1.0.0"
