#!/usr/bin/env bash
# The GPU proof on a server image as it is (python3 with torch, no package registry), in one command:
#
#   benchmarks/gpu_proof/on_device.sh OUT_DIR [more flags of python -m benchmarks.gpu_proof.proof]
#
# Writes OUT_DIR/proof.json (the record), OUT_DIR/proof.log (everything printed) and OUT_DIR/work/
# (data, run folders and train.py logs), and exits with the proof's code: 0 every claim passed,
# 1 a claim failed, 3 incomplete, 2 a bad argument or a machine the preflight refuses.
# The proof imports nothing beyond torch, torchvision, numpy, opencv, pyyaml, pandas, matplotlib and
# tqdm (it runs without ultralytics-thop, pycocotools, openvino and mlflow), so no wheels travel with it.
set -euo pipefail

if [ $# -lt 1 ] || [ -z "$1" ]; then
    echo "usage: benchmarks/gpu_proof/on_device.sh OUT_DIR [proof flags]" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

# A missing module is one line here, not a traceback minutes into the proof.
python3 -c "import torch, torchvision, numpy, cv2, yaml, pandas, matplotlib, tqdm" \
    || { echo "ERROR: the image lacks a module the proof imports (see the line above)" >&2; exit 2; }

set +e
PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_proof.proof --out "$out/proof.json" --workdir "$out/work" "$@" \
    2>&1 | tee "$out/proof.log"
code=${PIPESTATUS[0]}
set -e
echo "proof exit code $code; record $out/proof.json, log $out/proof.log" | tee -a "$out/proof.log"
exit "$code"
