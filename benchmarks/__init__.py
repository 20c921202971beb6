"""Measurement scripts, run from the repository root with ``python -m benchmarks.<folder>.<script>``.

``speed/`` times training, loading, inference and start-up; ``accuracy/`` trains and scores models
on generated small-object data; ``gpu_proof/`` checks the CUDA determinism claims on one GPU;
``studies/`` keeps one-off studies whose results the docs quote. README.md lists every script.
"""
