"""Audit a model's training step for ops without a deterministic implementation (on CPU or CUDA).

Usage:
    python audit.py --cfg models/ffca-yolo.yaml --imgsz 256          # exit 0: clean
    python audit.py --cfg my-model.yaml --device 0 --batch-size 4     # exit 1: findings listed

Exit codes: 0 clean, 1 findings or ops not verified, 2 bad arguments (one ``ERROR:`` line), 3 the audit itself could
not run (one ``ERROR:`` line saying why).
The audit runs one training step (forward, ComputeLoss on crowded synthetic targets, backward,
optimizer step, EMA update) with the loss gains of data/hyps/hyp.scratch-low.yaml; see
docs/determinism.md.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from models.yolo import Model  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.files import yaml_load  # noqa: E402
from utils.options import OneLineErrorParser, add_modules_flag  # noqa: E402
from utils.user_modules import load_user_modules  # noqa: E402
from utils.determinism.op_audit import AuditReport, audit_model, detection_loss  # noqa: E402
from utils.determinism.twins.plan import twinned_audit  # noqa: E402
from utils.torch_utils import select_device  # noqa: E402
from utils.version import add_version_flag  # noqa: E402

DEFAULT_HYP = ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"
EXIT_CLEAN, EXIT_FINDINGS, EXIT_BAD_ARGUMENTS, EXIT_AUDIT_FAILED = 0, 1, 2, 3



def parse_opt(argv=None) -> argparse.Namespace:
    """Parse and validate the audit command's flags."""
    parser = OneLineErrorParser(prog="python audit.py", description=__doc__.splitlines()[0])
    parser.add_argument("--audit", action="store_true", help=argparse.SUPPRESS)  # accepted for the old alias
    parser.add_argument("--cfg", type=str, help="model YAML, e.g. models/ffca-yolo.yaml")
    parser.add_argument("--imgsz", type=int, default=256, help="square input size in pixels")
    parser.add_argument("--device", default="cpu", help="cpu, or a CUDA index such as 0")
    parser.add_argument("--batch-size", type=int, default=2, help="audit batch size (at least 2)")
    add_version_flag(parser)
    add_modules_flag(parser)
    opt = parser.parse_args(argv)
    if not opt.cfg:
        raise UserError("--cfg is required: the model YAML to audit, e.g. --cfg models/ffca-yolo.yaml")
    if not Path(opt.cfg).is_file():
        raise UserError(f"--cfg {opt.cfg}: file not found; pass a model YAML such as models/ffca-yolo.yaml")
    if opt.imgsz <= 0:
        raise UserError(f"--imgsz {opt.imgsz}: must be a positive number of pixels, e.g. 256")
    if opt.batch_size < 2:
        raise UserError(f"--batch-size {opt.batch_size}: must be at least 2 (BatchNorm in training mode "
                        "needs two values per channel)")
    return opt


def run_audit(opt: argparse.Namespace) -> tuple:
    """Build the model from ``--cfg`` on ``--device`` and audit one training step; returns the report and
    the line saying what the deterministic twins of scoped and strict make of it (None when no twin applies)."""
    load_user_modules(opt.modules)
    device = select_device(opt.device)
    model = Model(opt.cfg).to(device)
    stride = int(model.stride.max())
    if opt.imgsz % stride:
        raise UserError(f"--imgsz {opt.imgsz}: must be a multiple of the model's largest stride {stride}")

    def audit(forward_scope=None) -> AuditReport:
        return audit_model(model, imgsz=opt.imgsz, device=device, batch_size=opt.batch_size,
                           loss_factory=detection_loss(yaml_load(DEFAULT_HYP)), forward_scope=forward_scope)

    report = audit()
    plan, twinned = twinned_audit(report, audit)
    return report, None if plan is None else twins_summary(plan, twinned)


def twins_summary(plan, twinned: AuditReport) -> str:
    """What --deterministic scoped and strict train with: the twins, and what the audit with them finds."""
    left = "clean" if twinned.clean else f"{len(twinned.findings)} finding(s) left: " + ", ".join(
        f"{f.op} ({f.module})" for f in twinned.findings)
    return f"With twins (--deterministic scoped and strict): {plan.describe()}. Audit with twins: {left}"


def main(argv=None) -> int:
    """Run the command; returns the exit code (0 clean, 1 findings, 2 bad arguments, 3 audit failed)."""
    try:
        report, with_twins = run_audit(parse_opt(argv))
    except UserError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    except Exception as e:  # the model or the step itself failed: one line, not a traceback
        reason = (str(e).strip().splitlines() or [""])[0]
        print(f"ERROR: the determinism audit could not run: {type(e).__name__}: {reason}", file=sys.stderr)
        return EXIT_AUDIT_FAILED
    print(report.format())
    if with_twins:
        print(with_twins)
    return EXIT_CLEAN if report.clean else EXIT_FINDINGS


if __name__ == "__main__":
    sys.exit(main())
