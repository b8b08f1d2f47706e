"""Evaluation summaries: success rate with a 95% interval over tasks, returns, turns, tokens, invalid actions,
pass@k; and the per-task outcomes that let two evaluations on the same tasks be compared task by task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.rollout.records import EpisodeGroup, Turn
from agentgym.rollout.success import count_text, pass_at_k_table, task_success, wilson_interval

__all__ = ["count_text", "counts", "generated_tokens", "interval_text", "per_task", "summarize",
           "task_outcomes", "wilson_interval"]


def task_outcomes(groups: Sequence[EpisodeGroup]) -> list[list[bool]]:
    """Per distinct task (``task_id``, in order of first appearance), the successes of all its episodes,
    whichever groups they are in: two seeds that reset to the same task are one task played twice.

    Example:
        >>> from agentgym.rollout.records import Trajectory
        >>> def group(task, seed, *wins):
        ...     return EpisodeGroup(f"g{seed}", task, seed,
        ...                         [Trajectory([], task, seed, success=w) for w in wins])
        >>> task_outcomes([group("a", 0, True), group("b", 1, False, True), group("a", 2, False)])
        [[True, False], [False, True]]
    """
    by_task: dict[str, list[bool]] = {}
    for group in groups:
        by_task.setdefault(group.task_id, []).extend(bool(t.success) for t in group.trajectories)
    return list(by_task.values())


def counts(summary: dict[str, Any], *, short: bool = False) -> str:
    """A summary's tasks and episodes in exact words (``count_text``): ``32 tasks × 2 episodes``; a
    summary written before tasks were counted gives its episodes alone.

    Example:
        >>> counts({"tasks": 3, "episodes": 6, "episodes_per_task": [2, 2]})
        '3 tasks × 2 episodes'
        >>> counts({"episodes": 64})
        '64 episodes'
    """
    if "episodes_per_task" not in summary:
        return f"{summary['episodes']} episodes"
    return count_text(summary["tasks"], summary["episodes"], summary["episodes_per_task"], short=short)


def interval_text(summary: dict[str, Any]) -> str:
    """A summary's success interval as a table shows it: ``49%–94%``; one task's, [0, 1], says why.

    Example:
        >>> interval_text({"success_ci95": [0.49, 0.943]})
        '49%–94%'
        >>> interval_text({"success_ci95": [0.0, 1.0], "success_ci95_method": "one-task"})
        '0%–100% (one task)'
    """
    low, high = summary["success_ci95"]
    one = summary.get("success_ci95_method") == "one-task"
    return f"{100 * low:.0f}%–{100 * high:.0f}%" + (" (one task)" if one else "")


def generated_tokens(turn: Turn) -> int:
    """Tokens the policy generated for a turn: its response ids, or the count an endpoint reported
    (``extras["completion_tokens"]``) when the ids are not known."""
    counted = turn.extras.get("completion_tokens")
    return int(counted) if counted is not None else len(turn.response_ids)


def summarize(groups: Sequence[EpisodeGroup]) -> dict[str, Any]:
    """Per-episode statistics of a batch of groups (one group per task seed).

    Keys: ``episodes``; ``tasks`` (distinct ``task_id``s: seeds that reset to the same task count once) and
    ``episodes_per_task`` (the fewest and most episodes of a task); ``success_rate`` (share of episodes)
    and ``success_ci95``, its 95% interval over tasks (``agentgym.rollout.success.task_success``: episodes
    of one task are correlated, so they are not counted as independent draws), with
    ``success_ci95_method`` and ``success_effective_episodes``; ``mean_return``, ``mean_turns``,
    ``invalid_rate`` (per turn), ``truncation_rate``, ``mean_response_tokens`` (per turn),
    ``tokens_generated`` (total), ``tool_calls_per_episode``, and ``pass@k`` entries (k = 1, 2, 4, ...,
    K) when every group has K ≥ 2 episodes.

    Changed: ``tasks`` counted groups and ``success_ci95`` was a Wilson interval over episodes, which
    overstated how much several episodes of one task tell.

    Example:
        >>> from agentgym.rollout.records import Trajectory
        >>> win = Trajectory([Turn([1], [2, 3], [0.0, 0.0], 1.0, "s")], "t", 0, success=True)
        >>> lose = Trajectory([Turn([1], [4], [0.0], 0.0, "s")], "t", 0)
        >>> s = summarize([EpisodeGroup("g0", "t", 0, [win, lose])])
        >>> s["success_rate"], s["tokens_generated"], s["pass@2"], counts(s), s["success_ci95"]
        (0.5, 3, 1.0, '1 task × 2 episodes', [0.0, 1.0])
    """
    trajectories = [t for g in groups for t in g.trajectories]
    n = len(trajectories)
    turns = [t for tr in trajectories for t in tr.turns]
    tokens = sum(generated_tokens(t) for t in turns)
    success = task_success(task_outcomes(groups))
    summary: dict[str, Any] = {
        "episodes": n,
        "tasks": success.tasks,
        "episodes_per_task": list(success.episodes_per_task),
        "success_rate": success.rate,
        "success_ci95": list(success.ci95),
        "success_ci95_method": success.method,
        "success_effective_episodes": success.effective_episodes,
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
