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
# 2 a bad argument or a machine with fewer GPUs than processes.
set -euo pipefail

usage="usage: benchmarks/gpu_proof/multi_gpu.sh OUT_DIR [flags], e.g. multi_gpu.sh multi-out --device cpu --quick"
if [ $# -lt 1 ] || [ -z "$1" ]; then
    echo "$usage" >&2
    exit 2
fi
case "$1" in
    -*) echo "ERROR: the first argument is OUT_DIR, the folder for the record, not the flag '$1'; $usage" >&2
        exit 2 ;;
esac
if [ -e "$1" ] && [ ! -d "$1" ]; then
    echo "ERROR: OUT_DIR '$1' is a file, not a folder: name a new or existing folder" >&2
    exit 2
fi
mkdir -p -- "$1" 2>/dev/null && out=$(cd -- "$1" && pwd) \
    || { echo "ERROR: cannot create or enter OUT_DIR '$1': name a folder you can write to" >&2; exit 2; }
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

# A missing module is one line here, not a traceback minutes into the proof.
python3 -c "import torch, torchvision, numpy, cv2, yaml, pandas, matplotlib, tqdm" \
    || { echo "ERROR: the image lacks a module the proof imports (see the line above)" >&2; exit 2; }

# A record left by an earlier proof in OUT_DIR must not be named as this one's.
record_stamp() { python3 -c 'import os, sys; print(os.stat(sys.argv[1]).st_mtime_ns)' "$out/multi_gpu.json" 2>/dev/null; }
before=$(record_stamp || true)
set +e
PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_proof.multi_gpu --out "$out/multi_gpu.json" --workdir "$out/work" "$@" \
    2>&1 | tee "$out/multi_gpu.log"
code=${PIPESTATUS[0]}
set -e
after=$(record_stamp || true)
if [ -n "$after" ] && [ "$after" != "$before" ]; then
    record="record $out/multi_gpu.json"
else
    record="no record written (see the lines above)"
fi
echo "multi-GPU proof exit code $code; $record, log $out/multi_gpu.log" | tee -a "$out/multi_gpu.log"
exit "$code"
