"""The GPU proof (``python -m benchmarks.gpu_proof.proof``) and its parts.

Imports nothing: proof.py sets ``CUBLAS_WORKSPACE_CONFIG`` before torch is first imported.
"""
