#!/usr/bin/env bash
# The GPU proof on a server image as it is (python3 with torch, no package registry), in one command:
#
#   benchmarks/gpu_proof/on_device.sh OUT_DIR [more flags of python -m benchmarks.gpu_proof.proof]
#
# Writes OUT_DIR/proof.json (the record), OUT_DIR/proof.log (everything printed) and OUT_DIR/work/
# (data, run folders and train.py logs), and exits with the proof's code: 0 every claim passed,
# 1 a claim failed, 3 incomplete (no claim failed, but one could not be decided: an ERROR row, where
# the check itself raised, e.g. out of memory or a missing module, or the time budget ran out),
# 2 a bad argument, a machine the preflight refuses, or a module below that does not import.
# The proof imports nothing beyond torch, torchvision, numpy, opencv, pyyaml, pandas, matplotlib and
# tqdm (it runs without ultralytics-thop, pycocotools, openvino and mlflow), so no wheels travel with it.
exec bash "$(dirname "$0")/in_out_dir.sh" on_device.sh benchmarks.gpu_proof.proof proof "proof" "$@"
