"""Evaluation statistics: pass@k against its combinatorial definition, the exact tests against
enumeration and hand-computed values, the paired bootstrap's invariants, the verdict wording."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agentgym.errors import ConfigError
from agentgym.eval.statistics import (
    compare_paired,
    mcnemar_exact_p,
    mean_pass_at_k,
    paired_bootstrap_ci,
    pass_at_k,
    pass_at_k_table,
    sign_flip_p,
)
from agentgym.eval.summary import per_task, summarize, wilson_interval
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn


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


def test_mcnemar_exact_matches_the_binomial_tail_by_hand() -> None:
    # 1 vs 9 discordant pairs: 2 * (C(10,0) + C(10,1)) / 2^10 = 22 / 1024
    assert mcnemar_exact_p(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact_p(9, 1) == mcnemar_exact_p(1, 9)
    assert mcnemar_exact_p(5, 5) == 1.0
    assert mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)


def test_sign_flip_exact_equals_brute_force_enumeration() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        d = rng.normal(size=int(rng.integers(1, 9))).round(2)
        observed = abs(d.sum())
        patterns = list(itertools.product((1, -1), repeat=len(d)))
        expected = sum(abs(sum(s * x for s, x in zip(p, d, strict=True))) >= observed - 1e-12
                       for p in patterns) / len(patterns)
        assert sign_flip_p(d) == pytest.approx(expected)


def test_sign_flip_monte_carlo_is_close_to_exact_and_seeded() -> None:
    d = np.r_[np.full(14, 0.5), np.full(6, -0.5)]  # 20 non-zero differences: Monte Carlo
    exact = sum(math.comb(20, i) for i in range(7)) * 2 / 2**20  # |sum| >= 4 ⇔ at most 6 of one sign
    assert sign_flip_p(d, seed=3) == sign_flip_p(d, seed=3)
    assert abs(sign_flip_p(d, seed=3) - exact) < 0.01


def test_paired_bootstrap_interval_invariants() -> None:
    rng = np.random.default_rng(2)
    d = rng.normal(0.3, 1.0, size=40)
    low, high = paired_bootstrap_ci(d, seed=5)
    assert low < d.mean() < high
    assert paired_bootstrap_ci(d, seed=5) == (low, high)  # seeded: reproducible
    neg = paired_bootstrap_ci(-d, seed=5)  # mirrored data, mirrored interval
    assert neg == pytest.approx((-high, -low))
    wide = paired_bootstrap_ci(d[:10], seed=5)
    assert (wide[1] - wide[0]) > (high - low)  # fewer tasks, wider interval
    assert paired_bootstrap_ci(d + 2.0, seed=5) == pytest.approx((low + 2.0, high + 2.0))


def test_comparison_swaps_sign_when_policies_swap() -> None:
    a = [1, 0, 0, 1, 0, 0, 1, 0, 0, 0] * 3
    b = [1, 1, 1, 1, 0, 1, 1, 1, 0, 1] * 3
    ab, ba = compare_paired("e", "a", "b", a, b), compare_paired("e", "b", "a", b, a)
    assert ab.difference == pytest.approx(-ba.difference) == pytest.approx(0.5)
    assert ab.p_value == ba.p_value and ab.significant and ba.significant
    assert (ab.b_better, ab.a_better) == (ba.a_better, ba.b_better) == (15, 0)
    assert "b is better than a" in ab.verdict and "b is better than a" in ba.verdict


def test_not_significant_is_said_plainly_and_exact_test_overrules_a_narrow_bootstrap() -> None:
    # Three tasks, all won by b: the percentile bootstrap interval is [1, 1], but McNemar's exact p
    # for 3 discordant pairs is 0.25, so the verdict must not claim a difference.
    c = compare_paired("maze-v0", "a", "b", [0, 0, 0], [1, 1, 1])
    assert c.ci95 == (1.0, 1.0) and c.p_value == pytest.approx(0.25)
    assert not c.significant
    assert c.verdict.endswith("not significant; these tasks cannot tell them apart.")
    same = compare_paired("maze-v0", "a", "b", [1, 0] * 10, [1, 0] * 10)
    assert same.difference == 0 and same.p_value == 1.0 and not same.significant


def test_comparison_with_several_samples_uses_the_permutation_test() -> None:
    c = compare_paired("e", "a", "b", [0.25, 0.5, 0.0, 0.25] * 5, [0.75, 1.0, 0.5, 0.5] * 5)
    assert c.test == "sign-flip-permutation" and c.significant and c.difference == pytest.approx(0.4375)
    with pytest.raises(ConfigError, match="both must play the same tasks"):
        compare_paired("e", "a", "b", [1], [1, 0])


def test_summary_counts_and_pass_at_k() -> None:
    def trajectory(success: bool, rewards: list[float], invalid: int = 0, tokens: int = 2) -> Trajectory:
        turns = [Turn([1], [5] * tokens, [0.0] * tokens, r, "s", invalid=i < invalid)
                 for i, r in enumerate(rewards)]
        return Trajectory(turns, "t", 0, success=success)

    groups = [EpisodeGroup("g0", "t", 0, [trajectory(True, [0, 1], invalid=1), trajectory(False, [0, 0, 0])]),
              EpisodeGroup("g1", "t", 1, [trajectory(False, [0]), trajectory(False, [-1, 0])])]
    s = summarize(groups)
    assert s["episodes"] == 4 and s["tasks"] == 2 and s["success_rate"] == 0.25
    assert s["success_ci95"] == pytest.approx(list(wilson_interval(1, 4)))
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
