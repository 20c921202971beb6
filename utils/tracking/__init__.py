"""Experiment trackers chosen with ``--logger`` (TensorBoard, MLflow); results.csv is always written.

train.py calls :func:`check_loggers` before anything is created and wraps the training loop in
:func:`start_tracking`, whose :class:`Trackers` log every results.csv row at step = epoch, from an
``on_fit_epoch_end`` callback registered right after results.csv's (utils/training/hooks.py). It is a context manager: a run that returns is finished with its artifacts, one
that raises ends FAILED, and an interrupted one (which exits through
``utils.training.interrupts.exit_after_interrupt``) ends KILLED. ``--evolve`` runs inside
:func:`evolution_run`: each generation becomes a child run. Only the main process (rank 0) tracks.
"""

import contextlib
import contextvars
import importlib
from pathlib import Path

from utils.env_vars import read
from utils.errors import UserError
from utils.training.interrupts import forget_before_interrupt_exit, run_before_interrupt_exit
from utils.tracking.run_record import MAX_PARAM_CHARS

LOGGERS = ("tensorboard", "mlflow")
# --logger value -> (module that must import, pip package that provides it)
PACKAGES = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
EVOLUTION_FILES = ("evolve.csv", "hyp_evolve.yaml", "evolve.png")
_EVOLUTION = contextvars.ContextVar("evolution_tracker", default=None)  # the --evolve parent run, if any


def requested(opt) -> list:
    """The ``--logger`` values of ``opt`` in order, without repeats ([] for checkpoints from before the flag)."""
    names = getattr(opt, "logger", None) or []
    return list(dict.fromkeys([names] if isinstance(names, str) else names))


def check_loggers(opt) -> None:
    """One UserError line when a requested logger is unknown or its package is not installed."""
    for name in requested(opt):
        if name not in PACKAGES:
            raise UserError(f"--logger {name}: unknown; use {' or '.join(LOGGERS)}")
        module, package = PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"--logger {name}: the '{package}' package is not installed; run 'pip install {package}' "
                            f"(or pip install -r requirements-extras.txt), or drop --logger {name}") from None
    if "mlflow" in requested(opt):
        read("MLFLOW_TRACKING_URI")  # a store MLflow cannot open stops the run here, before any folder


def end_status(exc_type) -> str:
    """MLflow's status for a run that ended with ``exc_type`` (None: it returned)."""
    if exc_type is None:
        return "FINISHED"
    return "KILLED" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "FAILED"


class Trackers:
    """The run's trackers behind one interface; a context manager that ends them with the right status."""

    def __init__(self, trackers=()):
        self.trackers = list(trackers)

    def log_epoch(self, epoch: int, values: dict) -> None:
        """One results.csv row (column name -> value) at step ``epoch``."""
        for tracker in self.trackers:
            tracker.log_epoch(epoch, values)

    def killed(self) -> None:
        """The run was interrupted: called by exit_after_interrupt, which ends the process without unwinding."""
        self._end("KILLED")

    def _end(self, status: str) -> None:
        for tracker in self.trackers:
            tracker.end(status)

    def __enter__(self):
        run_before_interrupt_exit(self.killed)
        return self

    def __exit__(self, exc_type, exc, tb):
        forget_before_interrupt_exit(self.killed)
        if exc_type is None:
            for tracker in self.trackers:
                tracker.finish()
        self._end(end_status(exc_type))
        return False


def start_tracking(opt, save_dir, is_main: bool, start_epoch: int = 0) -> Trackers:
    """The trackers ``opt.logger`` asks for, opened on the run folder (none off the main process).

    Call it once the run folder holds opt.yaml, hyp.yaml and determinism.json: they are logged as
    parameters and tags. ``start_epoch`` > 0 (a resume) continues the run's MLflow run.
    """
    names = requested(opt) if is_main else []
    trackers = []
    if "tensorboard" in names:
        from utils.tracking.tensorboard_run import TensorBoardTracker

        trackers.append(TensorBoardTracker(save_dir))
    if "mlflow" in names:
        from utils.tracking.mlflow_run import MlflowTracker

        trackers.append(MlflowTracker(save_dir, opt, start_epoch, parent=_EVOLUTION.get()))
    return Trackers(trackers)


@contextlib.contextmanager
def evolution_run(opt):
    """Around ``--evolve``: with MLflow, one parent run whose children are the generations' runs."""
    if "mlflow" not in requested(opt):
        yield
        return
    from utils.tracking.mlflow_run import MlflowTracker

    save_dir = Path(opt.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    params = {f"opt/{key}": str(value)[:MAX_PARAM_CHARS] for key, value in vars(opt).items()}
    parent = MlflowTracker(save_dir, opt, params=params, keep_record=False)
    token = _EVOLUTION.set(parent)
    try:
        yield
    except BaseException as e:
        parent.end(end_status(type(e)))
        raise
    else:
        parent.finish(files=[(save_dir / name, "") for name in EVOLUTION_FILES if (save_dir / name).is_file()])
        parent.end("FINISHED")
    finally:
        _EVOLUTION.reset(token)
