#!/usr/bin/env bash
# Shared by on_device.sh and multi_gpu.sh: run one proof module with its record, log and work folder
# in OUT_DIR, and end with the module's exit code and one line naming the record (when this run wrote it).
#
#   in_out_dir.sh SCRIPT MODULE NAME LABEL OUT_DIR [flags of python -m MODULE]
#
# SCRIPT is the calling script (for its usage line), NAME the record's file stem (NAME.json, NAME.log),
# LABEL the words before "exit code" on the last line. A bad OUT_DIR is exit 2 with one line.
set -euo pipefail

script=$1 module=$2 name=$3 label=$4
shift 4
usage="usage: benchmarks/gpu_proof/$script OUT_DIR [flags], e.g. $script $name-out --device cpu --quick"
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

# A record left by an earlier proof in OUT_DIR must not be named as this one's.
record_stamp() { python3 -c 'import os, sys; print(os.stat(sys.argv[1]).st_mtime_ns)' "$out/$name.json" 2>/dev/null; }
before=$(record_stamp || true)
set +e
# start.py imports what the proof needs first: a missing module is one line, not a traceback minutes in.
PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_proof.start "$module" --out "$out/$name.json" --workdir "$out/work" "$@" \
    2>&1 | tee "$out/$name.log"
code=${PIPESTATUS[0]}
set -e
after=$(record_stamp || true)
if [ -n "$after" ] && [ "$after" != "$before" ]; then
    record="record $out/$name.json"
else
    record="no record written (see the lines above)"
fi
echo "$label exit code $code; $record, log $out/$name.log" | tee -a "$out/$name.log"
exit "$code"
