"""python -m benchmarks.figures [--draw-only] [--out DIR]: train what is missing, then draw every picture."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.cli import parse_checked
from benchmarks.figures import pictures, runs
from utils.errors import exit_on_user_error
from utils.options import OptionRules

RULES = OptionRules(folders=("out",))


def parse_opt(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draw-only", action="store_true",
                   help="train nothing: draw from the runs cached under runs/figures")
    p.add_argument("--out", type=Path, default=runs.ROOT / "docs" / "images", help="folder for the PNG files")
    return parse_checked(p, RULES, argv)  # an unusable --out stops here, not after the training


@exit_on_user_error
def main(argv=None) -> None:
    opt = parse_opt(argv)
    runs.quiet_threads()
    detector, rows = runs.detector_run(not opt.draw_only), runs.matrix_rows(not opt.draw_only)
    made = {"size-histogram.png": lambda path: pictures.size_histogram(path),
            "detections.png": lambda path: pictures.detections(detector, path),
            "sliced.png": lambda path: pictures.sliced(detector, path),
            "learning-curves.png": lambda path: pictures.learning_curves(rows, path),
            "size-bands.png": lambda path: pictures.size_bands(rows, path)}
    for name, make in made.items():
        print(f"{opt.out / name}: {make(opt.out / name) / 1000:.0f} KB")


if __name__ == "__main__":
    main()
