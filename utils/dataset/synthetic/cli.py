"""The command-line pieces data/scripts/make_*.py share: output folder, split sizes and seed flags, and the
one-line report (an existing folder is one ERROR line, exit 2)."""

import sys
import time
from pathlib import Path


def add_split_arguments(parser, root: Path, n_train: int, n_val: int) -> None:
    """The flags every generator shares: output folder, split sizes and seed."""
    parser.add_argument("--root", type=Path, default=root, help="output folder (must not exist)")
    parser.add_argument("--n-train", type=int, default=n_train, help="number of training images")
    parser.add_argument("--n-val", type=int, default=n_val, help="number of validation images")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same data set)")


def add_size_arguments(parser, img_size: int, min_side: float, max_side: float, noun: str = "object") -> None:
    """Image side and the object side range, for generators whose object sizes are free."""
    parser.add_argument("--img-size", type=int, default=img_size, help="image side in pixels")
    parser.add_argument("--min-side", type=float, default=min_side, help=f"smallest {noun} side in pixels")
    parser.add_argument("--max-side", type=float, default=max_side, help=f"largest {noun} side in pixels")


def build_and_report(build, args, written="and") -> int:
    """Run ``build()`` (returns the data YAML, or the folder with ``written="to"``), print what was written;
    an existing folder is one ERROR line, exit 2."""
    t0 = time.perf_counter()
    try:
        path = build()
    except FileExistsError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    print(f"Wrote {args.n_train} train + {args.n_val} val images {written} {path} in {time.perf_counter() - t0:.1f}s")
    return 0
