"""Determinism: RNG state capture, the op audit, the run report and the environment record.

The policy itself (DeterminismPolicy and its scoped switch) is faced by utils/torch_utils.py.
"""
