"""Evaluation statistics: the exact tests against enumeration and hand-computed values, the paired
bootstrap's invariants, the verdict wording, and the exact task and episode counts in the eval and training
tables. (pass@k, the summaries and the success interval over tasks: tests/rollout/test_summary.py.)"""

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
from agentgym.rollout.success import task_success
from agentgym.rollout.summary import counts, summarize, task_outcomes


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
