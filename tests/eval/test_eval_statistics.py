"""Evaluation statistics: pass@k against its combinatorial definition, the exact tests against
enumeration and hand-computed values, the paired bootstrap's invariants, the verdict wording; the success
interval over tasks against hand computation and its relations to the per-episode Wilson interval, and the
exact task and episode counts in the eval and training tables."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.errors import ConfigError
from agentgym.eval.report import markdown_report, results_table
from agentgym.eval.statistics import (
    compare_paired,
    mcnemar_exact_p,
    paired_bootstrap_ci,
    scores_by_task,
    sign_flip_p,
)
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.rollout.success import mean_pass_at_k, pass_at_k, pass_at_k_table, t_quantile, task_success
from agentgym.rollout.summary import counts, per_task, summarize, task_outcomes, wilson_interval

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


def _episode(task: str, seed: int, success: bool) -> Trajectory:
    return Trajectory([Turn([1], [5], [0.0], float(success), "s")], task, seed, success=success)


def test_seeds_that_reset_to_the_same_task_are_one_task() -> None:
    # Seeds 0 and 2 reset to task "a" (an env with a finite task set), seed 1 to "b"; two episodes each.
    groups = [EpisodeGroup(f"g{seed}", task, seed, [_episode(task, seed, win), _episode(task, seed, win)])
              for seed, task, win in ((0, "a", True), (1, "b", False), (2, "a", True))]
    assert task_outcomes(groups) == [[True] * 4, [False] * 2]
    s = summarize(groups)
    assert (s["tasks"], s["episodes"], s["episodes_per_task"]) == (2, 6, [2, 4])
    assert counts(s) == "2 tasks × 2–4 episodes = 6 episodes" and counts(s, short=True) == "2 × 2–4 = 6"
    assert s["success_ci95"] == pytest.approx(list(task_success([[True] * 4, [False] * 2]).ci95))
    assert scores_by_task(["a", "b", "a"], [1.0, 0.0, 1.0]) == {"a": 1.0, "b": 0.0}
    with pytest.raises(ConfigError, match="2 task ids for 3 scores"):
        scores_by_task(["a", "b"], [1.0, 0.0, 1.0])


def _results(rows: list[dict[str, Any]], seeds: list[int], samples: int) -> dict[str, Any]:
    return {"agentgym_version": "0", "created": "now", "command": None, "seeds": seeds, "comparisons": [],
            "config": {"samples": samples, "temperature": 0.0, "sampling_seed": 0,
                       "envs": [{"id": "maze-v0"}],
                       "policies": [{"name": r["policy"], "text": r["policy"]} for r in rows]},
            "results": rows}


def _row(policy: str, groups: list[EpisodeGroup]) -> dict[str, Any]:
    return {"env": "maze-v0", "policy": policy, **summarize(groups), "complete": True, "wall_s": 1.0}


def test_report_table_and_markdown_show_tasks_times_episodes() -> None:
    # 32 tasks × 2 episodes: the count the table shows is 32 × 2, not 64 tasks.
    groups = [EpisodeGroup(f"g{i}", f"maze/{i}", i, [_episode(f"maze/{i}", i, i % 2 == 0)] * 2)
              for i in range(32)]
    one = [EpisodeGroup("g0", "maze/0", 0, [_episode("maze/0", 0, True), _episode("maze/0", 0, False)])]
    results = _results([_row("a", groups), _row("b", one)], list(range(32)), 2)
    table = results_table(results)
    assert table[0][2:5] == ["tasks × episodes", "success", "95% CI"]
    assert table[1][2:4] == ["32 × 2", "50%"] and table[2][2] == "1 × 2"
    low, high = results["results"][0]["success_ci95"]
    assert table[1][4] == f"{100 * low:.0f}%–{100 * high:.0f}%"
    assert table[2][4] == "0%–100% (one task)"
    md = markdown_report(results)
    assert "| maze-v0 | a | 32 × 2 | 50% |" in md
    assert "Per env, every policy plays the same 32 seeds, 2 episodes each (seeds 0..31)" in md
    assert "Tasks × episodes: distinct tasks" in md and "95% interval over tasks" in md
    assert "unseen tasks" not in md and "64 tasks" not in md


def test_training_held_out_table_counts_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from agentgym.cli import training
    from agentgym.run_folder import RunFolder

    groups = [EpisodeGroup(f"g{i}", f"task/{i % 32}", i, [_episode(f"task/{i % 32}", i, i < 40)])
              for i in range(64)]  # 64 held-out seeds over 32 tasks: each task played twice
    evals = {"before": summarize(groups[:32]), "after": summarize(groups)}
    recorder = Console(record=True, width=200)
    monkeypatch.setattr(training, "console", recorder)
    training._print_report({"eval": evals, "algorithm": "grpo", "wall_time_s": 60.0},
                           RunFolder("runs/x"))
    text = recorder.export_text()
    assert "held-out evaluation (32 tasks × 2 episodes, greedy)" in text, text
    low, high = evals["after"]["success_ci95"]
    assert f"{100 * low:.0f}%–{100 * high:.0f}%" in text and "unseen" not in text


def test_eval_command_counts_distinct_tasks_in_its_table_report_and_results(tmp_path: Path) -> None:
    # code-tests-v0 draws one of its 36 problems per seed, so among 37 seeds two reset to the same task.
    env, first = agentgym.make("code-tests-v0"), {}
    try:
        for seed in range(37):
            task = env.reset(seed=seed)[1]["task_id"]
            if task in first:
                repeat = (first[task], seed)
                break
            first[task] = seed
    finally:
        env.close()
    other = next(s for s in first.values() if s != repeat[0])
    seeds = sorted([*repeat, other])  # three seeds, two tasks: one played 4 times, one twice
    out = tmp_path / "e"
    result = CliRunner().invoke(app, ["eval", "--policy", "expert", "--envs", "code-tests-v0", "--samples",
                                      "2", "--seeds", ",".join(map(str, seeds)), "--out", str(out)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "evaluation (per env: 3 seeds, 2 episodes each)" in result.output
    assert "tasks × episodes" in result.output and "2 × 2–4 = 6" in result.output, result.output
    row = json.loads((out / "results.json").read_text())["results"][0]
    assert (row["tasks"], row["episodes"], row["episodes_per_task"]) == (2, 6, [2, 4])
    assert row["success_ci95_method"] == "wilson-clustered"
    assert row["success_ci95"] == pytest.approx(list(task_success([[True] * 4, [True] * 2]).ci95))
    assert "| code-tests-v0 | expert | 2 × 2–4 = 6 | 100% |" in (out / "report.md").read_text()
