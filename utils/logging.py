"""Project logger and terminal colouring (rank-aware once DDP starts: then only rank 0 logs at INFO)."""

import logging
import sys

LOGGING_NAME = "ffca"


class ProjectFormatter(logging.Formatter):
    """Plain messages; warnings and errors get one prefix, so no call site types its own."""

    PREFIXES = {logging.WARNING: "WARNING ⚠️ ", logging.ERROR: "ERROR: ", logging.CRITICAL: "ERROR: "}

    def format(self, record: logging.LogRecord) -> str:
        return self.PREFIXES.get(record.levelno, "") + record.getMessage()


def _make_logger(name: str = LOGGING_NAME) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(ProjectFormatter())
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # utils.ddp.init_process_group lowers it on ranks other than 0
    logger.propagate = False
    return logger


LOGGER = _make_logger()

_COLOURS = {
    "black": "\033[30m", "red": "\033[31m", "green": "\033[32m", "yellow": "\033[33m",
    "blue": "\033[34m", "magenta": "\033[35m", "cyan": "\033[36m", "white": "\033[37m",
    "bold": "\033[1m", "underline": "\033[4m", "end": "\033[0m",
}


def colorstr(*args) -> str:
    """``colorstr('blue', 'bold', 'text')`` wraps the last argument in ANSI codes (default blue bold).

    Colour is dropped when stdout is not a terminal, so log files stay clean.
    """
    *styles, text = args if len(args) > 1 else ("blue", "bold", args[0])
    if not sys.stdout.isatty():
        return str(text)
    return "".join(_COLOURS[s] for s in styles) + f"{text}" + _COLOURS["end"]


def log_speed_and_outputs(per_image_ms, shape, save_dir, n_labels=None, saved=True) -> None:
    """Log val's and detect's closing lines: per-image ms (pre-process, inference, NMS) at batch ``shape``,
    then where results went. ``n_labels``: label files written (None: no --save-txt); ``saved``: whether
    anything else was written to ``save_dir``."""
    LOGGER.info(f"Speed: %.1fms pre-process, %.1fms inference, %.1fms NMS per image at shape {shape}"
                % tuple(per_image_ms))
    if n_labels is not None or saved:
        labels = f"\n{n_labels} labels saved to {save_dir / 'labels'}" if n_labels is not None else ""
        LOGGER.info(f"Results saved to {colorstr('bold', save_dir)}{labels}")
