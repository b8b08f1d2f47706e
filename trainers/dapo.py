"""DAPO dynamic sampling (hook option ``dapo``; Yu et al. 2025, "DAPO", §3.2), usable with any algorithm.

A group whose trajectories all got the same outcome has no group-relative signal: under GRPO every
advantage in it is 0, so it only dilutes the batch. (Step-level estimators such as ``gigpo`` and
``hgpo`` can still find signal in such a group, between turns taken from the same state; the filter
drops it all the same.) Dynamic sampling drops such groups after each
collection, and the training loop collects more tasks (up to ``max_extra_rounds`` extra rounds)
until the batch has ``rollout.num_tasks`` groups again. Switch it on with
``algorithm.hooks: {dapo: {max_extra_rounds: 3}}``; DAPO's other ingredient, clip-higher, is
``loss.clip_ratio_high: 0.28``.

Metrics per iteration: ``dapo/kept_groups`` and ``dapo/dropped_groups`` (summed over the iteration's
collection rounds); the loop logs the extra rounds it ran as ``rollout/extra_rounds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import CollectContext, RolloutHooks
from agentgym.rollout.records import EpisodeGroup
from agentgym.training.api import register_hook_option


@dataclass(frozen=True)
class DynamicSamplingArgs:
    """Arguments of the ``dapo`` hook option."""

    max_extra_rounds: int = 3
    """Extra collection rounds per iteration to refill the batch (DAPO allows 10 generation rounds of
    3× the batch; here each round collects ``rollout.num_tasks`` tasks)."""
    criterion: Literal["return", "success"] = "return"
    """What must vary within a group for it to be kept: the trajectories' returns or their success."""
    tolerance: float = 1e-9
    """Returns closer than this count as equal (sums of the same rewards in another order differ by
    rounding)."""
    fill_last_round: bool = True
    """Keep every group of the last allowed round, so the batch is always full (verl-agent does not
    filter its last attempt); false: a batch may come out short, or empty."""

    def __post_init__(self) -> None:
        if isinstance(self.max_extra_rounds, bool) or self.max_extra_rounds < 0:
            raise ConfigError(f"DynamicSamplingArgs.max_extra_rounds must be an integer >= 0, "
                              f"got {self.max_extra_rounds!r}")
        if not self.tolerance >= 0:
            raise ConfigError(f"DynamicSamplingArgs.tolerance must be >= 0, got {self.tolerance}")


def informative(group: EpisodeGroup, criterion: str, tolerance: float) -> bool:
    """Whether the group's outcomes vary (a group of one never does).

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(r): return Trajectory([Turn([], [], [], r, "s")], "t", 0, success=r > 0)
        >>> informative(EpisodeGroup("g", "t", 0, [traj(1.0), traj(0.0)]), "return", 1e-9)
        True
        >>> informative(EpisodeGroup("g", "t", 0, [traj(1.0), traj(1.0)]), "success", 1e-9)
        False
    """
    if criterion == "success":
        outcomes = np.array([float(t.success) for t in group.trajectories])
    else:
        outcomes = np.array([sum(turn.reward for turn in t.turns) for t in group.trajectories])
    return outcomes.size > 1 and float(np.ptp(outcomes)) > tolerance


class DynamicSampling(RolloutHooks):
    """Drops groups with all-equal outcomes; the loop refills the batch with extra rounds.

    Counts are per training iteration: ``begin_iteration`` resets them.

    Example:
        >>> from agentgym.rollout.records import Trajectory, Turn
        >>> def traj(r): return Trajectory([Turn([], [], [], r, "s")], "t", 0)
        >>> groups = [EpisodeGroup("a", "t", 0, [traj(1.0), traj(0.0)]),
        ...           EpisodeGroup("b", "t", 0, [traj(0.0), traj(0.0)])]
        >>> hook = DynamicSampling(DynamicSamplingArgs(max_extra_rounds=1))
        >>> context = CollectContext(tokenizer=None, iteration=1)
        >>> [g.group_id for g in hook.after_collect(groups, context)], hook.metrics()
        (['a'], {'dapo/kept_groups': 1.0, 'dapo/dropped_groups': 1.0})
        >>> len(hook.after_collect(groups, context))   # the last allowed round keeps everything
        2
    """

    def __init__(self, args: DynamicSamplingArgs) -> None:
        self.args = args
        self.max_extra_rounds = args.max_extra_rounds
        self._round = -1  # collection rounds of this iteration so far, minus one
        self._kept = 0
        self._dropped = 0

    def begin_iteration(self, iteration: int, context: CollectContext) -> None:
        self._round, self._kept, self._dropped = -1, 0, 0

    def after_collect(self, groups: list[EpisodeGroup], context: CollectContext) -> list[EpisodeGroup]:
        self._round += 1
        if self.args.fill_last_round and self._round >= self.args.max_extra_rounds:
            kept = list(groups)
        else:
            kept = [g for g in groups if informative(g, self.args.criterion, self.args.tolerance)]
        self._kept += len(kept)
        self._dropped += len(groups) - len(kept)
        return kept

    def metrics(self) -> dict[str, float]:
        return {"dapo/kept_groups": float(self._kept), "dapo/dropped_groups": float(self._dropped)}


register_hook_option("dapo", DynamicSampling, DynamicSamplingArgs,
                     description="DAPO dynamic sampling: drop all-equal groups, refill the batch with extra "
                                 "rounds")
