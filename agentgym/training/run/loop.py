"""The training loop: SFT warm start, then RL iterations (collect → estimate → update → log → checkpoint).

``Trainer.__init__`` builds every component of a run once (the plug-ins, the policy, the
collector, the update step); ``Trainer.run`` reads top to bottom and is the same for every
algorithm: what differs between algorithms lives in their plug-ins (``agentgym.training.api.algorithm``).
Every iteration's sampling seed and minibatch order derive from ``(cfg.seed, iteration)``, and its task
seeds from those and the groups the task sampler observed (``agentgym.training.run.task_sampling``, its
state checkpointed with the plug-ins'), so a resumed run replays exactly what an uninterrupted one would
have done. The run
folder (``RunFolder``), the response to Ctrl-C and SIGTERM (``StopSignals``: stop after the
iteration, or at once where the iteration may be abandoned) and the progress display
(``Progress``) are components the loop calls; none of them changes what is trained. So are the
run's processes (``Distributed``: one, or several under ``accelerate launch``, each collecting its
share of the tasks and training on its share of the rows) and the ``RolloutPipeline`` (episodes
collected between updates, or during them with ``rollout.max_staleness: K``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentgym.backends.builder import every_weight_trained, make_policy
from agentgym.backends.lora import is_lora
from agentgym.backends.transformers_backend import enable_activation_checkpointing
from agentgym.errors import ConfigError
from agentgym.rollout.collector import Collector, CollectStats
from agentgym.rollout.demos import collect_demos
from agentgym.rollout.evaluation import collect_episodes
from agentgym.rollout.hooks import HookChain
from agentgym.rollout.policy import SamplingParams, capability
from agentgym.rollout.records import EpisodeGroup
from agentgym.rollout.summary import per_task, summarize
from agentgym.run_folder import RunFolder
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.api.terms import RunContext
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.schema import TrainConfig, config_to_dict
from agentgym.training.engine.update import PolicyUpdate, sft_update
from agentgym.training.engine.weights import (
    load_model_state,
    model_state,
    reference_model,
    restore_reference_base,
    save_pretrained,
    save_reference,
    trainable_parameters,
)
from agentgym.training.run.checkpoint import (
    checkpoint_iteration,
    load_checkpoint,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agentgym.training.run.curve import plot_learning_curve
from agentgym.training.run.distributed import Distributed
from agentgym.training.run.interrupt import StopNow, StopSignals
from agentgym.training.run.metrics import MetricsLog, iteration_metrics
from agentgym.training.run.pipeline import RolloutPipeline, gather_groups, merge_stats
from agentgym.training.run.progress import Progress, iteration_status
from agentgym.training.run.setup import (  # noqa: F401  (flatten, env_factory: re-exported)
    action_format,
    demo_env_factory,
    env_factory,
    env_urls,
    flatten,
    lr_schedule,
    seed_everything,
    split_sizes,
    task_sampler,
)
from agentgym.training.run.task_sampling import GroupFeed, zero_signal_share
from agentgym.training.run.warm_start import WarmStartSource
from agentgym.training.run.weight_sync import bounded, rollout_generator, version_metrics

# Set-up helpers live in agentgym.training.run.setup; flatten is re-exported here.


@dataclass
class ResumePoint:
    """A point the run can be resumed from if it stops now: the end of ``iteration``. The live model,
    optimiser and schedule are that point's until the next update starts; what else changes meanwhile
    (RNG states, plug-in state) is captured here."""

    iteration: int
    """Iterations completed (0: right after the warm start)."""
    history: list[dict[str, Any]]
    """Their metrics."""
    rng: dict[str, Any] | None = None
    """RNG states at that point; None when that point's checkpoint is already saved."""
    plugins: dict[str, Any] | None = None
    """Plug-in state at that point (with ``rng``)."""
    abandoned: int | None = None
    """The iteration a stop at this point abandons, when it is not ``iteration + 1``."""


# --- the run --------------------------------------------------------------------------------------


class Trainer:
    """One training run: its components, built once, and ``run``.

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
        self.out = (self.root if self.dist.is_main
                    else Path(tempfile.mkdtemp(prefix=f"agentgym-rank{self.dist.rank}-")))
        self.folder = RunFolder(self.out)
        self.reference_file = RunFolder(self.root).reference  # every process rebuilds the reference from it
        # A new run's warm-start source is checked before anything is built; a folder holding a checkpoint is
        # resumed (which never reads the source again) or overwritten (checked before it is cleared).
        self.warm_source = (self.open_warm_source()
                            if cfg.sft.from_run and not RunFolder(self.root).has_checkpoint() else None)
        self.progress = Progress()
        self.stop = StopSignals()
        self.resume_point: ResumePoint | None = None
        self.saved_iteration: int | None = None
        self.extra: dict[str, Any] | None = None
        self.started = time.perf_counter()
        self.plugins = PluginSet.from_config(cfg)
        for term in self.plugins.terms.values():
            term.begin_run(RunContext(iterations=cfg.iterations))
        seed_everything(cfg.seed)
        model_cfg = (cfg.model if self.dist.device is None
                     else replace(cfg.model, device=str(self.dist.device)))
        self.policy = make_policy(model_cfg, seed=cfg.seed)  # several processes: each on its own device
        self.model, self.tokenizer = self.policy.model, self.policy.tokenizer
        r = cfg.rollout
        fmt = action_format(cfg)
        self.renderer = r.renderer(self.tokenizer, fmt)  # type: ignore[arg-type]
        self.make_env = env_factory(cfg)
        self.demo_envs = demo_env_factory(cfg, self.make_env)
        self.has_tools = self._check_env()
        self.task_sampler = task_sampler(cfg, self.train_tasks)
        self.generator, self.weights = rollout_generator(self.policy, self.model, r, seed=cfg.seed,
                                                         world_size=self.dist.world_size)
        self.collector = Collector(self.make_env, self.generator, self.renderer, action_format=fmt,
                                   max_prompt_tokens=r.max_prompt_tokens)
        # Long phases ask before each of their steps whether to stop (``StopSignals.poll``): the collector
        # before every turn (in a background thread too), the update between its chunks and minibatches.
        self.collector.stop_check = self.poll_stop
        self.pipeline = RolloutPipeline(self.collect, r.max_staleness,
                                        before_collect=self.weights.take if self.weights else None)
        if cfg.model.gradient_checkpointing:
            enable_activation_checkpointing(self.model)
        self.optimizer = torch.optim.AdamW(trainable_parameters(self.model), lr=cfg.optim.lr,
                                           betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay)
        self.trained, self.optimizer = self.dist.prepare(self.model, self.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule(cfg))
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.max_length = r.max_prompt_tokens + r.max_new_tokens
        self.update = PolicyUpdate(self.trained, self.optimizer, self.plugins, cfg.loss, cfg.optim,
                                   temperature=r.temperature, max_length=self.max_length,
                                   pad_token_id=self.pad_token_id, seed=cfg.seed,
                                   drop_zero_advantage_turns=cfg.algorithm.drop_zero_advantage_turns,
                                   dist=self.dist, micro_batch_tokens=cfg.optim.micro_batch_tokens,
                                   response_logits=cfg.optim.response_logits,
                                   share_prefixes=cfg.optim.share_prefixes,
                                   tis_cap=cfg.loss.tis_cap,
                                   # several processes would leave the collectives at different steps
                                   poll=self.poll_stop if self.dist.world_size == 1 else None)
        self.dist.barrier()  # every process has checked the run folder before the main one writes to it

    def poll_stop(self) -> None:
        """Raise ``StopNow`` if the run's pending stop applies now (``StopSignals.poll``)."""
        self.stop.poll()

    def sync_generator(self) -> None:
        """The trained weights to what generates, now (asynchronous: nothing may be collecting), under the
        ``rollout.weight_sync_timeout_s`` deadline. A generator shared by every process (a vLLM server)
        is sent them by the main process only, and the others wait until it has them."""
        if self.weights is not None:
            self.weights.sync_now(self.pipeline.version)
            return
        shared = capability(self.generator, "shared_by_processes")
        if shared:
            self.generator.writer = self.dist.is_main
        bounded(lambda: self.generator.sync_weights(self.model), self.cfg.rollout.weight_sync_timeout_s,
                type(self.generator).__name__)
        if shared:
            self.dist.barrier()

    def _check_env(self) -> bool:
        """Reset one env before anything else: a bad env id or argument fails here, and so does an
        algorithm whose needs the env or backend cannot meet. Returns whether the env has tools."""
        env = self.demo_envs()
        try:
            # How many tasks the named splits hold (before a reset, whose error would not name the key).
            self.train_tasks, self.held_out_episodes = split_sizes(self.cfg, env)
            _, info = env.reset(seed=self.cfg.eval.seed_offset)
            has_expert = bool(getattr(env, "has_expert", False))
        finally:
            env.close()
        if self.cfg.sft.enabled and not has_expert:
            raise ConfigError(f"sft.enabled needs expert demonstrations, but {self.cfg.env.id!r} has no "
                              "expert (an env declares one by defining expert_action()); set "
                              "sft.enabled=false to start RL from the untrained policy")
        self.plugins.check_needs(self.policy, self.cfg.env.id, info)
        return bool(info.get("tools"))

    # --- pieces of an iteration -----------------------------------------------------------------

    def sampling(self, temperature: float, seed: int) -> SamplingParams:
        return self.cfg.rollout.sampling(temperature, seed)

    def evaluate(self, tag: str) -> dict[str, Any]:
        """Held-out episodes (seeds from ``eval.seed_offset``; tasks ``0..`` of ``eval.split`` when named),
        one per task, at ``eval.temperature``, played and summarised by the evaluation harness's own
        functions, so report.json and `agentgym eval` agree; ``per_task`` keeps each task's outcome, so two
        runs' evaluations (the same seeds) compare task by task."""
        e = self.cfg.eval
        seeds = [e.seed_offset + i for i in range(self.held_out_episodes)]
        groups = collect_episodes(self.collector, seeds, 1, self.sampling(e.temperature, self.cfg.seed + 7),
                                  group_prefix=f"eval-{tag}-")
        return {**summarize(groups), "per_task": per_task(groups)}

    def collect(self, iteration: int) -> tuple[list[EpisodeGroup], CollectStats, dict[str, float]]:
        """The iteration's groups. When hooks filter groups out (DAPO dynamic sampling), more tasks are
        collected, up to the hooks' ``max_extra_rounds`` extra rounds, until the batch is full. The task
        sampler chooses each round's tasks and then observes every group collected, filtered out or not."""
        cfg, hooks = self.cfg, self.plugins.hooks
        sampling = self.plugins.sampling(self.sampling(cfg.rollout.temperature,
                                                       cfg.seed * 100_003 + iteration))
        groups: list[EpisodeGroup] = []
        stats = CollectStats()
        round_ = 0
        dist = self.dist
        # Several processes: each collects its share of the tasks.
        wanted = len(dist.shard(cfg.rollout.num_tasks))
        part = f"p{dist.rank}-" if dist.world_size > 1 else ""
        hooks.begin_iteration(iteration, self.collector.context(iteration))
        feed = GroupFeed()  # first in the chain: it sees the groups before a hook filters them
        while True:
            prefix = f"it{iteration}-{part}g" if round_ == 0 else f"it{iteration}r{round_}-{part}g"
            seeds = self.task_sampler.sample(iteration, round_, cfg.rollout.num_tasks)
            groups += self.collector.collect([seeds[i] for i in dist.shard(len(seeds))],
                                             cfg.rollout.group_size, sampling, group_prefix=prefix,
                                             hooks=HookChain([feed, hooks]), iteration=iteration)
            merge_stats(stats, self.collector.last_stats)
            if len(groups) >= wanted or round_ >= hooks.max_extra_rounds:
                break
            round_ += 1
        collected = feed.take()
        if dist.world_size > 1:
            groups, stats = gather_groups(dist, groups, stats)
            collected, _ = gather_groups(dist, collected, CollectStats())  # every process's sampler sees all
        self.task_sampler.observe(collected)
        metrics = dict(hooks.metrics())  # read once: what the hooks did over all of the iteration's rounds
        metrics.update({"rollout/groups": float(min(len(groups), cfg.rollout.num_tasks)),
                        "rollout/extra_rounds": float(round_),
                        "rollout/zero_signal_groups": zero_signal_share(collected)})
        metrics.update(self.task_sampler.metrics())
        return groups[:cfg.rollout.num_tasks], stats, metrics

    def evaluate_phase(self, tag: str, title: str) -> dict[str, Any]:
        """``evaluate`` shown as a phase of the run's progress."""
        self.progress.start(f"{title} ({self.held_out_episodes} episodes)")
        summary = self.evaluate(tag)
        self.progress.finish(f"success {summary['success_rate']:.0%}")
        return summary

    def warm_start(self) -> dict[str, Any]:
        """SFT on expert demonstrations (when enabled), with the held-out evaluation before it; the one
        after it is ``eval_before_rl``, once the warm start is saved. With ``sft.from_run``: that run's."""
        cfg, extra, progress = self.cfg, {}, self.progress
        if self.warm_source is not None:
            return self.adopt_warm_start(self.warm_source)
        extra["eval_before_sft"] = (self.evaluate_phase("before", "eval before SFT")
                                    if cfg.sft.enabled and cfg.eval.before_sft else None)
        if cfg.sft.enabled:
            demo_seeds = [cfg.sft.seed_offset + i for i in range(cfg.sft.num_episodes)]
            progress.start(f"expert demos ({cfg.sft.num_episodes} episodes)")
            demos, demo_stats = collect_demos(self.demo_envs, self.renderer, demo_seeds,
                                              action_format=self.collector.action_format)
            progress.finish(f"{len(demos)} turns")
            progress.start("SFT")
            with every_weight_trained(self.model, cfg.sft.all_layers and bool(cfg.model.train_top_layers)):
                extra["sft"] = {**demo_stats, **sft_update(
                    self.model, demos, cfg.sft, max_length=self.max_length, pad_token_id=self.pad_token_id,
                    grad_clip=cfg.optim.grad_clip, seed=cfg.seed,
                    on_step=lambda step, total, loss: progress.update(step, f"loss {loss:.3f}", total),
                    poll=self.poll_stop, response_logits=cfg.optim.response_logits,
                    share_prefixes=cfg.optim.share_prefixes)}
            progress.finish()
        if cfg.sft.enabled:  # every process continues from the main one's weights
            self.dist.broadcast_parameters(self.model)
            if self.weights is not None:  # the evaluation before RL and the first collection play them
                self.sync_generator()
        save_reference(self.model, self.reference_file, sft_ran=cfg.sft.enabled,
                       needed=self.plugins.needs_reference, write=self.dist.is_main)
        self.dist.barrier()
        return extra

    def open_warm_source(self) -> WarmStartSource:
        """``sft.from_run``, checked against this run's config (``WarmStartSource.open``)."""
        return WarmStartSource.open(self.cfg.sft.from_run, config_to_dict(self.cfg),
                                    config_to_dict(TrainConfig()), out_dir=self.root)

    def adopt_warm_start(self, source: WarmStartSource) -> dict[str, Any]:
        """Another run's warm start as this run's: its weights, evaluations and random state."""
        state = source.state()
        base = source.lora_base() if is_lora(self.model) else None
        if base is not None:  # SFT changed the base weights: this run's resume rebuilds them from the copy
            restore_reference_base(self.model, base)
            if self.dist.is_main:
                source.copy_reference(self.reference_file)
        load_model_state(self.model, state)
        if self.weights is not None:
            self.sync_generator()
        save_reference(self.model, self.reference_file, sft_ran=False, needed=self.plugins.needs_reference,
                       write=self.dist.is_main)
        self.dist.barrier()
        set_rng_state(state["rng"])
        return {**{k: v for k, v in state["extra"].items() if k != "elapsed_s"},
                "warm_start_from": str(source.folder.path)}

    def eval_before_rl(self, extra: dict[str, Any], history: list[dict[str, Any]], iteration: int) -> None:
        """The held-out evaluation RL starts from, into ``extra`` (once: a run stopped during it does it on
        resume), then saved with the warm start when no RL iteration has run yet."""
        if "eval_before" in extra:
            return
        with self.stop.region("immediate"):
            extra["eval_before"] = self.evaluate_phase("before-rl", "eval before RL")
        if iteration == 0:
            self.save(0, history, extra)

    def freeze_reference(self) -> None:
        """The KL anchor is the policy RL starts from (after SFT), never the untrained init; a resumed
        run rebuilds it from the saved post-SFT weights."""
        state = None if is_lora(self.model) else self.read_reference(entry=None)
        self.update.ref_model = reference_model(self.model, state)

    def read_reference(self, entry: str | None) -> dict[str, Any]:
        """``reference.pt``, checked (a damaged or missing file is one line saying how to go on)."""
        return read_checkpoint(self.reference_file, entry=entry,
                               remedy=f"it holds the post-SFT weights the run's KL term compares with, so "
                                      f"the run cannot go on without it. Start it again with: "
                                      f"{RunFolder(self.root).restart_command()}")

    def plugin_state(self) -> dict[str, Any]:
        """State of the run's stateful plug-ins (hooks, plan, loss terms) and task sampler for checkpoints."""
        return {"hooks": self.plugins.hooks.state_dict(), "plan": self.plugins.plan.state_dict(),
                "terms": {name: term.state_dict() for name, term in self.plugins.terms.items()},
                "task_sampler": self.task_sampler.state_dict()}

    def load_plugin_state(self, state: dict[str, Any]) -> None:
        self.plugins.hooks.load_state_dict(state.get("hooks", {}))
        self.plugins.plan.load_state_dict(state.get("plan", {}))
        for name, term in self.plugins.terms.items():
            term.load_state_dict(state.get("terms", {}).get(name, {}))
        self.task_sampler.load_state_dict(state.get("task_sampler", {}))

    # --- saving and restoring -------------------------------------------------------------------

    def save(self, iteration: int, history: list[dict[str, Any]], extra: dict[str, Any], *,
             rng: dict[str, Any] | None = None, plugins: dict[str, Any] | None = None) -> None:
        """Checkpoint the end of ``iteration`` (RNG and plug-in state: now, unless given)."""
        # Asynchronous: the next iteration's episodes, collected already.
        pending = self.pipeline.pending_state()
        state = {"iteration": iteration, **model_state(self.model), "optimizer": self.optimizer.state_dict(),
                 "pending_rollout": pending,
                 "scheduler": self.scheduler.state_dict(), "plugins": plugins or self.plugin_state(),
                 "history": history,
                 "extra": {**extra,
                           "elapsed_s": extra.get("elapsed_s", 0.0) + time.perf_counter() - self.started}}
        if self.dist.is_main:
            save_checkpoint(self.root, state if rng is None else {**state, "rng": rng})
        self.dist.barrier()
        self.saved_iteration = iteration

    def capture(self, iteration: int, history: list[dict[str, Any]]) -> ResumePoint:
        """The resume point at the end of ``iteration`` (call before the next update starts)."""
        if self.saved_iteration == iteration:
            return ResumePoint(iteration, list(history))
        return ResumePoint(iteration, list(history), rng_state(), copy.deepcopy(self.plugin_state()))

    def restore(self) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
        """Reinstate the folder's checkpoint, after checking the config against the run's (the changes a
        resumed run may make are recorded). Returns the history, the warm start's results and the
        iteration."""
        cfg, out = self.cfg, self.root
        folder = RunFolder(out)
        changes = folder.check_resume(config_to_dict(cfg), checkpoint_iteration(out),
                                     defaults=config_to_dict(TrainConfig()))
        state = load_checkpoint(out)
        iteration = state["iteration"]
        if self.dist.is_main:
            folder.record_changes(iteration, changes, config_to_dict(cfg))
        if is_lora(self.model) and self.reference_file.is_file():  # SFT changed the LoRA run's base
            restore_reference_base(self.model, self.read_reference(entry="lora_base"))
        load_model_state(self.model, state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # A longer run stretches the schedule: the next update already uses the new schedule's rate.
        factor = lr_schedule(cfg)(self.scheduler.last_epoch)
        for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base_lr * factor
        self.load_plugin_state(state.get("plugins", {}))
        self.pipeline.version = iteration  # one update per iteration: turns' versions count from the start
        self.pipeline.load_pending_state(state.get("pending_rollout"))
        if self.pipeline.asynchronous:
            self.sync_generator()
        set_rng_state(state["rng"])
        self.saved_iteration = iteration
        return state["history"], state["extra"], iteration

    def stopped(self, iteration: int | None, history: list[dict[str, Any]], *,
                abandoned: int | None = None) -> dict[str, Any]:
        """What ``run`` returns when it stops early (a signal, or ``stop_after``) after ``iteration``
        (None: before anything was saved); ``abandoned``: the iteration cut short, when it is not
        ``iteration + 1`` (iterations finished after the last checkpoint are redone on resume)."""
        return {"stopped_after": iteration, "signal": self.stop.signal, "checkpoint": iteration is not None,
                "history": history, "abandoned": abandoned}

    def saved_point(self, history: list[dict[str, Any]]) -> ResumePoint | None:
        """The resume point of the last checkpoint (None without one)."""
        if self.saved_iteration is None:
            return None
        return ResumePoint(self.saved_iteration,
                           [h for h in history if h["iteration"] <= self.saved_iteration])

    def stopped_now(self, point: ResumePoint | None, extra: dict[str, Any] | None) -> dict[str, Any]:
        """The run was cut short (``StopNow``): save its resume point, if it has one not yet saved."""
        if point is None:
            return self.stopped(None, [])
        self.pipeline.abandon()  # a collection ahead of the point saved is not part of it
        if point.rng is not None and extra is not None:
            self.save(point.iteration, point.history, extra, rng=point.rng, plugins=point.plugins)
        return self.stopped(point.iteration, point.history, abandoned=point.abandoned)

    # --- the steps of an iteration, with their stop, resume and asynchrony plumbing ---------------

    def collect_iteration(self, iteration: int, history: list[dict[str, Any]]
                          ) -> tuple[list[EpisodeGroup], CollectStats, dict[str, float], Any]:
        """The iteration's groups, their stats and hook metrics, and the rollout record (staleness).

        A stop abandons the collection: nothing has changed since the last iteration. Asynchronous: the
        groups were collected during earlier updates. When collections of later iterations are under way
        (``max_staleness`` > 1), a stop resumes from the last checkpoint instead of waiting for them."""
        self.resume_point = self.saved_point(history)  # a background collection may be half done
        if not self.pipeline.queued_beyond(iteration):
            self.pipeline.wait()  # a background collection must not change plug-in state while it is captured
            self.resume_point = self.capture(iteration - 1, history)
        with self.stop.region("abandonable"):
            (groups, stats, hook_metrics), rollout = self.pipeline.get(iteration)
        if self.weights is not None:  # the age of the weights that sampled each turn
            rollout.detail = version_metrics(groups, self.pipeline.version)
            rollout.staleness = int(rollout.detail.get("rollout/staleness", rollout.staleness))
        return groups, stats, hook_metrics, rollout

    def update_iteration(self, iteration: int, groups: list[EpisodeGroup], advantages: Any, rollout: Any,
                         history: list[dict[str, Any]]) -> dict[str, float]:
        """The policy update, the loss terms' and the schedule's step, then the new weights to the generator
        (a no-op when it is the model). Returns the update's metrics.

        A stop abandons the update: before its first optimiser step the run still stands at the end of the
        last iteration; after it, only the last checkpoint is left to resume from."""
        asynchronous = self.pipeline.asynchronous
        if asynchronous and iteration < self.cfg.iterations:
            self.pipeline.prefetch(min(iteration + self.cfg.rollout.max_staleness, self.cfg.iterations))
        started = time.perf_counter()
        if not asynchronous and capability(self.policy, "pauses_for_updates"):
            self.policy.offload()  # a colocated engine frees the accelerator for the update
        try:
            with (self.stop.region("abandonable") if self.update.poll is not None
                  else contextlib.nullcontext()):
                # The estimator's table (TurnTable.of builds one per batch), so the plan splits the same view.
                metrics = self.update(flatten(groups), advantages, TurnTable.of(groups), iteration,
                                      staleness=rollout.staleness)
        except StopNow:
            if self.update.stepped:
                self.resume_point = self.saved_point(history)
                if self.resume_point is not None and self.resume_point.iteration < iteration - 1:
                    self.resume_point.abandoned = iteration
            raise
        self.resume_point = None
        for term in self.plugins.terms.values():
            metrics.update(term.end_iteration())
        with warnings.catch_warnings():  # the schedule counts iterations, also one whose update made no
            # optimiser step (no group had a signal), which PyTorch's call-order check would report
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()
        self.pipeline.updated(started, time.perf_counter())
        if self.weights is not None:
            self.weights.publish(self.pipeline.version)
        else:
            self.sync_generator()
        return metrics

    def evaluate_between(self, iteration: int, metrics: dict[str, float]) -> None:
        """The held-out evaluation between iterations, into ``metrics``; a stop during it saves the iteration
        without it. Asynchronous: the collector is busy with the next iteration, so it finishes first."""
        try:
            with self.stop.region("abandonable"):
                if self.pipeline.asynchronous:
                    self.pipeline.wait()
                    self.sync_generator()
                metrics["eval/success_rate"] = self.evaluate(f"it{iteration}")["success_rate"]
        except StopNow:
            self.pipeline.abandon()

    # --- the run --------------------------------------------------------------------------------

    def run(self, *, resume: bool = False, overwrite: bool = False,
            on_iteration: Callable[[dict[str, Any]], None] | None = None, stop_after: int | None = None,
            progress: Progress | None = None) -> dict[str, Any]:
        """Run (or resume) the job; see ``train``."""
        self.progress = progress or Progress()
        self.started = time.perf_counter()
        with StopSignals(self.progress.note) as self.stop:
            try:
                return self.run_iterations(resume, overwrite, on_iteration, stop_after)
            except StopNow:
                return self.stopped_now(self.resume_point, self.extra)

    def run_iterations(self, resume: bool, overwrite: bool,
                       on_iteration: Callable[[dict[str, Any]], None] | None,
                       stop_after: int | None) -> dict[str, Any]:
        """The run itself: start (warm start, or a checkpoint), RL iterations, finish."""
        cfg, folder, plugins, stop, progress = self.cfg, self.folder, self.plugins, self.stop, self.progress
        # --- start: from a checkpoint, or SFT warm start + evaluations -----------------------------
        if resume:
            history, extra, start_iteration = self.restore()
        else:
            if cfg.sft.from_run and self.warm_source is None:
                self.warm_source = self.open_warm_source()
            folder.start(config_to_dict(cfg), overwrite=overwrite)
            with stop.region("immediate"):  # nothing can be saved before SFT ends: any signal stops at once
                extra = self.warm_start()
            history, start_iteration = [], 0
            # Saved as iteration 0, so that a run stopped (or killed) in the evaluation after it or inside an
            # update keeps its warm start.
            self.save(0, history, extra)
        self.resume_point, self.extra = ResumePoint(start_iteration, list(history)), extra  # saved already
        self.eval_before_rl(extra, history, start_iteration)
        if stop_after == 0 and start_iteration == 0:  # --warm-start-only: sft.from_run reads the checkpoint
            return self.stopped(0, history)
        folder.trajectories.mkdir(exist_ok=True)
        if plugins.needs_reference:
            self.freeze_reference()
        progress.start("RL", total=cfg.iterations, completed=start_iteration)

        # The trackers stay open until the report is in them; only the main process logs to them.
        with MetricsLog(folder.path, history, on_iteration, config=config_to_dict(cfg),
                        tracking=cfg.tracking if self.dist.is_main else None) as log:
            for iteration in range(start_iteration + 1, cfg.iterations + 1):
                it_started = time.perf_counter()
                # --- collect ---------------------------------------------------------------------------
                groups, stats, hook_metrics, rollout = self.collect_iteration(iteration, history)
                self._check_tool_calls(iteration, stats)
                with open(folder.trajectory_file(iteration), "w") as fh:
                    fh.writelines(json.dumps(group.to_json()) + "\n" for group in groups)
                # --- estimate ----------------------------------------------------------------------------
                advantages = plugins.algorithm.estimator(groups, plugins.args)
                # --- update --------------------------------------------------------------------------------
                update_started = time.perf_counter()
                update_metrics = self.update_iteration(iteration, groups, advantages, rollout, history)
                update_s = time.perf_counter() - update_started
                # --- log ---------------------------------------------------------------------------------
                timings = {"iteration_s": time.perf_counter() - it_started, "update_s": update_s}
                metrics = iteration_metrics(iteration, groups, advantages, stats, timings,
                                            self.scheduler.get_last_lr()[0])
                metrics.update(hook_metrics)
                metrics.update(update_metrics)
                metrics.update(rollout.metrics())
                if "perf/train_tokens" in update_metrics and update_s > 0:
                    metrics["perf/train_tokens_per_s"] = update_metrics["perf/train_tokens"] / update_s
                if cfg.eval.every and iteration % cfg.eval.every == 0 and iteration != cfg.iterations:
                    self.evaluate_between(iteration, metrics)
                history.append(metrics)
                log.log(metrics)
                progress.update(iteration, iteration_status(metrics))
                # --- checkpoint (and stop, when asked to) --------------------------------------------------
                stopping = stop.requested or (stop_after is not None and iteration >= stop_after)
                if (cfg.checkpoint_every and iteration % cfg.checkpoint_every == 0) \
                        or iteration == cfg.iterations or stopping:
                    self.save(iteration, history, extra)
                if stopping:
                    return self.stopped(iteration, history)

            # --- finish: held-out evaluation, report, model ---------------------------------------
            self.resume_point = ResumePoint(cfg.iterations, history)  # saved with the last iteration
            if self.pipeline.asynchronous:
                # Asynchronous generators catch up only before they collect, and nothing is collected after
                # the last update: without this the final evaluation would play the weights one update behind
                # model/.
                self.sync_generator()
            with stop.region("immediate"):
                eval_after = self.evaluate_phase("after", "eval after RL")
            report = {
                "algorithm": cfg.algorithm.name,
                "env": cfg.env.id,
                "iterations": cfg.iterations,
                "wall_time_s": extra.get("elapsed_s", 0.0) + time.perf_counter() - self.started,
                "eval": {"before": extra["eval_before"], "after": eval_after,
                         "before_sft": extra.get("eval_before_sft")},
                "sft": extra.get("sft"),
                "history": history,
                "config": config_to_dict(cfg),
                "config_history": folder.config_history(),
            }
            folder.report.write_text(json.dumps(report, indent=2))
            if self.dist.is_main:
                save_pretrained(self.model, self.tokenizer, folder)
            plot_learning_curve(report, folder.curve)
            log.finish(report)
        return report

    def _check_tool_calls(self, iteration: int, stats: CollectStats) -> None:
        """A tool env whose first iteration made no tool call trains on nothing: stop and say why.
        (Only envs that report ``info["tool_calls"]`` can be checked.)"""
        if iteration == 1 and self.has_tools and self.cfg.rollout.require_tool_calls \
                and stats.tool_calls == 0 and stats.tool_call_reports > 0:
            raise ConfigError(
                f"{stats.turns} turns of {self.cfg.env.id} rollouts made no tool call: the policy never used "
                f"the env's tools, so RL has nothing to learn from. Check rollout.action_format (tool envs "
                f"want 'raw'), rollout.max_new_tokens (a call must fit) and that SFT taught the call syntax; "
                f"rollout.require_tool_calls=false runs anyway")

    def close(self) -> None:
        self.pipeline.close()
        self.collector.close()
        if callable(getattr(self.policy, "close", None)):
            self.policy.close()
        if self.out != self.root:
            shutil.rmtree(self.out, ignore_errors=True)


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
    folder = RunFolder(out_dir)
    if resume:
        folder.check_resume(config_to_dict(cfg), checkpoint_iteration(folder.path),
                            defaults=config_to_dict(TrainConfig()))
    else:
        folder.check_new(overwrite=overwrite)
    trainer = Trainer(cfg, out_dir)
    try:
        return trainer.run(resume=resume, overwrite=overwrite, on_iteration=on_iteration,
                           stop_after=stop_after, progress=progress)
    finally:
        trainer.close()
