"""Where the loop gets each iteration's episodes: ``TaskRounds`` (one iteration's tasks, collected in rounds)
and the two collection modes behind one interface, ``SyncCollection`` and ``AsyncCollection``.

The mode is chosen once, when the run is built (``make_collection``: ``rollout.max_staleness`` 0 or K); the
loop calls the same methods in both and never asks which it has. Synchronous: episodes are collected when the
loop asks for them, between updates, by the weights just trained. Asynchronous: a worker thread collects up
to K iterations ahead while the trainer updates, with weights of its own that the trainer publishes after
every update (``agentgym.training.run.pipeline`` and ``weight_sync`` have the details).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError
from agentgym.rollout.collector import Collector, CollectStats
from agentgym.rollout.hooks import HookChain
from agentgym.rollout.policy import SamplingParams, capability
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.config.schema import RolloutConfig, TrainConfig
from agentgym.training.run.distributed import Distributed
from agentgym.training.run.pipeline import Rollout, RolloutPipeline, merge_stats
from agentgym.training.run.task_sampling import GroupFeed, TaskSampler, zero_signal_share
from agentgym.training.run.weight_sync import InFlightWeights, bounded, version_metrics


@dataclass
class Collected:
    """One iteration's episodes as the loop gets them."""

    groups: list[EpisodeGroup]
    """``rollout.num_tasks`` groups, in task order (every process's, under several)."""
    stats: CollectStats
    """What collecting them took (turns, tool calls, timings)."""
    metrics: dict[str, float]
    """The hooks' and the task sampler's metrics, and the collection rounds'."""
    rollout: Rollout
    """How they were obtained (staleness, waiting, overlap with updates)."""


class TaskRounds:
    """An iteration's groups: the task sampler's tasks, this process's share of them, collected with the
    algorithm's hooks. When hooks filter groups out (DAPO dynamic sampling), more tasks are collected, up to
    the hooks' ``max_extra_rounds`` extra rounds, until the batch is full; the task sampler then observes
    every group collected, filtered out or not.

    Args:
        collector: plays the episodes.
        task_sampler: chooses each round's tasks.
        plugins: the algorithm's hooks and sampling adjustments.
        dist: the run's processes (each collects its share of the tasks).
        rollout: the ``rollout`` settings.
        seed: the run's seed (each iteration's sampling seed derives from it).
    """

    def __init__(self, collector: Collector, task_sampler: TaskSampler, plugins: PluginSet, dist: Distributed,
                 rollout: RolloutConfig, seed: int) -> None:
        self.collector, self.task_sampler, self.plugins, self.dist = collector, task_sampler, plugins, dist
        self.rollout, self.seed = rollout, seed

    def sampling(self, temperature: float, seed: int) -> SamplingParams:
        return self.rollout.sampling(temperature, seed)

    def __call__(self, iteration: int) -> tuple[list[EpisodeGroup], CollectStats, dict[str, float]]:
        """The iteration's groups, what collecting them took, and the hooks' and sampler's metrics."""
        r, hooks, dist = self.rollout, self.plugins.hooks, self.dist
        sampling = self.plugins.sampling(self.sampling(r.temperature, self.seed * 100_003 + iteration))
        groups: list[EpisodeGroup] = []
        stats = CollectStats()
        round_ = 0
        wanted = len(dist.shard(r.num_tasks))
        hooks.begin_iteration(iteration, self.collector.context(iteration))
        feed = GroupFeed()  # first in the chain: it sees the groups before a hook filters them
        while True:
            prefix = (f"it{iteration}-{dist.share_tag}g" if round_ == 0
                      else f"it{iteration}r{round_}-{dist.share_tag}g")
            seeds = self.task_sampler.sample(iteration, round_, r.num_tasks)
            groups += self.collector.collect([seeds[i] for i in dist.shard(len(seeds))], r.group_size,
                                             sampling, group_prefix=prefix, hooks=HookChain([feed, hooks]),
                                             iteration=iteration)
            merge_stats(stats, self.collector.last_stats)
            if len(groups) >= wanted or round_ >= hooks.max_extra_rounds:
                break
            round_ += 1
        collected = feed.take()
        groups, stats = dist.gather_groups(groups, stats)
        collected, _ = dist.gather_groups(collected, CollectStats())  # every process's sampler sees all
        self.task_sampler.observe(collected)
        metrics = dict(hooks.metrics())  # read once: what the hooks did over all of the iteration's rounds
        metrics.update({"rollout/groups": float(min(len(groups), r.num_tasks)),
                        "rollout/extra_rounds": float(round_),
                        "rollout/zero_signal_groups": zero_signal_share(collected)})
        metrics.update(self.task_sampler.metrics())
        return groups[:r.num_tasks], stats, metrics


class Collection:
    """The collection the loop calls, whatever the mode: ``get`` an iteration's episodes, tell it when an
    update starts and ends, ``settle`` it before the collector or the generator serves anything else, and
    save or reinstate what it has collected ahead. Subclasses say what each moment means in their mode.

    Args:
        pipeline: runs ``TaskRounds`` now or in the background.
    """

    def __init__(self, pipeline: RolloutPipeline) -> None:
        self.pipeline = pipeline

    @property
    def version(self) -> int:
        """Updates made so far."""
        return self.pipeline.version

    def get(self, iteration: int) -> Collected:
        """``iteration``'s episodes (collected now, or waited for)."""
        (groups, stats, metrics), rollout = self.pipeline.get(iteration)
        return Collected(groups, stats, metrics, rollout)

    def ahead_of(self, iteration: int) -> bool:
        """Whether a collection of an iteration after ``iteration`` is queued or running."""
        return self.pipeline.queued_beyond(iteration)

    def wait(self) -> None:
        """Let every queued collection finish (before plug-in state is captured)."""
        self.pipeline.wait()

    def pending_state(self) -> list[dict[str, Any]]:
        """What was collected ahead, for a checkpoint (``RolloutPipeline.pending_state``)."""
        return self.pipeline.pending_state()

    def abandon(self) -> None:
        """Forget what was collected ahead (the run stops at a point before it)."""
        self.pipeline.abandon()

    def restore(self, iteration: int, pending: list[dict[str, Any]] | dict[str, Any] | None) -> None:
        """A resumed run at the end of ``iteration`` (one update per iteration), with what the first run had
        collected ahead."""
        self.pipeline.version = iteration
        self.pipeline.load_pending_state(pending)

    def before_update(self, iteration: int) -> None:
        """``iteration``'s update is about to start."""

    def after_update(self, started: float, finished: float) -> None:
        """An update ran from ``started`` to ``finished`` (``time.perf_counter``): the new weights go to what
        generates."""
        self.pipeline.updated(started, finished)

    def sync(self) -> None:
        """The trained weights to what generates, now."""

    def weights_loaded(self) -> None:
        """The model's weights changed outside an update (SFT, another run's warm start)."""

    def settle(self) -> None:
        """Make the collector and the generator free and current for something else (an evaluation)."""

    def close(self) -> None:
        self.pipeline.close()


class SyncCollection(Collection):
    """Episodes collected when asked for, between updates (``rollout.max_staleness: 0``); after each update
    the generator is sent the new weights (a no-op when it is the trained model itself).

    Args:
        rounds: the iteration's collection.
        policy: the run's policy (a colocated engine frees the accelerator during updates).
        generator: what generates (the policy, here).
        dist: the run's processes.
        timeout_s: ``rollout.weight_sync_timeout_s``.
    """

    def __init__(self, rounds: TaskRounds, policy: Any, generator: Any, dist: Distributed,
                 timeout_s: float) -> None:
        super().__init__(RolloutPipeline(rounds, 0))
        self.policy, self.generator, self.dist, self.timeout_s = policy, generator, dist, timeout_s

    def before_update(self, iteration: int) -> None:
        if capability(self.policy, "pauses_for_updates"):
            self.policy.offload()  # a colocated engine frees the accelerator for the update

    def after_update(self, started: float, finished: float) -> None:
        super().after_update(started, finished)
        self.sync()

    def sync(self) -> None:
        """Under the ``rollout.weight_sync_timeout_s`` deadline. A generator shared by every process (a vLLM
        server) is sent them by the main process only, and the others wait until it has them."""
        shared = capability(self.generator, "shared_by_processes")
        if shared:
            self.generator.writer = self.dist.is_main
        bounded(lambda: self.generator.sync_weights(self.policy.model), self.timeout_s,
                type(self.generator).__name__)
        if shared:
            self.dist.barrier()


class AsyncCollection(Collection):
    """Episodes collected up to ``max_staleness`` iterations ahead, in a worker thread, while the trainer
    updates (``rollout.max_staleness: K``, K >= 1): when iteration i's update starts the worker is given the
    collections up to i + K; the generator takes the newest published weights before each collection.

    Args:
        rounds: the iteration's collection.
        weights: the generator's own weights, published to after every update.
        max_staleness: K.
        iterations: the run's length (nothing is collected beyond it).
    """

    def __init__(self, rounds: TaskRounds, weights: InFlightWeights, max_staleness: int,
                 iterations: int) -> None:
        super().__init__(RolloutPipeline(rounds, max_staleness, before_collect=weights.take))
        self.weights, self.max_staleness, self.iterations = weights, max_staleness, iterations

    def get(self, iteration: int) -> Collected:
        collected = super().get(iteration)
        rollout = collected.rollout  # the age of the weights that sampled each turn
        rollout.detail = version_metrics(collected.groups, self.version)
        rollout.staleness = int(rollout.detail.get("rollout/staleness", rollout.staleness))
        return collected

    def restore(self, iteration: int, pending: list[dict[str, Any]] | dict[str, Any] | None) -> None:
        super().restore(iteration, pending)
        self.sync()

    def before_update(self, iteration: int) -> None:
        if iteration < self.iterations:
            self.pipeline.prefetch(min(iteration + self.max_staleness, self.iterations))

    def after_update(self, started: float, finished: float) -> None:
        super().after_update(started, finished)
        self.weights.publish(self.version)

    def sync(self) -> None:
        """Nothing may be collecting; under the ``rollout.weight_sync_timeout_s`` deadline."""
        self.weights.sync_now(self.version)

    def weights_loaded(self) -> None:
        self.sync()  # the evaluation before RL and the first collection play them

    def settle(self) -> None:
        # The collector is busy with later iterations, and the generator catches up only before it collects.
        self.wait()
        self.sync()


def make_collection(rounds: TaskRounds, rollout: RolloutConfig, iterations: int, policy: Any, generator: Any,
                    weights: InFlightWeights | None, dist: Distributed) -> Collection:
    """The run's collection: asynchronous when the generator has weights of its own
    (``weight_sync.rollout_generator`` gives it them for ``rollout.max_staleness`` > 0), else synchronous."""
    if weights is None:
        return SyncCollection(rounds, policy, generator, dist, rollout.weight_sync_timeout_s)
    return AsyncCollection(rounds, weights, rollout.max_staleness, iterations)


def check_tool_calls(cfg: TrainConfig, iteration: int, stats: CollectStats, *, has_tools: bool) -> None:
    """A tool env whose first iteration made no tool call trains on nothing: stop and say why.
    (Only envs that report ``info["tool_calls"]`` can be checked.)

    Raises:
        ConfigError: iteration 1 of a tool env made no tool call (``rollout.require_tool_calls``).
    """
    if iteration == 1 and has_tools and cfg.rollout.require_tool_calls \
            and stats.tool_calls == 0 and stats.tool_call_reports > 0:
        raise ConfigError(
            f"{stats.turns} turns of {cfg.env.id} rollouts made no tool call: the policy never used "
            f"the env's tools, so RL has nothing to learn from. Check rollout.action_format (tool envs "
            f"want 'raw'), rollout.max_new_tokens (a call must fit) and that SFT taught the call syntax; "
            f"rollout.require_tool_calls=false runs anyway")
