"""Training-loader throughput: augmented mosaic batches per second on the embedded shapes data set.

    python -m benchmarks.speed.bench_dataloader                  # imgsz 640, batch 16, hyp.scratch-low, workers 0 and 2
    python -m benchmarks.speed.bench_dataloader --workers 0 2 4 --batches 20 --runs 5
    python -m benchmarks.speed.bench_dataloader --data data/shapes_large.yaml --train-tiles 256 --imgsz 256  # tiles

Prints images/s per worker count (the median of ``--runs`` timed runs, each ``--batches`` batches
after one warm-up batch that starts the workers) and, with ``--workers 0``, the CPU time per image
(all threads of the process; on a busy machine it is steadier than images/s). A benchmark, not a
test: run it on an idle machine.
"""

import statistics
import sys
import time
from pathlib import Path

from utils.dataset.data_config import check_dataset
from utils.dataloaders import create_dataloader
from utils.files import yaml_load
from benchmarks.cli import parse_checked, parser_for
from utils.errors import exit_on_user_error
from utils.options import OptionRules

ROOT = Path(__file__).resolve().parents[2]


def images_per_second(loader, epoch, batches):
    """Time ``batches`` batches of ``epoch`` after one warm-up batch; returns (images/s, CPU ms/image).

    The CPU time is this process's (all its threads), so it covers the work only with ``--workers 0``;
    unlike the wall time it hardly depends on what else the machine is running.
    """
    loader.set_epoch(epoch)
    it = iter(loader)
    next(it)  # warm-up: worker start-up and first prefetch are not throughput
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for _ in range(batches):
        imgs = next(it)[0]
        n += imgs.shape[0]
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    del it
    return n / elapsed, 1000 * cpu / n


RULES = OptionRules(positive=("imgsz", "batch_size", "batches", "runs", "train_tiles"), non_negative=("workers",),
                    files=("data", "hyp"))


@exit_on_user_error
def main(argv=None):
    parser = parser_for("benchmarks.speed.bench_dataloader", description="data loader throughput benchmark")
    parser.add_argument("--data", default=str(ROOT / "data" / "shapes.yaml"))
    parser.add_argument("--hyp", default=str(ROOT / "data" / "hyps" / "hyp.scratch-low.yaml"))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batches", type=int, default=10, help="timed batches per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per worker count (median reported)")
    parser.add_argument("--train-tiles", type=int, default=None, help="tile side, as train.py --train-tiles")
    parser.add_argument("--cache", choices=["ram", "disk"], default=None, help="image cache, as train.py --cache")
    args = parse_checked(parser, RULES, argv)

    data = check_dataset(args.data)
    hyp = yaml_load(args.hyp)
    print(f"imgsz {args.imgsz}, batch {args.batch_size}, {Path(args.hyp).name}, mosaic {hyp['mosaic']}, "
          f"{args.runs} runs x {args.batches} batches, tiles {args.train_tiles}, cache {args.cache}")
    for workers in args.workers:
        loader, _ = create_dataloader(data["train"], args.imgsz, args.batch_size, 32, hyp=hyp, augment=True,
                                      workers=workers, shuffle=True, seed=0, nc=data["nc"], cache=args.cache,
                                      train_tiles=args.train_tiles)
        rates, cpu = zip(*(images_per_second(loader, epoch, args.batches) for epoch in range(args.runs)))
        print(f"workers {workers}: {statistics.median(rates):.1f} images/s "
              f"(runs: {', '.join(f'{r:.1f}' for r in rates)}), {statistics.median(cpu):.1f} CPU ms/image")
        del loader
    return 0


if __name__ == "__main__":
    sys.exit(main())
