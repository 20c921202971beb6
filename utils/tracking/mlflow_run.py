"""One training run in MLflow (``--logger mlflow``), written through ``MlflowClient``.

Store: ``MLFLOW_TRACKING_URI`` when set, else MLflow's embedded SQLite store ``runs/mlflow.db`` (the
backend MLflow 3 uses by default) with artifacts in ``runs/mlartifacts``. The run id is kept in the
run folder (``mlflow.json``), so ``--resume`` continues the same MLflow run; a resume from a
checkpoint older than what that run already holds starts a new run tagged ``resumed_from``, so no
step is ever logged twice.

A tracking store that fails (read-only, locked, a full disk, an unreachable server) is one warning that
names the cause in plain words, and the tracker turns itself off: training goes on and results.csv keeps
every figure. MLflow's own logger stays quiet for the rest of the run, so no traceback follows the warning.
"""

import json
import logging
import time
from pathlib import Path

from utils.env_vars import MLFLOW_HTTP_DEFAULTS, pass_on, read
from utils.errors import first_line
from utils.files import atomic_write_bytes
from utils.logging import LOGGER, colorstr
from utils.tracking.run_record import REPO_ROOT, finite_metrics, run_artifacts, run_params, run_tags
from utils.training.results_log import COLUMNS

DEFAULT_STORE = REPO_ROOT / "runs"
RECORD = "mlflow.json"  # in the run folder: which MLflow run holds this folder's epochs
EPOCH_METRIC = COLUMNS[1]  # train/box_loss, in every row: its history says which epochs a run holds
PREFIX = colorstr("MLflow: ")
STATUSES = ("FINISHED", "FAILED", "KILLED")
# (what SQLite, SQLAlchemy, requests or the OS say, lower case) -> the cause in plain words
PLAIN_CAUSES = (
    (("readonly database", "read-only file system"), "the store is read-only"),
    (("database is locked",), "the store is locked by another process"),
    (("database or disk is full", "no space left on device"), "the disk holding the store is full"),
    (("unable to open database file",), "the store's file cannot be opened (a missing folder or no permission)"),
    (("connection refused", "failed to establish a new connection", "max retries exceeded", "timed out",
      "name or service not known", "connectionerror"), "the tracking server does not answer"),
)


def _chain(error: BaseException) -> str:
    """The messages of ``error`` and of the errors it was raised from (SQLAlchemy wraps sqlite3's)."""
    texts = []
    while error is not None and len(texts) < 5:
        texts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n".join(texts)


def plain_cause(error: BaseException) -> str:
    """Why a store failed, in plain words where the cause is a known one, else the error's first line."""
    text = _chain(error)
    for markers, words in PLAIN_CAUSES:
        if any(marker in text.lower() for marker in markers):
            return words
    return first_line(error, limit=300)


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the SQLite store under the repository's ``runs/``."""
    return read("MLFLOW_TRACKING_URI") or f"sqlite:///{DEFAULT_STORE / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps artifacts: beside a SQLite file; elsewhere the store decides (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()


def experiment_name(save_dir: Path) -> str:
    """``MLFLOW_EXPERIMENT_NAME``, else the project folder's name (runs/train/exp -> 'train')."""
    return read("MLFLOW_EXPERIMENT_NAME") or save_dir.resolve().parent.name or "default"


class MlflowTracker:
    """Params, tags, per-epoch metrics (step = epoch), artifacts and the end status of one MLflow run.

    ``parent``: the tracker of an ``--evolve`` search; this run becomes its child, in its experiment.
    ``params``: what to log as parameters (default: opt.yaml and hyp.yaml of ``save_dir``).
    ``keep_record``: write ``mlflow.json`` so that ``--resume`` finds the run again.
    """

    def __init__(self, save_dir, opt, start_epoch: int = 0, parent=None, params=None, keep_record=True):
        self.save_dir, self.uri, self.parent = Path(save_dir), tracking_uri(), parent
        self.client, self.run_id, self.experiment_id, self.ended, self.warned = None, None, None, False, False
        self.resumed_from = None
        if parent is not None and parent.client is None:
            self.warned = True  # the evolution's store failed and said so: its generations stay quiet
            return
        try:
            self._open(opt, start_epoch, params, keep_record)
        except Exception as e:  # noqa: BLE001 -- whatever the store raises, training must go on without it
            self._disable(e)

    def _open(self, opt, start_epoch: int, params, keep_record: bool) -> None:
        if self.uri.startswith(("http://", "https://")):
            # a server that does not answer must not hold training for minutes (MLflow retries 7 times
            # with back-off by default); the user's own valid settings win
            for name in MLFLOW_HTTP_DEFAULTS:
                pass_on(name)
        elif self.uri == f"sqlite:///{DEFAULT_STORE / 'mlflow.db'}":
            DEFAULT_STORE.mkdir(parents=True, exist_ok=True)
        from mlflow import MlflowClient  # optional package, checked before training by check_loggers

        # after the import, which sets MLflow's own levels: a failing store is our one warning, not its traceback
        logging.getLogger("mlflow").setLevel(logging.CRITICAL)

        client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self.parent.experiment_id if self.parent else self._experiment(client)
        self.run_id, tags = self._continued_run(client, opt, start_epoch), {}
        if self.run_id is None:
            if self.parent is not None:
                tags["mlflow.parentRunId"] = self.parent.run_id
            if self.resumed_from:
                tags["resumed_from"] = self.resumed_from
            self.run_id = client.create_run(self.experiment_id, run_name=self.save_dir.name, tags=tags).info.run_id
            self._log_batch(client, params=params if params is not None else run_params(self.save_dir))
            browse = (f"open {self.uri}" if self.uri.startswith(("http://", "https://"))
                      else f"browse with 'mlflow ui --backend-store-uri {self.uri}'")
            LOGGER.info(f"{PREFIX}run {self.run_id} in {self.uri}; {browse}")
        else:
            client.update_run(self.run_id, status="RUNNING")
            LOGGER.info(f"{PREFIX}continuing run {self.run_id} in {self.uri} from epoch {start_epoch}")
        self._log_batch(client, tags=run_tags(self.save_dir))
        self.client = client
        if keep_record:
            atomic_write_bytes(self.save_dir / RECORD, json.dumps(
                {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}).encode())

    def _experiment(self, client) -> str:
        name = experiment_name(self.save_dir)
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found else client.create_experiment(name, artifact_location=artifact_root(
            self.uri))

    def _continued_run(self, client, opt, start_epoch: int) -> str | None:
        """The run a ``--resume`` continues (from the run folder's record), or None for a new run."""
        path = self.save_dir / RECORD
        if not getattr(opt, "resume", False) or not path.is_file():
            return None
        saved = json.loads(path.read_text())
        if saved.get("tracking_uri") != self.uri:
            LOGGER.warning(f"{PREFIX}this run was tracked in {saved.get('tracking_uri')}, now the store is "
                           f"{self.uri}: the resumed epochs go to a new run there")
            return None
        run_id = saved["run_id"]
        if any(m.step >= start_epoch for m in client.get_metric_history(run_id, EPOCH_METRIC)):
            LOGGER.warning(f"{PREFIX}run {run_id} already holds epoch {start_epoch} or later, so this resume from an "
                           "earlier checkpoint logs to a new run (tag resumed_from) instead of repeating steps")
            self.resumed_from = run_id
            return None
        return run_id

    def _log_batch(self, client, metrics=(), params=None, tags=None) -> None:
        from mlflow.entities import Param, RunTag

        client.log_batch(self.run_id, metrics=list(metrics),
                         params=[Param(k, v) for k, v in (params or {}).items()],
                         tags=[RunTag(k, v) for k, v in (tags or {}).items()])

    def _disable(self, error: Exception) -> None:
        """Warn (once), in plain words, and stop using the store."""
        if not self.warned:
            LOGGER.warning(f"{PREFIX}{self.uri} failed ({plain_cause(error)}); training continues without MLflow "
                           "(results.csv keeps every figure)")
        self.client, self.warned = None, True

    def _safely(self, action, *args, **kwargs) -> None:
        """``action(client, *args, **kwargs)`` unless tracking is off; a failure turns it off."""
        if self.client is None:
            return
        try:
            action(self.client, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- a failing store turns tracking off; it never stops training
            self._disable(e)

    def log_epoch(self, epoch: int, values: dict) -> None:
        """One results.csv row (name -> value) at step ``epoch``; NaN values (empty size bands) are left out."""
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(epoch)) for k, v in finite_metrics(values).items()]
        self._safely(self._log_batch, metrics=metrics)

    def finish(self, files=None) -> None:
        """The final tags (now with the EMA checksum) and the artifacts (default: the run folder's)."""
        self._safely(self._log_batch, tags=run_tags(self.save_dir))
        for path, folder in run_artifacts(self.save_dir) if files is None else files:
            self._safely(lambda client: client.log_artifact(self.run_id, str(path), folder or None))

    def end(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED (once); a killed child run kills its evolution too."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {STATUSES}")
        if self.ended:
            return
        self._safely(lambda client: client.set_terminated(self.run_id, status))
        self.ended = True
        if status == "KILLED" and self.parent is not None:
            self.parent.end(status)
