"""Check the installed torch's CPU/meta predictions against the tables of its release (no GPU needed).

    python -m benchmarks.gpu_proof.table_check   # 0 all match, 1 a mismatch, 3 no replay table for this torch

Per battery case: the audit's CUDA prediction (its meta trace runs this torch's Python code, the op
table's rows are this release's) against ``replay/cuda-torch-<release>.json``; then the docstring of
``torch.use_deterministic_algorithms`` against the op table's rows for this release.
``benchmarks/gpu_proof/torch_versions.sh`` runs it in throw-away venvs with other torch releases.
"""

import json
import sys

import torch

from benchmarks.gpu_proof.device import REPLAY_DIR
from benchmarks.gpu_proof.ops import CASES, predicted_failures
from utils.determinism.op_table import documentation_mismatch, release_name

EXIT_MATCH, EXIT_MISMATCH, EXIT_NO_TABLE = 0, 1, 3


def case_lines(table: dict) -> tuple[list, int]:
    """One line per battery case and the number of mismatches."""
    lines, wrong = [], 0
    for name, op in CASES.items():
        predicted, ops, where = predicted_failures(op, "cuda")
        expected = table[name]["outcome"]
        ok = predicted == (expected == "raises")
        wrong += not ok
        lines.append(f"{'ok' if ok else 'MISMATCH':<9}{name:<32} audit ({where}): "
                     f"{'raises' if predicted else 'runs'}{' ' + ', '.join(ops) if ops else ''}; table: {expected}")
    return lines, wrong


def main() -> int:
    """Print the comparison; the exit code says whether everything matched."""
    version = torch.__version__
    path = REPLAY_DIR / f"cuda-torch-{release_name(version)}.json"
    if not path.is_file():
        print(f"torch {version}: no replay table {path.name}")
        return EXIT_NO_TABLE
    lines, wrong = case_lines(json.loads(path.read_text())["ops"])
    missing, retired = documentation_mismatch(torch.use_deterministic_algorithms.__doc__, version)
    lines.append(f"{'ok' if not (missing or retired) else 'MISMATCH':<9}docstring vs op table rows: "
                 f"documented, not in the table {sorted(missing)}; in the table, not documented {sorted(retired)}")
    wrong += bool(missing or retired)
    print(f"torch {version} against {path.name}: {len(CASES) + 1 - wrong} of {len(CASES) + 1} match")
    print("\n".join(lines))
    return EXIT_MISMATCH if wrong else EXIT_MATCH


if __name__ == "__main__":
    sys.exit(main())
