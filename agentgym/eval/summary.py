"""Evaluation summaries: success rate with a Wilson 95% interval, returns, turns, invalid actions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentgym.rollout.records import EpisodeGroup


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


def summarize(groups: Sequence[EpisodeGroup]) -> dict[str, Any]:
    """Per-episode statistics of a batch: success rate (+ 95% CI), return, turns, invalid rate, tokens, tool calls."""
    trajectories = [t for g in groups for t in g.trajectories]
    n = len(trajectories)
    successes = sum(t.success for t in trajectories)
    turns = [t for tr in trajectories for t in tr.turns]
    low, high = wilson_interval(successes, n)
    return {
        "episodes": n,
        "success_rate": successes / n if n else 0.0,
        "success_ci95": [low, high],
        "mean_return": sum(t.episode_return for t in trajectories) / n if n else 0.0,
        "mean_turns": len(turns) / n if n else 0.0,
        "invalid_rate": sum(t.invalid for t in turns) / len(turns) if turns else 0.0,
        "truncation_rate": sum(t.truncated for t in trajectories) / n if n else 0.0,
        "mean_response_tokens": sum(len(t.response_ids) for t in turns) / len(turns) if turns else 0.0,
        "tool_calls_per_episode": sum(t.tool_calls for t in turns) / n if n else 0.0,
    }
