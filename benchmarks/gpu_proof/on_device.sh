#!/usr/bin/env bash
# The GPU proof on a server image as it is (python3 with torch, no package registry), in one command:
#
#   benchmarks/gpu_proof/on_device.sh OUT_DIR [more flags of python -m benchmarks.gpu_proof.proof]
#
# Writes OUT_DIR/proof.json (the record), OUT_DIR/proof.log (everything printed) and OUT_DIR/work/
# (data, run folders and train.py logs), and exits with the proof's code: 0 every claim passed,
# 1 a claim failed, 3 incomplete (no claim failed, but one could not be decided: an ERROR row, where
# the check itself raised, e.g. out of memory or a missing module, or the time budget ran out),
# 2 a bad argument or a machine the preflight refuses.
# The proof imports nothing beyond torch, torchvision, numpy, opencv, pyyaml, pandas, matplotlib and
# tqdm (it runs without ultralytics-thop, pycocotools, openvino and mlflow), so no wheels travel with it.
set -euo pipefail

usage="usage: benchmarks/gpu_proof/on_device.sh OUT_DIR [proof flags], e.g. on_device.sh proof-out --device cpu --quick"
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
record_stamp() { python3 -c 'import os, sys; print(os.stat(sys.argv[1]).st_mtime_ns)' "$out/proof.json" 2>/dev/null; }
before=$(record_stamp || true)
set +e
PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_proof.proof --out "$out/proof.json" --workdir "$out/work" "$@" \
    2>&1 | tee "$out/proof.log"
code=${PIPESTATUS[0]}
set -e
after=$(record_stamp || true)
if [ -n "$after" ] && [ "$after" != "$before" ]; then
    record="record $out/proof.json"
else
    record="no record written (see the lines above)"
fi
echo "proof exit code $code; $record, log $out/proof.log" | tee -a "$out/proof.log"
exit "$code"
