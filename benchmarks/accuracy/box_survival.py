"""How many labels survive training augmentation, by size, for several ``min_box_px`` values.

    python -m benchmarks.accuracy.box_survival    # generated very-tiny set, imgsz 256, scratch-low
    python -m benchmarks.accuracy.box_survival --data D.yaml --imgsz 640 --values 2 1 --epochs 2

Every value sees the same samples and the same random draws (the threshold only filters labels), so
the counts differ only by the boxes the threshold drops. Sizes are ``sqrt(w * h)`` of the labels the
loader returns, in pixels of the ``--imgsz`` training input. Without ``--data`` a very-tiny set is
generated into a temporary folder: 16 images of 512 px with 40-80 objects of 2-12 px each.
"""

import tempfile
from pathlib import Path

import numpy as np

from utils.dataloaders import LoadImagesAndLabels
from utils.dataset.data_config import check_dataset
from utils.files import yaml_load
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]
EDGES = (0, 2, 4, 8, 16, np.inf)


def generated_set(folder: Path) -> str:
    """The default very-tiny training images (offline, seed 0); returns their folder."""
    from utils.dataset.synthetic.shapes import make_shapes

    make_shapes(folder / "tiny", n_train=16, n_val=1, seed=0, size=512, sides=(2, 12), objects=(40, 80))
    return str(folder / "tiny" / "images" / "train")


def size_counts(dataset, epochs: int) -> np.ndarray:
    """Labels returned over ``epochs`` passes of every image, counted per size band of :data:`EDGES`."""
    sizes = []
    for epoch in range(epochs):
        for index in range(len(dataset)):
            img, labels, _, _ = dataset[(index, epoch, 0)]
            h, w = img.shape[1:]
            sizes.append(np.sqrt(labels[:, 4].numpy() * w * labels[:, 5].numpy() * h))
    return np.histogram(np.concatenate(sizes), bins=EDGES)[0]


RULES = OptionRules(positive=("imgsz", "epochs"), non_negative=("values", "seed"), files=("data", "hyp"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.accuracy.box_survival", description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="", help="data YAML (default: a generated very-tiny set)")
    parser.add_argument("--hyp", default=str(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"))
    parser.add_argument("--imgsz", type=int, default=256)
    parser.add_argument("--values", type=float, nargs="+", default=[2.0, 1.0], help="min_box_px values")
    parser.add_argument("--epochs", type=int, default=4, help="passes over the training images")
    parser.add_argument("--seed", type=int, default=0)
    args = parse_checked(parser, RULES, argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = check_dataset(args.data)["train"] if args.data else generated_set(Path(tmp))
        hyp = yaml_load(args.hyp)
        bands = [f"{lo:g}-{hi:g}px" for lo, hi in zip(EDGES[:-1], EDGES[1:])]
        print(f"imgsz {args.imgsz}, {Path(args.hyp).name} (scale {hyp['scale']}), {args.epochs} epochs")
        print(f"{'min_box_px':>10}" + "".join(f"{b:>10}" for b in bands) + f"{'total':>10}")
        for value in args.values:
            dataset = LoadImagesAndLabels(path, img_size=args.imgsz, augment=True, seed=args.seed,
                                          hyp={**hyp, "min_box_px": value})
            counts = size_counts(dataset, args.epochs)
            print(f"{value:>10g}" + "".join(f"{c:>10d}" for c in counts) + f"{counts.sum():>10d}")


if __name__ == "__main__":
    main()
