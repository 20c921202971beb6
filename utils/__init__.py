"""Shared helpers of the entry scripts; ``__version__`` is the project's release (see CHANGELOG.md)."""

from utils.version import __version__

__all__ = ["__version__"]
