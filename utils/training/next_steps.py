"""The last lines of a training run: what it gave and the commands to use it."""

import shlex
from pathlib import Path


def next_steps(weights: Path, data_yaml, val_images, imgsz: int, metrics, single_cls: bool = False,
               modules=()) -> str:
    """Where the final weights are, their validation mAP, and ready-to-run ``val.py`` and ``detect.py`` lines.

    ``metrics`` is val.py's (P, R, mAP50, mAP50-95, ...) for ``weights``; ``val_images`` is the data
    YAML's ``val`` entry (a path or a list of them), so the detect command runs as printed. The val.py line
    reproduces ``metrics`` bit for bit (with ``--single-cls`` when the run trained with it). Both lines pass
    the run's ``--modules`` files, without which its own blocks would not load.
    """
    blocks = "".join(f" --modules {shlex.quote(str(file))}" for file in modules)
    extra = (" --single-cls" if single_cls else "") + blocks
    source = val_images[0] if isinstance(val_images, (list, tuple)) else val_images
    weights, data_yaml, source = (shlex.quote(str(p)) for p in (weights, data_yaml, source))
    return (f"Trained weights: {weights}  (mAP50 {metrics[2]:.3f}, mAP50-95 {metrics[3]:.3f} on the val set)\n"
            f"Next:  python val.py --weights {weights} --data {data_yaml} --imgsz {imgsz}{extra}\n"
            f"       python detect.py --weights {weights} --source {source} --imgsz {imgsz}{blocks}")
