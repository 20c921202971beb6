"""Frozen one-off studies: each produced a result that the docs quote, with the command to rerun it."""
