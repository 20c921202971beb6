#!/usr/bin/env bash
# The op and replay tables checked against other torch releases, on a CPU (not run in CI; minutes, GBs):
#
#   benchmarks/gpu_proof/torch_versions.sh [VENV_ROOT=/tmp/ffca-torch-venvs] [PAIRS="2.9.0:0.24.0 2.11.0:0.26.0"]
#
# Per torch:torchvision pair: a throw-away venv outside the repository (system site-packages visible,
# its own torch and torchvision first on the path: the system's torchvision fails to import with
# another torch), both installed from PyPI (on x86_64 PyPI's torch is a CUDA build: importing it needs
# the nvidia-* wheels, some GB), then in that venv
# python -m benchmarks.gpu_proof.table_check and the doc-consistency test. --isolated ignores a
# machine-wide pip constraint file that pins another torch.
set -uo pipefail

root=${1:-/tmp/ffca-torch-venvs}
pairs=${2:-"2.9.0:0.24.0 2.11.0:0.26.0"}
repo=$(cd "$(dirname "$0")/../.." && pwd)
status=0
for pair in $pairs; do
    release=${pair%%:*}
    vision=${pair##*:}
    venv="$root/torch-$release"
    echo "=== torch $release in $venv"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv --system-site-packages "$venv" || { echo "cannot create $venv"; status=1; continue; }
    fi
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
        "$venv/bin/python" -m pip --isolated install -q "torch==$release" \
            || { echo "torch $release: pip install failed (see above)"; status=1; continue; }
    fi
    if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
        "$venv/bin/python" -m pip --isolated install -q --no-deps "torchvision==$vision" \
            || { echo "torchvision $vision: pip install failed (see above)"; status=1; continue; }
    fi
    (cd "$repo" && OMP_NUM_THREADS=1 "$venv/bin/python" -m benchmarks.gpu_proof.table_check) || status=1
    (cd "$repo" && OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "tests/test_determinism.py::test_op_table_matches_installed_torch_documentation") || status=1
done
exit "$status"
