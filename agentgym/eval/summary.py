"""Evaluation summaries: success rate with a Wilson 95% interval, returns, turns, tokens, invalid actions,
pass@k; and the per-task outcomes that let two evaluations on the same tasks be compared task by task."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentgym.eval.statistics import pass_at_k_table
from agentgym.rollout.records import EpisodeGroup, Turn


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion.

    Example:
        >>> [round(x, 3) for x in wilson_interval(8, 10)]
        [0.49, 0.943]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def generated_tokens(turn: Turn) -> int:
    """Tokens the policy generated for a turn: its response ids, or the count an endpoint reported
    (``extras["completion_tokens"]``) when the ids are not known."""
    counted = turn.extras.get("completion_tokens")
    return int(counted) if counted is not None else len(turn.response_ids)


def summarize(groups: Sequence[EpisodeGroup]) -> dict[str, Any]:
    """Per-episode statistics of a batch of groups (one group per task).

    Keys: ``episodes``, ``tasks``, ``success_rate`` and ``success_ci95`` (Wilson), ``mean_return``,
    ``mean_turns``, ``invalid_rate`` (per turn), ``truncation_rate``, ``mean_response_tokens`` (per
    turn), ``tokens_generated`` (total), ``tool_calls_per_episode``, and ``pass@k`` entries (k = 1, 2,
    4, ..., K) when every task has K ≥ 2 episodes.

    Example:
        >>> from agentgym.rollout.records import Trajectory
        >>> win = Trajectory([Turn([1], [2, 3], [0.0, 0.0], 1.0, "s")], "t", 0, success=True)
        >>> lose = Trajectory([Turn([1], [4], [0.0], 0.0, "s")], "t", 0)
        >>> s = summarize([EpisodeGroup("g0", "t", 0, [win, lose])])
        >>> s["success_rate"], s["tokens_generated"], s["pass@2"]
        (0.5, 3, 1.0)
    """
    trajectories = [t for g in groups for t in g.trajectories]
    n = len(trajectories)
    successes = sum(t.success for t in trajectories)
    turns = [t for tr in trajectories for t in tr.turns]
    tokens = sum(generated_tokens(t) for t in turns)
    low, high = wilson_interval(successes, n)
    summary: dict[str, Any] = {
        "episodes": n,
        "tasks": len(groups),
        "success_rate": successes / n if n else 0.0,
        "success_ci95": [low, high],
        "mean_return": sum(t.episode_return for t in trajectories) / n if n else 0.0,
        "mean_turns": len(turns) / n if n else 0.0,
        "invalid_rate": sum(t.invalid for t in turns) / len(turns) if turns else 0.0,
        "truncation_rate": sum(t.truncated for t in trajectories) / n if n else 0.0,
        "mean_response_tokens": tokens / len(turns) if turns else 0.0,
        "tokens_generated": tokens,
        "tool_calls_per_episode": sum(t.tool_calls for t in turns) / n if n else 0.0,
    }
    outcomes = [[t.success for t in g.trajectories] for g in groups]
    if outcomes and min(len(o) for o in outcomes) >= 2:
        summary.update(pass_at_k_table(outcomes))
    return summary


def per_task(groups: Sequence[EpisodeGroup]) -> list[dict[str, Any]]:
    """Per group (one task), in the groups' order: its ``seed``, ``task_id``, ``success`` (the share of its
    episodes that succeeded: 0 or 1 with one episode) and mean ``return``. Two evaluations that played the
    same seeds are compared on these, task by task (``agentgym.eval.statistics.compare_paired``): more
    sensitive than comparing their two success rates when the same tasks are hard for both.

    Example:
        >>> from agentgym.rollout.records import Trajectory
        >>> win = Trajectory([Turn([1], [2], [0.0], 1.0, "s")], "t", 7, success=True)
        >>> lose = Trajectory([Turn([1], [4], [0.0], 0.0, "s")], "t", 7)
        >>> per_task([EpisodeGroup("g0", "t", 7, [win, lose])])
        [{'seed': 7, 'task_id': 't', 'success': 0.5, 'return': 0.5}]
    """
    rows = []
    for group in groups:
        n = len(group.trajectories)
        rows.append({"seed": group.seed, "task_id": group.task_id,
                     "success": sum(t.success for t in group.trajectories) / n if n else 0.0,
                     "return": sum(t.episode_return for t in group.trajectories) / n if n else 0.0})
    return rows
