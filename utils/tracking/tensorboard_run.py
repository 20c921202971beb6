"""One training run in TensorBoard (``--logger tensorboard``): per-epoch scalars and the run's record as text."""

from pathlib import Path

from utils.logging import LOGGER, colorstr
from utils.tracking.run_record import finite_metrics, run_tags


class TensorBoardTracker:
    """Event files in the run folder; step = epoch, scalar names = results.csv columns."""

    def __init__(self, save_dir):
        from torch.utils.tensorboard import SummaryWriter  # optional package, checked by check_loggers

        self.save_dir = Path(save_dir)
        self.writer = SummaryWriter(str(self.save_dir))
        LOGGER.info(f"{colorstr('TensorBoard: ')}start with 'tensorboard --logdir {self.save_dir.parent}'")

    def log_epoch(self, epoch: int, values: dict) -> None:
        """One results.csv row; NaN values (size bands without labels) are left out."""
        for name, value in finite_metrics(values).items():
            self.writer.add_scalar(name, value, int(epoch))
        self.writer.flush()

    def finish(self) -> None:
        """The reproducibility record (determinism, checksum, versions) as one text entry."""
        rows = "\n".join(f"| {key} | {value} |" for key, value in run_tags(self.save_dir).items())
        self.writer.add_text("run record", "| tag | value |\n|---|---|\n" + rows)

    def end(self, status: str) -> None:
        self.writer.close()
