#!/usr/bin/env bash
# The multi-GPU proof on a server with 4 GPUs or more, as it is (python3 with torch), in one command:
#
#   benchmarks/gpu_proof/multi_gpu.sh OUT_DIR [more flags of python -m benchmarks.gpu_proof.multi_gpu]
#
# Three checks in at most 8 minutes, each run on 4 processes (one per GPU, NCCL): a rerun gives the
# same checksum; a run stopped by SIGTERM mid-epoch and resumed gives the uninterrupted checksum; a
# --micro-batch run stopped mid-epoch and resumed on 2 processes gives the 4-process checksum.
# The dry run on a CPU (gloo): multi_gpu.sh OUT_DIR --device cpu --quick
#
# Writes OUT_DIR/multi_gpu.json (the record), OUT_DIR/multi_gpu.log (everything printed) and
# OUT_DIR/work/ (data, run folders and train.py logs), and exits with the proof's code: 0 every
# check passed, 1 a check failed, 3 incomplete (no check failed, but one could not be decided: an
# ERROR row, e.g. a run that crashed or ran out of memory, or a run still going at the deadline),
# 2 a bad argument, a machine with fewer GPUs than processes, or a module the proof needs that does
# not import (benchmarks/gpu_proof/start.py).
exec bash "$(dirname "$0")/in_out_dir.sh" multi_gpu.sh benchmarks.gpu_proof.multi_gpu multi_gpu "multi-GPU proof" "$@"
