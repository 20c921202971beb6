#!/usr/bin/env bash
# The op and replay tables checked against other torch releases, on a CPU (not run in CI; minutes, GBs):
#
#   benchmarks/gpu_proof/torch_versions.sh [VENV_ROOT=/tmp/ffca-torch-venvs] [RELEASES="2.9.0 2.11.0"]
#
# Per release: a throw-away venv outside the repository (system site-packages visible, its own torch
# first on the path), torch installed from PyPI with its dependencies (on x86_64 PyPI's torch is a CUDA
# build: importing it needs the nvidia-* wheels, some GB), then in that venv
# python -m benchmarks.gpu_proof.table_check and the doc-consistency test. --isolated ignores a
# machine-wide pip constraint file that pins another torch.
set -uo pipefail

root=${1:-/tmp/ffca-torch-venvs}
releases=${2:-"2.9.0 2.11.0"}
repo=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for release in $releases; do
    venv="$root/torch-$release"
    echo "=== torch $release in $venv"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv --system-site-packages "$venv" || { echo "cannot create $venv"; status=1; continue; }
    fi
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        "$venv/bin/python" -m pip --isolated install -q "torch==$release" \
            || { echo "torch $release: pip install failed (see above)"; status=1; continue; }
    fi
    (cd "$repo" && OMP_NUM_THREADS=1 "$venv/bin/python" -m benchmarks.gpu_proof.table_check) || status=1
    (cd "$repo" && OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "tests/test_determinism.py::test_op_table_matches_installed_torch_documentation") || status=1
done
exit "$status"
