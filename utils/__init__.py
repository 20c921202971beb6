"""Shared helpers of the entry scripts; ``__version__`` is the project's release (see CHANGELOG.md)."""

__version__ = "1.0.0"
