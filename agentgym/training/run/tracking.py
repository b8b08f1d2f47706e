"""Experiment trackers a run's metrics also go to (``Sink``: TensorBoard, MLflow, W&B), opened by
``open_sinks`` from the config's ``tracking`` section, and the tracker runs a resumed run continues
(``tracking.json``).

A tracker gets the run's config once, as its parameters; every iteration's numbers with the iteration
as step; the finished run's summary (``summary_numbers``: held-out success before and after); and is
closed with how the run ended, also when it stopped or failed, so no tracker run is left "running".
MLflow logs by default into a SQLite store in the run folder (``mlruns/mlflow.db``), W&B always offline
into the run folder's ``wandb/`` (training never waits on a network; ``wandb sync`` uploads it). The ids
of both runs are kept in ``tracking.json``: a resumed run continues them, where they still exist, and
otherwise starts new ones and logs the history so far into them. The tracker packages are imported only
when a tracker is opened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from agentgym.run_folder import RunFolder, flatten
from agentgym.training.config.schema import TrackingConfig

#: How a run ended: all its iterations and its report (``finished``), a stop it can be resumed from
#: (Ctrl-C, SIGTERM, ``stop_after``), or an error.
Outcome = Literal["finished", "stopped", "failed"]
#: MLflow's run status for each outcome.
MLFLOW_STATUS: dict[str, str] = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}
#: W&B's exit code for each outcome (W&B shows any other than 0 as failed): a stop is 130, what the
#: CLI exits with on Ctrl-C.
WANDB_EXIT_CODE: dict[str, int] = {"finished": 0, "stopped": 130, "failed": 1}
#: MLflow refuses longer parameter values.
_MLFLOW_PARAM_CHARS = 6000
#: MLflow's per-request limits of ``log_batch``.
_MLFLOW_BATCH = {"params": 100, "metrics": 1000}
#: Characters MLflow refuses in a metric or parameter name (a config's env.kwargs keys are the user's).
_MLFLOW_NAME_FORBIDDEN = re.compile(r"[^\w\-. :/]")


class Sink(Protocol):
    """Where a run's metrics go besides ``metrics.jsonl``; built with the run's config.

    Contract: ``log`` once per iteration, in iteration order, with that iteration's numbers
    (``section/name`` → value) and the iteration as ``step``; ``summarize`` at most once, after the last
    ``log``, with the finished run's ``summary_numbers`` at the last iteration as ``step``; ``close``
    exactly once, last, with the run's ``Outcome``.
    """

    def log(self, numbers: dict[str, float], step: int) -> None: ...

    def summarize(self, numbers: dict[str, float], step: int) -> None: ...

    def close(self, outcome: Outcome) -> None: ...


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """An iteration's metrics that trackers plot: the numbers, without the step (``iteration``).

    Example:
        >>> numeric({"iteration": 3, "rollout/success_rate": 0.5, "rollout/turns": 12, "note": "x"})
        {'rollout/success_rate': 0.5, 'rollout/turns': 12.0}
    """
    return {key: float(value) for key, value in metrics.items()
            if key != "iteration" and isinstance(value, (int, float))}


def summary_numbers(report: dict[str, Any]) -> dict[str, float]:
    """A finished run's numbers for a tracker's summary: held-out success before RL and after it (and
    before SFT, when SFT ran), and the run's wall time.

    Example:
        >>> summary_numbers({"eval": {"before": {"success_rate": 0.25}, "after": {"success_rate": 0.5},
        ...                           "before_sft": None}, "wall_time_s": 12.5})
        {'eval/before_success_rate': 0.25, 'eval/after_success_rate': 0.5, 'perf/wall_time_s': 12.5}
    """
    evals = report["eval"]
    numbers = {"eval/before_success_rate": evals["before"]["success_rate"],
               "eval/after_success_rate": evals["after"]["success_rate"]}
    if evals.get("before_sft"):
        numbers["eval/before_sft_success_rate"] = evals["before_sft"]["success_rate"]
    numbers["perf/wall_time_s"] = report["wall_time_s"]
    return {key: float(value) for key, value in numbers.items()}


def open_sinks(tracking: TrackingConfig, folder: RunFolder, config: dict[str, Any],
               history: list[dict[str, Any]]) -> list[Sink]:
    """The sinks ``tracking`` asks for, opened; tracker runs that ``tracking.json`` names are continued.

    Args:
        tracking: the run's ``tracking`` section.
        folder: the run folder (the trackers' default stores are inside it).
        config: the run's config as plain data: the trackers' parameters.
        history: the iterations already logged (a resumed run's): a tracker run started now gets them too.

    Returns:
        TensorBoard's sink (when asked for and installed), then MLflow's, then W&B's.
    """
    sinks: list[Sink] = []
    try:
        if tracking.tensorboard:
            board = TensorBoardSink.open(folder.tensorboard)
            if board is not None:
                sinks.append(board)
        if not (tracking.mlflow or tracking.wandb):
            return sinks
        ids = read_ids(folder)
        if tracking.mlflow:
            mlflow = MlflowSink.open(tracking, folder, config, history, ids.get("mlflow"))
            sinks.append(mlflow)
            ids["mlflow"] = mlflow.record
        if tracking.wandb:
            wandb = WandbSink.open(tracking, folder, config, history, ids.get("wandb"))
            sinks.append(wandb)
            ids["wandb"] = wandb.record
        folder.tracking.write_text(json.dumps(ids, indent=2))
    except BaseException:
        for sink in sinks:  # the trackers opened already must not be left running
            with contextlib.suppress(Exception):
                sink.close("failed")
        raise
    return sinks


def read_ids(folder: RunFolder) -> dict[str, Any]:
    """The tracker runs ``tracking.json`` names (``{}`` without the file, or for one that is damaged: the
    trackers then start new runs)."""
    try:
        ids = json.loads(folder.tracking.read_text())
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Info lines of the logger ``name`` silenced (MLflow announces each table it creates)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- TensorBoard ----------------------------------------------------------------------------------


class TensorBoardSink:
    """Each iteration's numbers as TensorBoard scalars in ``tensorboard/``."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, logdir: Path) -> TensorBoardSink | None:
        """The sink, or None where TensorBoard is not installed (it is in the train extra; metrics.jsonl is
        always written)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        return cls(SummaryWriter(str(logdir)))

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)

    def summarize(self, numbers: dict[str, float], step: int) -> None:
        """TensorBoard has no summary; the report's numbers are in report.json."""

    def close(self, outcome: Outcome) -> None:
        self.writer.close()


# --- MLflow ---------------------------------------------------------------------------------------


def mlflow_store(folder: RunFolder) -> str:
    """The tracking URI of the run folder's own MLflow store: a SQLite database in ``mlruns/``.

    Example:
        >>> mlflow_store(RunFolder("/runs/a"))
        'sqlite:////runs/a/mlruns/mlflow.db'
    """
    return f"sqlite:///{(folder.mlruns / 'mlflow.db').resolve().as_posix()}"


def _mlflow_name(key: str) -> str:
    return _MLFLOW_NAME_FORBIDDEN.sub("_", key)


def _mlflow_params(config: dict[str, Any]) -> dict[str, str]:
    """The config as MLflow parameters: one per leaf field, ``section.field`` → its value as text."""
    return {_mlflow_name(key): (value if isinstance(value, str) else json.dumps(value))[:_MLFLOW_PARAM_CHARS]
            for key, value in flatten(config).items()}


def _mlflow_experiment(client: Any, name: str, folder: RunFolder, uri: str | None) -> str:
    """The id of the MLflow experiment ``name``, created if need be."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    # The run folder's store keeps any artifact in the folder too, not in the working directory.
    location = (folder.mlruns / "artifacts").resolve().as_uri() if uri is None else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:  # another run created it meanwhile
        return client.get_experiment_by_name(name).experiment_id


class MlflowSink:
    """An MLflow run (``MlflowClient``): the config as parameters, the numbers as metrics at each step."""

    def __init__(self, client: Any, run_id: str, record: dict[str, Any]) -> None:
        self.client = client
        self.run_id = run_id
        self.record = record
        """What ``tracking.json`` keeps: the run id and the configured store (None: the run folder's)."""

    @classmethod
    def open(cls, tracking: TrackingConfig, folder: RunFolder, config: dict[str, Any],
             history: list[dict[str, Any]], saved: dict[str, Any] | None) -> MlflowSink:
        """Continue the MLflow run ``saved`` names, when it is in this store, or start one (and log
        ``history`` into it)."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = tracking.mlflow_uri
        if uri is None:
            folder.mlruns.mkdir(exist_ok=True)
        with _quiet("mlflow.store.db.utils"):
            client = MlflowClient(uri or mlflow_store(folder))
        found = None
        if saved and saved.get("uri") == uri and isinstance(saved.get("run_id"), str):
            with contextlib.suppress(MlflowException):  # deleted from the store, or the store is new
                found = client.get_run(saved["run_id"])
        if found is not None and found.info.lifecycle_stage == "active":
            run_id = found.info.run_id
            client.update_run(run_id, status="RUNNING")
            logged, backlog = found.data.params, []
        else:
            run_id = client.create_run(_mlflow_experiment(client, tracking.project, folder, uri),
                                       run_name=tracking.run_name or folder.path.resolve().name,
                                       tags={"agentgym.run_folder": str(folder.path.resolve())}).info.run_id
            logged, backlog = {}, history
        sink = cls(client, run_id, {"run_id": run_id, "uri": uri})
        try:
            sink.update_params(config, logged)
            for metrics in backlog:
                sink.log(numeric(metrics), metrics["iteration"])
        except BaseException:
            sink.close("failed")
            raise
        return sink

    def update_params(self, config: dict[str, Any], logged: dict[str, str]) -> None:
        """Log the config's parameters that ``logged`` lacks. MLflow never changes a logged parameter: the
        values a resumed run changed go to the tag ``agentgym.config_changes`` (JSON)."""
        from mlflow.entities import Param

        params = _mlflow_params(config)
        new = [Param(key, value) for key, value in params.items() if key not in logged]
        for batch in _batches(new, _MLFLOW_BATCH["params"]):
            self.client.log_batch(self.run_id, params=batch)
        changed = {key: value for key, value in params.items() if key in logged and logged[key] != value}
        if changed:
            self.client.set_tag(self.run_id, "agentgym.config_changes", json.dumps(changed))

    def log(self, numbers: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_name(key), value, now, step) for key, value in numbers.items()]
        for batch in _batches(metrics, _MLFLOW_BATCH["metrics"]):
            self.client.log_batch(self.run_id, metrics=batch)

    def summarize(self, numbers: dict[str, float], step: int) -> None:
        self.log(numbers, step)

    def close(self, outcome: Outcome) -> None:
        self.client.set_terminated(self.run_id, MLFLOW_STATUS[outcome])


# --- Weights & Biases -----------------------------------------------------------------------------


def _next_session_second(wandb_dir: Path, run_id: str) -> None:
    """Wait, if need be, for a second in which no offline session of ``run_id`` started. W&B names a
    session's folder ``offline-run-YYYYmmdd_HHMMSS-ID`` by the second it starts: a resumed session started
    in the same second as the last one (a quick stop and resume) would write over that one's file."""
    now = time.time()
    if (wandb_dir / f"offline-run-{time.strftime('%Y%m%d_%H%M%S', time.localtime(now))}-{run_id}").exists():
        time.sleep(1.0 - now % 1.0 + 0.01)


class WandbSink:
    """An offline W&B run in the run folder's ``wandb/``: the config as the run's config, the numbers as
    its history at each step, the summary numbers as its summary."""

    def __init__(self, run: Any, record: dict[str, Any]) -> None:
        self.run = run
        self.record = record
        """What ``tracking.json`` keeps: the run id and its project."""

    @classmethod
    def open(cls, tracking: TrackingConfig, folder: RunFolder, config: dict[str, Any],
             history: list[dict[str, Any]], saved: dict[str, Any] | None) -> WandbSink:
        """Continue the W&B run ``saved`` names, when it is of this project, or start one (and log
        ``history`` into it)."""
        import wandb

        run_id = None
        if saved and saved.get("project") == tracking.project and isinstance(saved.get("run_id"), str):
            run_id = saved["run_id"]
        # Offline whatever WANDB_MODE says; the console is left alone (the run shows its own progress),
        # and nothing about the machine, git or the code is collected.
        settings = wandb.Settings(mode="offline", console="off", silent=True, disable_git=True,
                                  save_code=False, disable_job_creation=True)
        if run_id is not None:
            _next_session_second(folder.wandb, run_id)
        run = wandb.init(project=tracking.project, name=tracking.run_name or folder.path.resolve().name,
                         dir=str(folder.path), config=config, id=run_id, resume="allow" if run_id else None,
                         mode="offline", settings=settings, reinit="create_new")
        sink = cls(run, {"run_id": run.id, "project": tracking.project})
        if run_id is None:
            try:
                for metrics in history:
                    sink.log(numeric(metrics), metrics["iteration"])
            except BaseException:
                sink.close("failed")
                raise
        return sink

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def summarize(self, numbers: dict[str, float], step: int) -> None:
        self.run.summary.update(numbers)

    def close(self, outcome: Outcome) -> None:
        self.run.finish(exit_code=WANDB_EXIT_CODE[outcome])
