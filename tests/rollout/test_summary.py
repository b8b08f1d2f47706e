"""Summaries of episode groups (``agentgym.rollout.summary``) and the success rates they report
(``agentgym.rollout.success``): pass@k against its combinatorial definition, the summary's counts, the
success interval over tasks against hand computation and its relations to the per-episode Wilson
interval."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.rollout.success import mean_pass_at_k, pass_at_k, pass_at_k_table, t_quantile, task_success
from agentgym.rollout.summary import counts, per_task, summarize, wilson_interval

Z95 = 1.959964  # the normal distribution's two-sided 95% critical value


@pytest.mark.parametrize("n, c, k", [(n, c, k) for n in range(1, 7) for c in range(n + 1)
                                     for k in range(1, n + 1)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n: int, c: int, k: int) -> None:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_by_hand_and_its_limits() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 is the success rate
    assert pass_at_k(200, 1, 200) == 1.0 and pass_at_k(200, 0, 50) == 0.0
    assert mean_pass_at_k([[True, False], [False, False], [True, True]], 1) == pytest.approx(0.5)
    assert list(pass_at_k_table([[True] + [False] * 7])) == ["pass@1", "pass@2", "pass@4", "pass@8"]
    with pytest.raises(ConfigError, match="1 <= k <= samples per task"):
        pass_at_k(3, 1, 4)


def test_pass_at_k_never_decreases_with_k() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        c = int(rng.integers(0, n + 1))
        values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


def test_summary_counts_and_pass_at_k() -> None:
    def trajectory(success: bool, rewards: list[float], invalid: int = 0, tokens: int = 2) -> Trajectory:
        turns = [Turn([1], [5] * tokens, [0.0] * tokens, r, "s", invalid=i < invalid)
                 for i, r in enumerate(rewards)]
        return Trajectory(turns, "t", 0, success=success)

    groups = [EpisodeGroup("g0", "t0", 0, [trajectory(True, [0, 1], invalid=1),
                                           trajectory(False, [0, 0, 0])]),
              EpisodeGroup("g1", "t1", 1, [trajectory(False, [0]), trajectory(False, [-1, 0])])]
    s = summarize(groups)
    assert s["episodes"] == 4 and s["tasks"] == 2 and s["success_rate"] == 0.25
    assert s["episodes_per_task"] == [2, 2] and counts(s) == "2 tasks × 2 episodes"
    assert s["success_ci95"] == pytest.approx(list(task_success([[True, False], [False, False]]).ci95))
    assert s["success_ci95_method"] == "wilson-clustered"
    assert s["mean_return"] == pytest.approx(0.0) and s["mean_turns"] == 2.0
    assert s["invalid_rate"] == pytest.approx(1 / 8) and s["tokens_generated"] == 16
    assert s["pass@1"] == 0.25 and s["pass@2"] == 0.5


def test_per_task_outcomes_follow_the_groups_order_and_average_their_episodes() -> None:
    def episode(success: bool, rewards: list[float]) -> Trajectory:
        return Trajectory([Turn([1], [5], [0.0], r, "s") for r in rewards], "t", 0, success=success)

    groups = [EpisodeGroup("g0", "goal-9", 9, [episode(True, [0.0, 1.0])]),
              EpisodeGroup("g1", "goal-2", 2, [episode(False, [0.25]), episode(True, [0.5, 0.5]),
                                               episode(False, [-0.5])])]
    assert per_task(groups) == [{"seed": 9, "task_id": "goal-9", "success": 1.0, "return": 1.0},
                                {"seed": 2, "task_id": "goal-2", "success": pytest.approx(1 / 3),
                                 "return": pytest.approx(0.25)}]
    assert per_task([]) == []


# --- the success interval over tasks ---------------------------------------------------------------


def _wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval written out again, so the tests check the library against the formula."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def test_t_quantiles_match_the_printed_table() -> None:
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 5: 2.5706, 9: 2.2622, 10: 2.2281, 30: 2.0423, 63: 1.9983,
             120: 1.9799, 500: 1.9647}
    for df, value in table.items():
        assert t_quantile(df) == pytest.approx(value, abs=1e-4), df
    assert t_quantile(10**7) == pytest.approx(Z95, abs=1e-6) and t_quantile(0) == math.inf


def test_three_tasks_of_two_episodes_by_hand() -> None:
    s = task_success([[True, True], [False, True], [False, False]])
    assert (s.tasks, s.episodes, s.episodes_per_task, s.rate) == (3, 6, (2, 2), 0.5)
    # V = Σ (s_t − m_t p)² / n² = ((2 − 1)² + (1 − 1)² + (0 − 1)²) / 36 = 1/18; n* = p(1 − p) / V = 4.5.
    # Three tasks leave 2 degrees of freedom: n*_df = 4.5 · (t(5) / t(2))² = 4.5 · (2.570582 / 4.302653)².
    effective = 4.5 * (2.570582 / 4.302653) ** 2
    assert s.effective_episodes == pytest.approx(effective, rel=1e-6) == pytest.approx(1.60622, abs=1e-5)
    # Wilson at p = 1/2 is centred on 1/2: half-width z·sqrt(1/(4n) + z²/(4n²)) / (1 + z²/n).
    half = Z95 * math.sqrt(1 / (4 * effective) + Z95**2 / (4 * effective**2)) / (1 + Z95**2 / effective)
    assert s.ci95 == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    assert s.ci95 == pytest.approx((0.0801, 0.9199), abs=1e-4)
    # Counted as six independent episodes, the same outcomes claim far more: Wilson(3, 6) = 19%–81%.
    naive = wilson_interval(3, 6)
    assert naive == pytest.approx((0.1876, 0.8124), abs=1e-4)
    assert s.ci95[0] < naive[0] and s.ci95[1] > naive[1]


def test_one_episode_per_task_is_exactly_the_wilson_interval() -> None:
    for n in (2, 3, 5, 10, 40):
        for wins in range(n + 1):
            s = task_success([[True]] * wins + [[False]] * (n - wins))
            assert s.effective_episodes == pytest.approx(n) and s.tasks == s.episodes == n
            assert s.ci95 == pytest.approx(wilson_interval(wins, n), abs=1e-9), (wins, n)


def test_identical_outcomes_within_tasks_count_as_one_episode_per_task() -> None:
    # 10 tasks × 4 episodes, each task all-or-nothing: the 40 episodes carry the evidence of 10.
    outcomes = [[True] * 4] * 6 + [[False] * 4] * 4
    s = task_success(outcomes)
    assert s.effective_episodes == pytest.approx(10 * (t_quantile(39) / t_quantile(9)) ** 2)
    assert s.ci95 == pytest.approx(_wilson(0.6, s.effective_episodes))
    naive = wilson_interval(24, 40)
    assert s.ci95[0] < naive[0] and s.ci95[1] > naive[1]  # wider than the per-episode interval
    # The same 10 tasks played once each: Wilson at 10 episodes. Four copies of each outcome add nothing but
    # the few-tasks correction: 9 degrees of freedom against 39, n*_df = 10 · (t(39) / t(9))² ≈ 8.
    once = task_success([[True]] * 6 + [[False]] * 4)
    assert once.ci95 == pytest.approx(wilson_interval(6, 10))
    assert s.ci95[0] < once.ci95[0] and s.ci95[1] > once.ci95[1]
    assert s.effective_episodes == pytest.approx(7.995, abs=1e-3)


def test_all_success_and_all_failure_stay_inside_zero_one_and_are_monotone() -> None:
    for tasks, episodes in ((2, 1), (2, 5), (5, 3), (32, 2)):
        win = task_success([[True] * episodes] * tasks)
        lose = task_success([[False] * episodes] * tasks)
        assert win.rate == 1.0 and win.ci95[1] == 1.0 and 0.0 < win.ci95[0] < 1.0
        assert lose.rate == 0.0 and lose.ci95[0] == 0.0 and 0.0 < lose.ci95[1] < 1.0
        assert win.ci95[0] == pytest.approx(1 - lose.ci95[1])  # symmetric
        # One failure more must not make the interval claim more than all successes did.
        one_failure = task_success([[False] + [True] * (episodes - 1)] + [[True] * episodes] * (tasks - 1))
        assert one_failure.ci95[0] <= win.ci95[0] + 1e-12
    # Two tasks say little, however many episodes each: far wider than 100 independent episodes.
    two = task_success([[True] * 50] * 2)
    assert two.ci95[0] < 0.5 < wilson_interval(100, 100)[0]


def test_one_task_gives_an_interval_that_says_so() -> None:
    s = task_success([[True, False, True, True]])
    assert (s.tasks, s.episodes, s.rate, s.ci95, s.method) == (1, 4, 0.75, (0.0, 1.0), "one-task")
    empty = task_success([])
    assert (empty.tasks, empty.episodes, empty.ci95, empty.method) == (0, 0, (0.0, 1.0), "no-episodes")
