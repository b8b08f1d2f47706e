"""Which training tasks an iteration collects: the ``TaskSampler`` plug point, ``UniformSampler`` and the
learning-signal ``CurriculumSampler`` (registered as ``uniform`` and ``curriculum``: ``sampler_registry``).

A task is a seed (every env picks its task from the seed). The training loop asks its sampler for each
collection round's seeds (``sample``), shows it every group the iteration collected (``observe``, before
any rollout hook filtered them) and logs its ``metrics``; the sampler's ``state_dict`` is saved with the
run's plug-in state, so a resumed run samples exactly what an uninterrupted one would.

Group-relative estimators (GRPO and its family) learn nothing from a group whose returns are all equal:
``zero_signal`` says which groups those are, and ``rollout/zero_signal_groups`` is their share in each
iteration, whatever the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import CollectContext, RolloutHooks
from agentgym.rollout.records import EpisodeGroup, Trajectory
from agentgym.training.run.sampler_registry import register_task_sampler

#: Returns closer than this count as equal (float sums of equal rewards may differ in the last bits).
RETURN_TOLERANCE = 1e-9


@dataclass(frozen=True)
class CurriculumSettings:
    """The settings of the learning-signal curriculum (``rollout.task_sampler: curriculum``), written under
    ``rollout.curriculum``: how it scores the tasks of its pool and draws each iteration's
    (``CurriculumSampler``).

    Example:
        >>> CurriculumSettings(epsilon=1.5)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: CurriculumSettings.epsilon must be in [0, 1], got 1.5
    """

    pool_size: int = 256
    """Candidate training tasks: this many distinct seeds, drawn once from the run's seed below
    ``eval.seed_offset`` (task indices of ``env.train_split``: all of them when it has fewer); at least
    ``rollout.num_tasks``."""
    prior_episodes: float = 2.0
    """Pseudo-episodes at success rate 1/2 added to each task's counts (> 0): an unseen task scores as a
    half-solved one (optimistic, so it gets tried), and a few episodes cannot rule a task out."""
    cost: Literal["turns", "tokens", "none"] = "turns"
    """What a task's learnability is divided by: its mean turns per episode, its mean generated tokens per
    episode, or nothing (``none``)."""
    temperature: float = 1.0
    """Scores are raised to the power 1/temperature before they become probabilities (> 0): below 1
    sharpens the preference for the best-scored tasks, above 1 flattens it."""
    epsilon: float = 0.1
    """Share of the probability spread evenly over the pool, in [0, 1]: every task keeps at least
    epsilon / pool_size, so none starves (1: uniform over the pool)."""
    stale_groups: int = 3
    """k: a task whose last k groups all had equal returns (no learning signal) is de-prioritised."""
    stale_factor: float = 0.1
    """What a de-prioritised task's score is multiplied by, in (0, 1] (1: no de-prioritising)."""

    def __post_init__(self) -> None:
        checks = [
            ("pool_size", not isinstance(self.pool_size, bool) and isinstance(self.pool_size, int)
             and self.pool_size >= 1, "a positive integer"),
            ("prior_episodes", 0 < self.prior_episodes < math.inf, "a positive number"),
            ("temperature", 0 < self.temperature < math.inf, "a positive number"),
            ("epsilon", 0 <= self.epsilon <= 1, "in [0, 1]"),
            ("stale_groups", not isinstance(self.stale_groups, bool) and isinstance(self.stale_groups, int)
             and self.stale_groups >= 1, "a positive integer"),
            ("stale_factor", 0 < self.stale_factor <= 1, "in (0, 1]"),
        ]
        for name, ok, wanted in checks:
            if not ok:
                raise ConfigError(f"CurriculumSettings.{name} must be {wanted}, got {getattr(self, name)!r}")
        if self.cost not in ("turns", "tokens", "none"):
            raise ConfigError(f"CurriculumSettings.cost must be one of 'turns', 'tokens', 'none', "
                              f"got {self.cost!r}")


def zero_signal(group: EpisodeGroup) -> bool:
    """Whether ``group`` gives a group-relative estimator no learning signal: all its returns are equal
    (all solved or all failed alike), or it has one member (no baseline to compare with).

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def episode(reward): return Trajectory([Turn([], [], [], reward, "s")], "t", 0)
        >>> zero_signal(EpisodeGroup("g", "t", 0, [episode(1.0), episode(1.0)]))
        True
        >>> zero_signal(EpisodeGroup("g", "t", 0, [episode(1.0), episode(0.0)]))
        False
    """
    returns = [t.episode_return for t in group.trajectories]
    return len(returns) < 2 or max(returns) - min(returns) <= RETURN_TOLERANCE


def zero_signal_share(groups: Sequence[EpisodeGroup]) -> float:
    """The share of ``groups`` that give no learning signal (``zero_signal``); 0.0 for no groups."""
    return sum(map(zero_signal, groups)) / len(groups) if groups else 0.0


@runtime_checkable
class TaskSampler(Protocol):
    """Chooses the task seeds of each collection round and learns from what was collected.

    Contract: ``sample`` returns ``count`` seeds below the run's ``eval.seed_offset`` (never an eval task)
    and is a function of ``(iteration, round_)`` and of the groups observed so far — no hidden random
    state — so a run restored with ``load_state_dict`` samples what the uninterrupted run did.
    ``observe`` gets every group an iteration collected, once per iteration, in task order, before any
    rollout hook filtered them. ``metrics`` are ``section/name`` numbers logged with the iteration.
    ``state_dict`` is plain data (lists, numbers) that ``load_state_dict`` reinstates; ``{}`` leaves a
    sampler as it was built (a checkpoint from before samplers had state).
    """

    def sample(self, iteration: int, round_: int, count: int) -> list[int]: ...

    def observe(self, groups: Sequence[EpisodeGroup]) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class UniformSampler:
    """Seeds drawn uniformly (with repetition) below ``seed_offset``, from ``(seed, iteration[, round_])``
    alone; it learns nothing from the groups.

    Args:
        seed: the run's seed.
        seed_offset: the first eval seed (``eval.seed_offset``); training seeds stay below it.

    Example:
        >>> sampler = UniformSampler(seed=3, seed_offset=100)
        >>> sampler.sample(2, 0, 3), sampler.sample(2, 2, 3)
        ([84, 2, 56], [49, 81, 37])
    """

    def __init__(self, seed: int, seed_offset: int) -> None:
        self.seed = seed
        self.seed_offset = seed_offset

    def sample(self, iteration: int, round_: int, count: int) -> list[int]:
        # Round 0 keeps the stream of runs from before extra rounds existed, so their seeds do not move.
        key = [self.seed, iteration] if round_ == 0 else [self.seed, iteration, round_]
        rng = np.random.default_rng(key)
        return [int(s) for s in rng.integers(0, self.seed_offset, size=count)]

    def observe(self, groups: Sequence[EpisodeGroup]) -> None:
        """Uniform sampling learns nothing from the groups."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to reinstate."""


#: The per-task counters of ``CurriculumSampler``, in its ``state_dict``.
_COUNTERS = ("groups", "episodes", "successes", "cost", "streak")


class CurriculumSampler:
    """Prefers the tasks whose groups still give a learning signal, per unit of cost.

    Design:

    * **Pool.** ``pool_size`` distinct candidate seeds, drawn once below ``seed_offset`` from the run's
      seed (all of them when there are fewer: a small ``env.train_split``); every iteration's tasks
      come from it.
    * **Statistics.** Per task: groups and episodes observed, successes (``Trajectory.success``), the
      summed cost of its episodes (turns, or generated tokens, ``cost``) and ``streak``, how many of its
      most recent groups in a row gave no signal (``zero_signal``).
    * **Learnability.** ``p (1 - p)``, the variance of a task's success, largest for a task solved half
      the time and 0 for one always or never solved, with ``p = (successes + prior/2) / (episodes +
      prior)`` for ``prior = prior_episodes``: an unseen task has ``p = 1/2`` and the largest
      learnability, 1/4 (an optimistic prior, so every task gets tried), and one observation never rules
      a task out.
    * **Score.** Learnability divided by the task's mean cost per episode (costs below 1 count as 1; an
      unseen task costs the mean of every episode observed, 1 before any), times ``stale_factor`` when its
      last ``stale_groups`` groups all gave no signal.
    * **Probabilities.** ``(1 - epsilon) w / sum(w) + epsilon / pool_size`` with ``w = score **
      (1 / temperature)``: the uniform floor ``epsilon / pool_size`` keeps every task in play.
    * **Draw.** ``count`` distinct tasks, one after another, each in proportion to the probabilities of
      the tasks left, from a generator seeded with ``(seed, iteration, round_)``: the draw is a function
      of the run's seed and the groups observed, nothing else.

    Args:
        config: the curriculum's parameters (``rollout.curriculum``).
        seed: the run's seed.
        seed_offset: the first eval seed (``eval.seed_offset``), or the size of a training split: the
            pool stays below it.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> sampler = CurriculumSampler(CurriculumSettings(pool_size=3, cost="none"), seed=0, seed_offset=3)
        >>> sampler.pool.tolist()
        [0, 1, 2]
        >>> def group(seed, successes):
        ...     return EpisodeGroup("g", "t", seed, [Trajectory([Turn([], [], [], float(s), "s")], "t", seed,
        ...                                                     success=s) for s in successes])
        >>> sampler.observe([group(0, [True, True]), group(1, [True, False])])
        >>> [round(float(s), 4) for s in sampler.scores()]   # p = 3/4, 1/2; task 2 unseen: 1/2
        [0.1875, 0.25, 0.25]
    """

    def __init__(self, config: CurriculumSettings, seed: int, seed_offset: int) -> None:
        self.config = config
        self.seed = seed
        # A training split smaller than the pool (env.train_split) is pooled whole.
        size = min(config.pool_size, seed_offset)
        pool_rng = np.random.default_rng([seed, 0x5EED])  # a stream apart from every iteration's draws
        drawn = pool_rng.choice(seed_offset, size=size, replace=False)
        self.pool = np.sort(drawn).astype(np.int64)
        self._index = {int(s): i for i, s in enumerate(self.pool)}
        self.groups = np.zeros(size, dtype=np.int64)
        self.episodes = np.zeros(size)
        self.successes = np.zeros(size)
        self.cost = np.zeros(size)
        self.streak = np.zeros(size, dtype=np.int64)

    def episode_cost(self, trajectory: Trajectory) -> float:
        """One episode's cost: its turns, its generated tokens, or 1 (``config.cost``)."""
        if self.config.cost == "turns":
            return float(len(trajectory.turns))
        if self.config.cost == "tokens":
            return float(sum(len(turn.response_ids) for turn in trajectory.turns))
        return 1.0

    def observe(self, groups: Sequence[EpisodeGroup]) -> None:
        for group in groups:
            i = self._index.get(int(group.seed))
            if i is None:  # not a pool task (collected by other means): it says nothing about the pool
                continue
            self.groups[i] += 1
            self.episodes[i] += len(group.trajectories)
            self.successes[i] += sum(bool(t.success) for t in group.trajectories)
            self.cost[i] += sum(self.episode_cost(t) for t in group.trajectories)
            self.streak[i] = self.streak[i] + 1 if zero_signal(group) else 0

    def scores(self) -> np.ndarray:
        """Each pool task's score (learnability per unit of cost, de-prioritised when stale), shape
        ``(pool_size,)``."""
        prior = self.config.prior_episodes
        p = (self.successes + prior / 2) / (self.episodes + prior)
        learnability = p * (1 - p)
        seen = self.episodes > 0
        unseen_cost = self.cost.sum() / self.episodes.sum() if seen.any() else 1.0
        mean_cost = np.where(seen, self.cost / np.maximum(self.episodes, 1), unseen_cost)
        stale = self.streak >= self.config.stale_groups
        return learnability / np.maximum(mean_cost, 1.0) * np.where(stale, self.config.stale_factor, 1.0)

    def probabilities(self) -> np.ndarray:
        """The probability of each pool task (tempered scores mixed with the uniform floor), shape
        ``(pool_size,)``, summing to 1."""
        weights = self.scores() ** (1.0 / self.config.temperature)
        epsilon = self.config.epsilon
        return (1 - epsilon) * weights / weights.sum() + epsilon / len(weights)

    def sample(self, iteration: int, round_: int, count: int) -> list[int]:
        if count > len(self.pool):
            raise ConfigError(f"the curriculum cannot draw {count} distinct tasks from a pool of "
                              f"{len(self.pool)}; raise rollout.curriculum.pool_size to rollout.num_tasks "
                              f"or more")
        rng = np.random.default_rng([self.seed, iteration, round_])
        chosen = rng.choice(len(self.pool), size=count, replace=False, p=self.probabilities())
        return [int(self.pool[i]) for i in chosen]

    def metrics(self) -> dict[str, float]:
        return {"curriculum/pool_coverage": float((self.groups > 0).mean()),
                "curriculum/mean_score": float(self.scores().mean()),
                "curriculum/stale_tasks": float((self.streak >= self.config.stale_groups).mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.tolist(), **{name: getattr(self, name).tolist() for name in _COUNTERS}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        if list(state["pool"]) != self.pool.tolist():
            raise ConfigError("the checkpoint's curriculum pool is not this run's (seed, eval.seed_offset or "
                              "rollout.curriculum.pool_size differ); resume with the run's own config")
        for name in _COUNTERS:
            current = getattr(self, name)
            setattr(self, name, np.asarray(state[name], dtype=current.dtype))


def _check_curriculum(cfg: Any) -> None:
    pool_size, num_tasks = cfg.rollout.curriculum.pool_size, cfg.rollout.num_tasks
    offset = cfg.eval.seed_offset
    if pool_size < num_tasks:
        raise ConfigError(f"rollout.curriculum.pool_size={pool_size} is below rollout.num_tasks="
                          f"{num_tasks}: an iteration's tasks are distinct pool tasks; raise pool_size")
    if pool_size > offset:
        raise ConfigError(f"rollout.curriculum.pool_size={pool_size} distinct training seeds do not fit "
                          f"below eval.seed_offset={offset}; lower pool_size")


def _curriculum(cfg: Any, train_tasks: int) -> CurriculumSampler:
    if train_tasks < cfg.rollout.num_tasks:
        raise ConfigError(f"env.train_split {cfg.env.train_split!r} has {train_tasks} tasks, fewer than the "
                          f"rollout.num_tasks={cfg.rollout.num_tasks} distinct ones the curriculum draws "
                          f"per iteration; lower rollout.num_tasks or use task_sampler: uniform")
    return CurriculumSampler(cfg.rollout.curriculum, cfg.seed, train_tasks)


register_task_sampler("uniform", lambda cfg, train_tasks: UniformSampler(cfg.seed, train_tasks))
register_task_sampler("curriculum", _curriculum, check=_check_curriculum, settings=CurriculumSettings)


class GroupFeed(RolloutHooks):
    """A rollout hook that keeps every group a collection finished, before the hooks after it (a filter)
    drop any: what the task sampler observes. Put it first in a ``HookChain``.

    Example:
        >>> feed = GroupFeed()
        >>> feed.after_collect(["a", "b"], None), feed.take(), feed.take()
        (['a', 'b'], ['a', 'b'], [])
    """

    def __init__(self) -> None:
        self.groups: list[EpisodeGroup] = []

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        self.groups += groups
        return groups

    def take(self) -> list[EpisodeGroup]:
        """The groups kept since the last ``take``, and forget them."""
        groups, self.groups = self.groups, []
        return groups
