"""A run's folder -- a training run's (``agentgym train --out``) or an evaluation's (``agentgym eval --out``):
the name of every file either writes (``RunFolder``'s accessors), which of the two a folder holds, starting a
training run (never over another one), resuming it, and the history of its config.

Every reader and writer of a run's files finds them through ``RunFolder``; the names below never change, so
the folders of earlier runs stay readable. A training run's::

    entry                 accessor       holds (written by)
    config.json           .config        the run's config as JSON (``start``, ``record_changes``)
    config_history.jsonl  .history       each config change made on resume; only a resumed run that
                                         changed its config has it (``record_changes``)
    checkpoint.pt         .checkpoint    the latest resume point (``checkpoint.save_checkpoint``)
    reference.pt          .reference     the KL reference's weights after the warm start, when a loss term
                                         needs one; a LoRA run has it when SFT changed the base
                                         (``weights.save_reference``)
    metrics.jsonl         .metrics       one JSON line of metrics per iteration (``metrics.MetricsLog``)
    tensorboard/          .tensorboard   the same metrics as TensorBoard events, when TensorBoard is
                                         installed (``tracking.open_sinks``)
    tracking.json         .tracking      the ids of the run's MLflow and W&B runs, so that a resumed run
                                         continues them (``tracking.open_sinks``)
    mlruns/               .mlruns        the MLflow store, ``mlflow.db``, with ``tracking.mlflow`` and no
                                         ``tracking.mlflow_uri`` (``tracking.open_sinks``)
    wandb/                .wandb         W&B's offline runs, ``offline-run-*``, with ``tracking.wandb``
                                         (``tracking.open_sinks``)
    trajectories/         .trajectories  iter_00001.jsonl...: each iteration's episodes, one JSON line each
                                         (``.trajectory_file``; the loop, ``rollout.episode_log``)
    report.json           .report        a finished run's evaluations, history and config (the loop)
    learning_curve.png    .curve         the report's plot (``curve.plot_learning_curve``)
    model/                .model         the trained model, a Hugging Face directory
                                         (``weights.save_pretrained``)
    adapter/              .adapter       a LoRA run's adapter alone, the form vLLM loads
                                         (``weights.save_pretrained``)

An evaluation's::

    entry                 accessor       holds (written by)
    plan.json             .plan          the exact evaluation: policies, envs, seeds, samples, sampling
                                         (``eval.store.EvalStore``)
    trajectories/ENV/POLICY.jsonl        one JSON line per finished episode, appended as episodes finish
                          .episode_file(env, policy)   (``eval.store.EvalStore``, ``rollout.episode_log``)
    timing.json           .timing        wall seconds per (env, policy), summed over resumed sessions
    results.json          .results       the results (``eval.report.write_reports``)
    report.md             .report_md     the same as Markdown
    report.html           .report_html   the same as a web page

``kind`` says which of the two a folder holds: an evaluation has ``plan.json``; a training run has
``config.json`` and ``trajectories/``.

A folder holds a run when it has any file only a run writes (``RUN_FILES``). A new run goes into a
folder that does not exist or is empty, or — with ``overwrite`` — into a folder holding a run, which
is cleared first; a folder holding anything else is never written to. A resumed run may change only
the fields that extend or observe it (``RESUMABLE``); each change is appended to
``config_history.jsonl`` and ``config.json`` is rewritten, so the folder always says what ran.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError

CONFIG = "config.json"
HISTORY = "config_history.jsonl"
CHECKPOINT = "checkpoint.pt"
REFERENCE = "reference.pt"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
TRACKING = "tracking.json"
MLRUNS = "mlruns"
WANDB = "wandb"
TRAJECTORIES = "trajectories"
REPORT = "report.json"
CURVE = "learning_curve.png"
MODEL = "model"
ADAPTER = "adapter"
PLAN = "plan.json"
TIMING = "timing.json"
RESULTS = "results.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
#: Every file and folder a training run writes, in the order of the module docstring's table.
LAYOUT = (CONFIG, HISTORY, CHECKPOINT, REFERENCE, METRICS, TENSORBOARD, TRACKING, MLRUNS, WANDB, TRAJECTORIES,
          REPORT, CURVE, MODEL, ADAPTER)
#: Every file and folder an evaluation writes, in the order of the module docstring's table.
EVAL_LAYOUT = (PLAN, TRAJECTORIES, TIMING, RESULTS, REPORT_MD, REPORT_HTML)
#: Entries a folder may hold for other reasons than a run: an evaluation's trajectories/, a model's
#: folders, any TensorBoard log, MLflow store or W&B folder, a plot.
_NOT_ONLY_RUNS = (TENSORBOARD, MLRUNS, WANDB, TRAJECTORIES, CURVE, MODEL, ADAPTER)
#: Files only a run writes: a folder with any of them holds a run.
RUN_FILES = tuple(name for name in LAYOUT if name not in _NOT_ONLY_RUNS)
#: The name of an iteration's file in ``trajectories/``.
TRAJECTORY_FILE = "iter_{:05d}.jsonl"
_TRAJECTORY_NAME = re.compile(r"iter_(\d+)\.jsonl")
#: Fields a resumed run may change: they extend the run or change how it is observed or placed,
#: never what it learns from (``env.url``/``model.device`` move the same run to another service or device;
#: ``tracking`` says where its metrics are also logged).
RESUMABLE = ("iterations", "checkpoint_every", "eval.every", "env.url", "env.token", "model.device",
             "tracking")


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``{"a.b": value}``; lists and scalars are leaves.

    Example:
        >>> flatten({"env": {"id": "maze-v0", "kwargs": {"size": 2}}, "seed": 0})
        {'env.id': 'maze-v0', 'env.kwargs.size': 2, 'seed': 0}
    """
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fields that differ between two plain configs, as ``{path: {"from": old, "to": new}}``.

    Example:
        >>> config_changes({"iterations": 60, "optim": {"lr": 0.1}}, {"iterations": 90, "optim": {"lr": 0.1}})
        {'iterations': {'from': 60, 'to': 90}}
    """
    before, after = flatten(old), flatten(new)
    return {path: {"from": before.get(path), "to": after.get(path)}
            for path in [*before, *(p for p in after if p not in before)]
            if before.get(path) != after.get(path)}


def read_run_config(path: Path) -> dict[str, Any]:
    """A run's ``config.json`` as plain data, checked to be a JSON object.

    Raises:
        ConfigError: the file cannot be read, or is not a JSON object (damaged, or not a run's), in one line
            naming it and saying what to do.
    """
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        why = f"byte {exc.start} is not UTF-8"
    except json.JSONDecodeError as exc:
        why = f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    except OSError as exc:
        why = f"cannot be read: {exc.strerror or exc}"
    else:
        if isinstance(config, dict):
            return config
        why = f"a JSON {type(config).__name__}, not an object"
    raise ConfigError(f"{path} is damaged ({why}); it holds the run's config: put back the file "
                      f"`agentgym train` wrote there (the config the run started with, as JSON)")


def under(path: str, fields: tuple[str, ...]) -> bool:
    """Whether the flattened config field ``path`` is one of ``fields`` or lies below one of them.

    Example:
        >>> under("tracking.wandb", ("tracking",)), under("trackings", ("tracking",))
        (True, False)
    """
    return any(path == field or path.startswith(field + ".") for field in fields)


def slug(name: str) -> str:
    """A file-name-safe form of an env id or policy name (an evaluation's episode files are named by them).

    Example:
        >>> slug("acme/maze-v0"), slug("run@checkpoint")
        ('acme__maze-v0', 'run@checkpoint')
    """
    return re.sub(r"[^A-Za-z0-9@._+-]", "_", name.replace("/", "__"))


def _resumable(path: str) -> bool:
    return under(path, RESUMABLE)


class RunFolder:
    """The folder of one run: a training run or an evaluation.

    Args:
        path: where the run lives.

    Example:
        >>> import tempfile
        >>> folder = RunFolder(Path(tempfile.mkdtemp()) / "run")
        >>> folder.holds_run()
        False
        >>> folder.start({"iterations": 2}, overwrite=False)
        >>> folder.holds_run(), folder.saved_config()
        (True, {'iterations': 2})
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # --- its files (the module docstring's table) ------------------------------------------------

    @property
    def config(self) -> Path:
        """``config.json``: the run's config as JSON, by ``start`` (rewritten by ``record_changes``)."""
        return self.path / CONFIG

    @property
    def history(self) -> Path:
        """``config_history.jsonl``: a JSON line per resume that changed the config, by ``record_changes``."""
        return self.path / HISTORY

    @property
    def checkpoint(self) -> Path:
        """``checkpoint.pt``: the latest resume point (weights, optimiser, RNG...), by ``save_checkpoint``."""
        return self.path / CHECKPOINT

    @property
    def reference(self) -> Path:
        """``reference.pt``: the KL reference's post-warm-start weights, by ``weights.save_reference``."""
        return self.path / REFERENCE

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: one JSON line of metrics per iteration, by ``metrics.MetricsLog``."""
        return self.path / METRICS

    @property
    def tensorboard(self) -> Path:
        """``tensorboard/``: the metrics as TensorBoard events, by ``tracking.open_sinks`` (if installed)."""
        return self.path / TENSORBOARD

    @property
    def tracking(self) -> Path:
        """``tracking.json``: the ids of the run's MLflow and W&B runs, by ``tracking.open_sinks``."""
        return self.path / TRACKING

    @property
    def mlruns(self) -> Path:
        """``mlruns/``: the run's own MLflow store (``mlflow.db``), by ``tracking.open_sinks``."""
        return self.path / MLRUNS

    @property
    def wandb(self) -> Path:
        """``wandb/``: W&B's offline runs (``offline-run-*``), by ``tracking.open_sinks``."""
        return self.path / WANDB

    @property
    def trajectories(self) -> Path:
        """``trajectories/``: one ``trajectory_file`` per iteration, written by the loop."""
        return self.path / TRAJECTORIES

    @property
    def report(self) -> Path:
        """``report.json``: a finished run's evaluations, history and config, written by the loop."""
        return self.path / REPORT

    @property
    def curve(self) -> Path:
        """``learning_curve.png``: the report's learning curves, by ``curve.plot_learning_curve``."""
        return self.path / CURVE

    @property
    def model(self) -> Path:
        """``model/``: the trained model as a Hugging Face directory, by ``weights.save_pretrained``."""
        return self.path / MODEL

    @property
    def adapter(self) -> Path:
        """``adapter/``: a LoRA run's adapter alone (what vLLM loads), by ``weights.save_pretrained``."""
        return self.path / ADAPTER

    @property
    def plan(self) -> Path:
        """``plan.json``: the evaluation's plan (policies, envs, seeds, sampling), by ``EvalStore``."""
        return self.path / PLAN

    @property
    def timing(self) -> Path:
        """``timing.json``: an evaluation's wall seconds per (env, policy), by ``EvalStore``."""
        return self.path / TIMING

    @property
    def results(self) -> Path:
        """``results.json``: an evaluation's results, by ``eval.report.write_reports``."""
        return self.path / RESULTS

    @property
    def report_md(self) -> Path:
        """``report.md``: an evaluation's results as Markdown, by ``eval.report.write_reports``."""
        return self.path / REPORT_MD

    @property
    def report_html(self) -> Path:
        """``report.html``: an evaluation's results as a web page, by ``eval.report.write_reports``."""
        return self.path / REPORT_HTML

    def episode_file(self, env: str, policy: str) -> Path:
        """``trajectories/ENV/POLICY.jsonl``: an evaluation's episodes of ``policy`` on ``env``, one JSON line
        each, by ``EvalStore``.

        Example:
            >>> RunFolder("out").episode_file("acme/maze-v0", "expert").as_posix()
            'out/trajectories/acme__maze-v0/expert.jsonl'
        """
        return self.trajectories / slug(env) / f"{slug(policy)}.jsonl"

    def episode_files(self) -> list[Path]:
        """Every evaluation episode file there, sorted."""
        return sorted(self.trajectories.glob("*/*.jsonl"))

    def trajectory_file(self, iteration: int) -> Path:
        """``trajectories/iter_NNNNN.jsonl``: ``iteration``'s groups, one JSON line each, written by the loop.

        Example:
            >>> RunFolder("run").trajectory_file(3).as_posix()
            'run/trajectories/iter_00003.jsonl'
        """
        return self.trajectories / TRAJECTORY_FILE.format(iteration)

    def trajectory_files(self) -> list[tuple[int, Path]]:
        """The iterations whose trajectories are saved, with their files, in iteration order."""
        found = []
        for path in self.trajectories.glob("iter_*.jsonl"):
            match = _TRAJECTORY_NAME.fullmatch(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    # --- what is there -------------------------------------------------------------------------

    def kind(self) -> str | None:
        """``"eval"`` for an evaluation (it has ``plan.json``), ``"train"`` for a training run
        (``config.json`` and ``trajectories/``), None for neither."""
        if self.plan.is_file():
            return "eval"
        if self.config.is_file() and self.trajectories.is_dir():
            return "train"
        return None

    def holds_run(self) -> bool:
        """The folder has a file only a run writes."""
        return any((self.path / name).exists() for name in RUN_FILES)

    def has_checkpoint(self) -> bool:
        return self.checkpoint.is_file()

    def has_model(self) -> bool:
        """The run finished and saved its model (``model/`` holds a Hugging Face ``config.json``)."""
        return (self.model / "config.json").is_file()  # the model's own config, named by Hugging Face

    def saved_config(self) -> dict[str, Any]:
        """The run's config as plain data (``config.json``).

        Raises:
            ConfigError: the folder holds no run, or its ``config.json`` is damaged (``read_run_config``).
        """
        if not self.config.is_file():
            raise ConfigError(f"--resume {self.path}: no run there (no {CONFIG}); start one with "
                              f"--out {self.path}")
        return read_run_config(self.config)

    def config_history(self) -> list[dict[str, Any]]:
        """Every change made to the run's config on resume, oldest first."""
        path = self.history
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    # --- commands to tell the user ---------------------------------------------------------------

    def resume_command(self) -> str:
        return f"agentgym train --resume {shlex.quote(str(self.path))}"

    def restart_command(self) -> str:
        """Starts the same run again from scratch: its saved config, into the same folder."""
        return (f"agentgym train {shlex.quote(str(self.config))} --out {shlex.quote(str(self.path))} "
                f"--overwrite")

    # --- a new run -------------------------------------------------------------------------------

    def check_new(self, *, overwrite: bool) -> None:
        """Raise unless a new run may start here (see the module docstring); writes nothing.

        Raises:
            ConfigError: the folder holds a run (and ``overwrite`` is False), or holds other files.
        """
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out {self.path} is a file, not a folder; pick a new folder for the run")
        if self.holds_run():
            if overwrite:
                return
            if not self.has_checkpoint() and not self.report.exists():
                raise ConfigError(f"{self.path} holds a run that stopped before its first checkpoint; "
                                  f"start it again with --overwrite, or pick a new --out folder")
            raise ConfigError(f"{self.path} already holds a run; continue it with --resume {self.path}, "
                              f"pick a new --out folder, or add --overwrite to delete that run and start "
                              f"again")
        if self.path.is_dir() and any(self.path.iterdir()):
            raise ConfigError(f"{self.path} holds files but is not a run folder, so nothing will be written "
                              f"or deleted there; pick a new or empty --out folder")

    def start(self, config: dict[str, Any], *, overwrite: bool) -> None:
        """Create the folder (clearing the run it holds when ``overwrite``) and write ``config.json``."""
        self.check_new(overwrite=overwrite)
        if overwrite and self.holds_run():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(config, indent=2))

    # --- a resumed run ---------------------------------------------------------------------------

    def check_resume(self, config: dict[str, Any], iteration: int | None = None, *,
                     defaults: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """The changes ``config`` makes to the saved run's config, if a resumed run may make them.

        Args:
            config: the config to resume with (plain data).
            iteration: the checkpoint's iteration, when known: the run must not be finished already
                (unless ``config`` extends it) nor have gone past ``config``'s iterations.
            defaults: the default config (plain data). A field the saved config lacks (one added since the
                run was written) that ``config`` leaves at its default is no change: the run ran as if
                it had it.

        Raises:
            ConfigError: no run or no checkpoint here, changes outside ``RESUMABLE`` (all named), or
                nothing left to run.
        """
        saved = self.saved_config()
        changes = config_changes(saved, config)
        if defaults is not None:
            known, default = flatten(saved), flatten(defaults)
            changes = {path: change for path, change in changes.items()
                       if path in known or path not in default or default[path] != change["to"]}
        if not self.has_checkpoint():
            raise ConfigError(f"--resume {self.path}: no checkpoint there: the run stopped before its first "
                              f"one, so there is nothing to resume. Start it again with: "
                              f"{self.restart_command()}")
        refused = [path for path in changes if not _resumable(path)]
        if refused:
            listed = ", ".join(f"{p} ({changes[p]['from']!r} → {changes[p]['to']!r})" for p in refused)
            raise ConfigError(f"--resume {self.path}: {listed} cannot change when a run resumes (it would no "
                              f"longer be the run its checkpoint continues); a resumed run may change only "
                              f"{', '.join(RESUMABLE)}. Start a new run with --out instead")
        iterations = config.get("iterations")
        if iteration is not None and isinstance(iterations, int):
            if iterations < iteration:
                raise ConfigError(f"--resume {self.path}: iterations={iterations}, but the run is at "
                                  f"iteration {iteration}; set iterations to {iteration} or more")
            if iterations == iteration and self.report.is_file():
                raise ConfigError(f"--resume {self.path}: the run finished all {iteration} iterations; "
                                  f"extend it with --set iterations=N (N > {iteration})")
        return changes

    def record_changes(self, iteration: int, changes: dict[str, dict[str, Any]],
                       config: dict[str, Any]) -> None:
        """Append ``changes`` (made when resuming after ``iteration``) to the history; rewrite
        ``config.json``."""
        if not changes:
            return
        entry = {"iteration": iteration, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changes": changes}
        with open(self.history, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
        self.config.write_text(json.dumps(config, indent=2))
