"""The training loop: SFT warm start, then RL iterations (collect → estimate → update → log → checkpoint).

``Trainer`` builds a run's parts once (``RunParts``: the processes, the policy, the envs, the algorithm's
plug-ins, the collection, the optimiser and update step) and its ``Checkpoints``; ``Trainer.run`` reads top to
bottom and is the same for every algorithm and every mode. What differs between algorithms lives in their
plug-ins (``agentgym.training.api.algorithm``); what differs between modes lives in objects chosen when the
run is built, which the loop calls the same way:

- collection (``agentgym.training.run.collection``): ``SyncCollection`` collects when asked, between
  updates; ``AsyncCollection`` (``rollout.max_staleness: K``) collects up to K iterations ahead during them;
- processes (``Distributed``): one, or several under ``accelerate launch``, each collecting its share of the
  tasks and training on its share of the rows;
- ``Checkpoints``: saving, resuming, and the point a stop resumes from.

Each iteration's collected groups become one ``Batch`` whose ``TurnTable`` is built once and handed to the
estimator and the update. Every iteration's sampling seed and minibatch order derive from
``(cfg.seed, iteration)``, and its task seeds from those and the groups the task sampler observed, so a
resumed run replays exactly what an uninterrupted one would have done. The run folder (``RunFolder``), the
response to Ctrl-C and SIGTERM (``StopSignals``) and the progress display (``Progress``) change nothing that
is trained.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.backends.lora import is_lora
from agentgym.rollout.collector import CollectStats
from agentgym.rollout.episode_log import write_iteration
from agentgym.rollout.evaluation import collect_episodes
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.records import EpisodeGroup
from agentgym.rollout.summary import per_task, summarize
from agentgym.run_folder import RunFolder
from agentgym.training.api.turn_table import Batch
from agentgym.training.config.schema import TrainConfig, config_to_dict
from agentgym.training.engine.weights import reference_model, save_pretrained
from agentgym.training.run.checkpoint import Checkpoints
from agentgym.training.run.collection import Collected, check_tool_calls
from agentgym.training.run.curve import plot_learning_curve
from agentgym.training.run.distributed import Distributed
from agentgym.training.run.interrupt import StopNow, StopSignals
from agentgym.training.run.metrics import MetricsLog, iteration_metrics, run_report
from agentgym.training.run.parts import RunParts
from agentgym.training.run.progress import Progress, iteration_status
from agentgym.training.run.setup import env_factory, flatten  # noqa: F401  (re-exported)
from agentgym.training.run.warm_start import open_warm_start


class Trainer:
    """One training run: its parts, built once, and ``run``. The parts read as the trainer's own
    (``trainer.model``, ``trainer.collector``, ``trainer.update``...).

    Args:
        cfg: the validated config.
        out_dir: the run folder.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str | Path) -> None:
        self.cfg = cfg
        self.dist = Distributed.create(cfg.optim.mixed_precision, cpu=cfg.model.device == "cpu")
        # Checkpoints and the reference live in the run folder (written by the main process only); the
        # other processes of a multi-process run log into a scratch folder of their own.
        self.root = Path(out_dir)
        self.folder = RunFolder(self.dist.run_dir(self.root))
        # A new run's warm start (sft.from_run: its source, checked) is chosen before anything is built; a
        # folder holding a checkpoint is resumed (which never reads the source) or overwritten (``start``).
        self.warm = None if RunFolder(self.root).has_checkpoint() else open_warm_start(cfg, self.root)
        self.progress = Progress()
        self.stop = StopSignals()
        self.parts = RunParts.build(cfg, self.dist, self.poll_stop)
        self.collection = self.parts.collection
        self.checkpoints = Checkpoints(cfg, self.root, self.parts, self.collection)
        self.dist.barrier()  # every process has checked the run folder before the main one writes to it

    def __getattr__(self, name: str) -> Any:
        if name == "parts":  # not built yet
            raise AttributeError(name)
        return getattr(self.parts, name)

    def poll_stop(self) -> None:
        """Raise ``StopNow`` if the run's pending stop applies now (``StopSignals.poll``)."""
        self.stop.poll()

    def sampling(self, temperature: float, seed: int) -> SamplingParams:
        return self.parts.rounds.sampling(temperature, seed)

    def collect(self, iteration: int) -> tuple[list[EpisodeGroup], CollectStats, dict[str, float]]:
        """The iteration's groups, their stats and the hooks' metrics, collected now (``TaskRounds``)."""
        return self.parts.rounds(iteration)

    def evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out episodes (seeds from ``eval.seed_offset``; tasks ``0..`` of ``eval.split`` when named),
        one per task, at ``eval.temperature``, played and summarised by the evaluation harness's own
        functions, so report.json and `agentgym eval` agree; ``per_task`` keeps each task's outcome, so two
        runs' evaluations (the same seeds) compare task by task."""
        e = self.cfg.eval
        seeds = [e.seed_offset + i for i in range(self.parts.held_out_episodes)]
        sampling = self.sampling(e.temperature, self.cfg.seed + 7)
        groups = collect_episodes(self.parts.collector, seeds, 1, sampling, group_prefix=f"eval-{tag}-")
        return {**summarize(groups), "per_task": per_task(groups)}

    def evaluate_phase(self, tag: str, title: str) -> dict[str, Any]:
        """``evaluate`` shown as a phase of the run's progress."""
        self.progress.start(f"{title} ({self.parts.held_out_episodes} episodes)")
        summary = self.evaluate(tag)
        self.progress.finish(f"success {summary['success_rate']:.0%}")
        return summary

    # --- the warm start ---------------------------------------------------------------------------

    def warm_start(self) -> dict[str, Any]:
        """The run's warm start (``warm_start.open_warm_start``): its own SFT with the held-out evaluation
        before it, or ``sft.from_run``'s (chosen for a new run, ``start``). The evaluation after it is
        ``eval_before_rl``, once it is saved."""
        assert self.warm is not None, "a resumed run has no warm start to make"
        return self.warm.run(self)

    def eval_before_rl(self, extra: dict[str, Any], history: list[dict[str, Any]], iteration: int) -> None:
        """The held-out evaluation RL starts from, into ``extra`` (once: a run stopped during it does it on
        resume), then saved with the warm start when no RL iteration has run yet."""
        if "eval_before" in extra:
            return
        with self.stop.region("immediate"):
            extra["eval_before"] = self.evaluate_phase("before-rl", "eval before RL")
        if iteration == 0:
            self.checkpoints.save(0, history, extra)

    def freeze_reference(self) -> None:
        """The KL anchor is the policy RL starts from (after SFT), never the untrained init; a resumed
        run rebuilds it from the saved post-SFT weights."""
        model = self.parts.model
        state = None if is_lora(model) else self.checkpoints.read_reference(entry=None)
        self.parts.update.ref_model = reference_model(model, state)

    # --- the run --------------------------------------------------------------------------------

    def run(self, *, resume: bool = False, overwrite: bool = False,
            on_iteration: Callable[[dict[str, Any]], None] | None = None, stop_after: int | None = None,
            progress: Progress | None = None) -> dict[str, Any]:
        """Run (or resume) the job; see ``train``."""
        self.progress = progress or Progress()
        self.checkpoints.started = time.perf_counter()
        with StopSignals(self.progress.note) as self.stop:
            try:
                return self.run_iterations(resume, overwrite, on_iteration, stop_after)
            except StopNow:
                return self.checkpoints.stopped_now(self.stop.signal)

    def start(self, overwrite: bool) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """A new run: its folder, its warm start, saved as iteration 0 (so that a run stopped, or killed, in
        the evaluation after it or inside an update keeps it)."""
        self.warm = self.warm or open_warm_start(self.cfg, self.root)  # checked before the folder is cleared
        self.folder.start(config_to_dict(self.cfg), overwrite=overwrite)
        with self.stop.region("immediate"):  # nothing can be saved before SFT ends: any signal stops at once
            extra = self.warm_start()
        self.checkpoints.save(0, [], extra)
        return [], extra, 0

    def run_iterations(self, resume: bool, overwrite: bool,
                       on_iteration: Callable[[dict[str, Any]], None] | None,
                       stop_after: int | None) -> dict[str, Any]:
        """The run itself: start (warm start, or a checkpoint), RL iterations, finish."""
        cfg, folder, checkpoints = self.cfg, self.folder, self.checkpoints
        history, extra, start = checkpoints.resume() if resume else self.start(overwrite)
        checkpoints.start(start, history, extra, stop_after=stop_after)
        self.eval_before_rl(extra, history, start)
        if checkpoints.stops_after_warm_start(start):
            return checkpoints.stopped(0, history, self.stop.signal)
        folder.trajectories.mkdir(exist_ok=True)
        if self.parts.plugins.needs_reference:
            self.freeze_reference()
        self.progress.start("RL", total=cfg.iterations, completed=start)
        # The trackers stay open until the report is in them; only the main process logs to them.
        with MetricsLog(folder.path, history, on_iteration, config=config_to_dict(cfg),
                        tracking=self.dist.main_only(cfg.tracking)) as log:
            for iteration in range(start + 1, cfg.iterations + 1):
                metrics = self.iteration(iteration, history)
                history.append(metrics)
                log.log(metrics)
                self.progress.update(iteration, iteration_status(metrics))
                # --- checkpoint (and stop, when asked to) ----------------------------------------------
                if checkpoints.end_iteration(iteration, history, self.stop.requested):
                    return checkpoints.stopped(iteration, history, self.stop.signal)
            checkpoints.finished(history)
            report = self.finish(history, extra)
            log.finish(report)
        return report

    def iteration(self, iteration: int, history: list[dict[str, Any]]) -> dict[str, float]:
        """One RL iteration: collect → estimate → update → log; returns its metrics."""
        started = time.perf_counter()
        # --- collect (a stop abandons it: nothing has changed since the last iteration) ----------------
        self.checkpoints.before_collect(iteration, history)
        with self.stop.region("abandonable"):
            collected = self.collection.get(iteration)
        check_tool_calls(self.cfg, iteration, collected.stats, has_tools=self.parts.has_tools)
        write_iteration(self.folder.trajectory_file(iteration), collected.groups, iteration)
        # --- estimate --------------------------------------------------------------------------------
        batch = Batch.of(collected.groups)
        plugins = self.parts.plugins
        advantages = plugins.algorithm.estimator(batch, plugins.args)
        # --- update ----------------------------------------------------------------------------------
        update_started = time.perf_counter()
        update_metrics = self.update_policy(iteration, batch, advantages, collected, history)
        update_s = time.perf_counter() - update_started
        # --- log -------------------------------------------------------------------------------------
        timings = {"iteration_s": time.perf_counter() - started, "update_s": update_s}
        metrics = iteration_metrics(iteration, collected.groups, advantages, collected.stats, timings,
                                    self.parts.scheduler.get_last_lr()[0])
        metrics.update(collected.metrics)
        metrics.update(update_metrics)
        metrics.update(collected.rollout.metrics())
        if "perf/train_tokens" in update_metrics and update_s > 0:
            metrics["perf/train_tokens_per_s"] = update_metrics["perf/train_tokens"] / update_s
        if self.cfg.eval.every and iteration % self.cfg.eval.every == 0 and iteration != self.cfg.iterations:
            self.evaluate_between(iteration, metrics)
        return metrics

    def update_policy(self, iteration: int, batch: Batch, advantages: np.ndarray, collected: Collected,
                      history: list[dict[str, Any]]) -> dict[str, float]:
        """The policy update, the loss terms' and the schedule's step, then the new weights to what
        generates. Returns the update's metrics.

        A stop abandons the update: before its first optimiser step the run still stands at the end of the
        last iteration; after it, only the last checkpoint is left to resume from."""
        p = self.parts
        self.collection.before_update(iteration)
        started = time.perf_counter()
        try:
            with self.stop.region(self.dist.update_region):
                metrics = p.update(flatten(batch), advantages, batch.table, iteration,
                                   staleness=collected.rollout.staleness)
        except StopNow:
            if p.update.stepped:
                self.checkpoints.update_stopped(iteration, history)
            raise
        self.checkpoints.updated()
        for term in p.plugins.terms.values():
            metrics.update(term.end_iteration())
        with warnings.catch_warnings():  # the schedule counts iterations, also one whose update made no
            # optimiser step (no group had a signal), which PyTorch's call-order check would report
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            p.scheduler.step()
        self.collection.after_update(started, time.perf_counter())
        return metrics

    def evaluate_between(self, iteration: int, metrics: dict[str, float]) -> None:
        """The held-out evaluation between iterations, into ``metrics``; a stop during it saves the iteration
        without it."""
        try:
            with self.stop.region("abandonable"):
                self.collection.settle()
                metrics["eval/success_rate"] = self.evaluate(f"it{iteration}")["success_rate"]
        except StopNow:
            self.collection.abandon()

    def finish(self, history: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
        """The held-out evaluation after RL, the report, the model and the learning curve."""
        # Without settling, an asynchronous generator (which catches up only before it collects) would play
        # the weights one update behind model/.
        self.collection.settle()
        with self.stop.region("immediate"):
            eval_after = self.evaluate_phase("after", "eval after RL")
        report = run_report(self.cfg, self.folder, history, extra, eval_after,
                            time.perf_counter() - self.checkpoints.started)
        self.folder.report.write_text(json.dumps(report, indent=2))
        self.dist.on_main(save_pretrained, self.parts.model, self.parts.tokenizer, self.folder)
        plot_learning_curve(report, self.folder.curve)
        return report

    def close(self) -> None:
        self.parts.close()
        self.dist.release_run_dir(self.folder.path)


def train(cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
          on_iteration: Callable[[dict[str, Any]], None] | None = None, stop_after: int | None = None,
          progress: Progress | None = None) -> dict[str, Any]:
    """Run (or resume) a training job; writes checkpoints, metrics, trajectories, report and plot.

    Ctrl-C (SIGINT) stops the run after the current iteration, a second Ctrl-C or a SIGTERM at once
    (abandoning the iteration where that loses nothing else); either way the point reached is saved
    and the returned dict says where (``agentgym.training.run.interrupt``).

    Args:
        cfg: the validated config.
        out_dir: run folder: new or empty, or holding a run (``overwrite`` clears it first; ``resume``
            continues it, with the config changes a resumed run may make, ``run_folder.RESUMABLE``).
        on_iteration: called with each iteration's metrics.
        stop_after: stop after this iteration number without finishing the run, its checkpoint written first
            (0: right after the warm start, which ``sft.from_run`` then reads; tests use others to simulate a
            killed run).
        progress: where progress goes (``agentgym.training.run.progress``; default: nowhere).

    Returns:
        The report (also written to ``out_dir/report.json``), or, for a run that stopped early,
        ``{"stopped_after": iteration or None, "signal": name or None, "checkpoint": bool,
        "history": [...]}``.

    Raises:
        ConfigError: the folder cannot take the run (checked before anything is built), or the config
            cannot work (checked before anything is written).
    """
    Checkpoints.check_folder(cfg, out_dir, resume=resume, overwrite=overwrite)
    trainer = Trainer(cfg, out_dir)
    try:
        return trainer.run(resume=resume, overwrite=overwrite, on_iteration=on_iteration,
                           stop_after=stop_after, progress=progress)
    finally:
        trainer.close()
