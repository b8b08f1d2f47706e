"""Task samplers: uniform keeps the old seeds, the curriculum scores, draws and resumes as specified, and the
loop logs the share of groups without learning signal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from learning import SMALL

from agentgym.errors import ConfigError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.run_folder import RunFolder
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import Trainer, train
from agentgym.training.run.setup import task_sampler, task_seeds
from agentgym.training.run.task_sampling import (
    CurriculumSampler,
    CurriculumSettings,
    TaskSampler,
    UniformSampler,
    zero_signal,
    zero_signal_share,
)


def episode(seed: int, solved: bool, turns: int = 1) -> Trajectory:
    """An episode of ``turns`` turns whose return is 1 when solved, else 0 (on its last turn)."""
    rewards = [0.0] * (turns - 1) + [1.0 if solved else 0.0]
    return Trajectory([Turn([], [7] * 2, [0.0] * 2, r, "s") for r in rewards], "t", seed, success=solved)


def group(seed: int, outcomes: list[bool], turns: int = 1) -> EpisodeGroup:
    return EpisodeGroup(f"g{seed}", "t", seed, [episode(seed, solved, turns) for solved in outcomes])


def curriculum(seed_offset: int = 3, **fields: Any) -> CurriculumSampler:
    """A curriculum over the whole seed range ``0 .. seed_offset - 1`` (so its pool is known)."""
    config = CurriculumSettings(pool_size=seed_offset, **fields)
    return CurriculumSampler(config, seed=0, seed_offset=seed_offset)


# --- uniform ---------------------------------------------------------------------------------------------


def test_uniform_sampler_gives_the_seeds_task_seeds_always_gave() -> None:
    cfg = load_config(None, ["rollout.num_tasks=4"])
    sampler = task_sampler(cfg)
    assert isinstance(sampler, UniformSampler) and isinstance(sampler, TaskSampler)
    # Numbers of task_seeds before samplers existed (seed 0, eval.seed_offset 1_000_000).
    pinned = {(1, 0): [522157, 889738, 992948, 557138], (1, 1): [674263, 848650, 817611, 254257],
              (7, 0): [796656, 38861, 225531, 777127]}
    for (iteration, round_), seeds in pinned.items():
        assert task_seeds(cfg, iteration, round_) == seeds
        assert sampler.sample(iteration, round_, 4) == seeds
    sampler.observe([group(522157, [True, False])])  # learns nothing
    assert sampler.sample(1, 0, 4) == pinned[(1, 0)]
    assert sampler.state_dict() == {} and sampler.metrics() == {}


# --- zero signal ---------------------------------------------------------------------------------------


def test_zero_signal_is_all_equal_returns_or_a_single_member() -> None:
    assert zero_signal(group(0, [True, True])) and zero_signal(group(0, [False, False, False]))
    assert zero_signal(group(0, [True]))
    assert not zero_signal(group(0, [True, False]))
    assert zero_signal_share([group(0, [True, True]), group(1, [True, False]), group(2, [False, False]),
                              group(3, [False, True])]) == 0.5
    assert zero_signal_share([]) == 0.0


# --- curriculum scores and draws ----------------------------------------------------------------------------


def test_curriculum_scores_by_hand() -> None:
    sampler = curriculum(cost="turns")
    assert sampler.pool.tolist() == [0, 1, 2]
    np.testing.assert_allclose(sampler.scores(), [0.25, 0.25, 0.25])  # unseen: p = 1/2, cost 1
    sampler.observe([group(0, [True, True], turns=1),
                     EpisodeGroup("g1", "t", 1, [episode(1, True, turns=2), episode(1, False, turns=4)])])
    # task 0: p = (2 + 1) / (2 + 2) = 3/4, learnability 3/16, 1 turn per episode
    # task 1: p = (1 + 1) / (2 + 2) = 1/2, learnability 1/4, 3 turns per episode -> 1/12
    # task 2: unseen, learnability 1/4, cost of the mean episode (1 + 1 + 2 + 4) / 4 = 2 -> 1/8
    np.testing.assert_allclose(sampler.scores(), [3 / 16, 1 / 12, 1 / 8])
    # weights over their sum: 9/19, 4/19, 6/19; 90% of that plus the floor 0.1 / 3
    np.testing.assert_allclose(sampler.probabilities(), 0.9 * np.array([9, 4, 6]) / 19 + 0.1 / 3)
    cold = curriculum(cost="turns", temperature=0.5)
    cold.observe([group(0, [True, True], turns=1),
                  EpisodeGroup("g1", "t", 1, [episode(1, True, turns=2), episode(1, False, turns=4)])])
    squared = np.array([81, 16, 36]) / 133  # scores squared (temperature 1/2), over their sum
    np.testing.assert_allclose(cold.probabilities(), 0.9 * squared + 0.1 / 3)
    tokens = curriculum(cost="tokens")  # every turn generates 2 tokens
    tokens.observe([group(0, [True, False], turns=3)])
    np.testing.assert_allclose(tokens.scores()[0], 0.25 / 6)


def test_curriculum_prefers_the_half_solved_task() -> None:
    sampler = curriculum(cost="none", epsilon=0.1)
    for _ in range(4):
        sampler.observe([group(0, [True] * 4), group(1, [False] * 4), group(2, [True, False, True, False])])
    # always / never solved: p = 17/18 and 1/18, learnability 17/324, stale after 3 signal-less groups (x0.1)
    np.testing.assert_allclose(sampler.scores(), [17 / 3240, 17 / 3240, 0.25])
    probabilities = sampler.probabilities()
    # scores in 3240ths: 17, 17, 810
    np.testing.assert_allclose(probabilities, 0.9 * np.array([17, 17, 810]) / 844 + 0.1 / 3)
    drawn = [sampler.sample(iteration, 0, 1)[0] for iteration in range(1, 201)]
    assert drawn.count(2) > 150 and drawn.count(0) + drawn.count(1) > 0  # the floor still tries the others
    metrics = sampler.metrics()
    assert metrics["curriculum/pool_coverage"] == 1.0
    assert metrics["curriculum/stale_tasks"] == pytest.approx(2 / 3)
    assert metrics["curriculum/mean_score"] == pytest.approx((2 * 17 / 3240 + 0.25) / 3)


def test_cost_divides_the_score() -> None:
    sampler = curriculum(cost="turns", epsilon=0.0)
    sampler.observe([group(0, [True, False], turns=10), group(1, [True, False], turns=1)])
    scores = sampler.scores()
    assert scores[1] == pytest.approx(10 * scores[0])
    assert sampler.probabilities()[1] > sampler.probabilities()[0]


def test_signal_after_a_stale_streak_lifts_the_de_prioritising() -> None:
    sampler = curriculum(cost="none", stale_groups=2, stale_factor=0.5)
    sampler.observe([group(0, [True, True])])
    sampler.observe([group(0, [True, True])])
    p = 5 / 6  # (4 + 1) / (4 + 2)
    assert sampler.scores()[0] == pytest.approx(0.5 * p * (1 - p))
    sampler.observe([group(0, [True, False])])
    p = 6 / 8
    assert sampler.scores()[0] == pytest.approx(p * (1 - p))


def test_the_epsilon_floor_keeps_every_task_in_play() -> None:
    sampler = curriculum(seed_offset=10, cost="none", epsilon=0.2, temperature=0.05, stale_factor=0.01)
    sampler.observe([group(s, [True] * 8) for s in range(9)] * 3 + [group(9, [True, False] * 4)])
    probabilities = sampler.probabilities()
    assert probabilities.sum() == pytest.approx(1.0)
    assert probabilities.min() >= 0.2 / 10 - 1e-12  # every task keeps epsilon / pool_size
    assert probabilities[9] == pytest.approx(0.8 + 0.02, abs=1e-6)  # the rest goes to the best task
    uniform = curriculum(seed_offset=10, cost="none", epsilon=1.0)
    uniform.observe([group(0, [True, False])])
    np.testing.assert_allclose(uniform.probabilities(), np.full(10, 0.1))


def test_curriculum_draws_are_distinct_pool_tasks_and_deterministic() -> None:
    config = CurriculumSettings(pool_size=16)
    a = CurriculumSampler(config, seed=5, seed_offset=1000)
    b = CurriculumSampler(config, seed=5, seed_offset=1000)
    assert a.pool.tolist() == b.pool.tolist() and len(set(a.pool.tolist())) == 16
    assert all(0 <= s < 1000 for s in a.pool.tolist())
    observed = [group(int(s), [True, False, bool(i % 2)]) for i, s in enumerate(a.pool[:6])]
    a.observe(observed)
    b.observe(observed)
    for iteration in range(1, 6):
        seeds = a.sample(iteration, 0, 8)
        assert seeds == b.sample(iteration, 0, 8)
        assert len(set(seeds)) == 8 and set(seeds) <= set(a.pool.tolist())
    assert a.sample(1, 0, 8) != a.sample(1, 1, 8)  # another round, another draw
    other = CurriculumSampler(config, seed=6, seed_offset=1000)
    assert other.pool.tolist() != a.pool.tolist()
    with pytest.raises(ConfigError, match="pool of 16"):
        a.sample(1, 0, 17)


def test_curriculum_state_round_trips_through_plain_data() -> None:
    a = curriculum(seed_offset=8, cost="turns")
    a.observe([group(0, [True, False], turns=2), group(3, [True, True]), group(3, [True, True]),
               group(5, [False, False, False], turns=4)])
    state = json.loads(json.dumps(a.state_dict()))  # plain data
    b = curriculum(seed_offset=8, cost="turns")
    assert b.sample(4, 0, 3) != a.sample(4, 0, 3) or not np.allclose(b.scores(), a.scores())
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.scores(), a.scores())
    assert b.sample(4, 0, 3) == a.sample(4, 0, 3) and b.metrics() == a.metrics()
    b.load_state_dict({})  # a checkpoint from before samplers had state: nothing to reinstate
    np.testing.assert_array_equal(b.scores(), a.scores())
    with pytest.raises(ConfigError, match="curriculum pool is not this run's"):
        curriculum(seed_offset=9).load_state_dict(state)


# --- configuration ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.task_sampler=curiculum", "rollout.task_sampler 'curiculum' is not a registered task sampler. "
                                       "Did you mean 'curriculum'?"),
    ("rollout.curriculum.epsilon=1.5", "rollout.curriculum.epsilon must be in [0, 1], got 1.5"),
    ("rollout.curriculum.temperature=0", "rollout.curriculum.temperature must be a positive number"),
    ("rollout.curriculum.pool_size=0", "rollout.curriculum.pool_size must be a positive integer"),
    ("rollout.curriculum.prior_episodes=-1", "rollout.curriculum.prior_episodes must be a positive number"),
    ("rollout.curriculum.stale_groups=0", "rollout.curriculum.stale_groups must be a positive integer"),
    ("rollout.curriculum.stale_factor=0", "rollout.curriculum.stale_factor must be in (0, 1]"),
    ("rollout.curriculum.cost=seconds", "rollout.curriculum.cost must be one of"),
    ("rollout.curriculum.pool_size=4", "rollout.curriculum.pool_size=4 is below rollout.num_tasks=8"),
])
def test_bad_sampler_settings_are_one_line_errors(override: str, message: str) -> None:
    overrides = [override] if "task_sampler" in override else ["rollout.task_sampler=curriculum", override]
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_pool_larger_than_the_training_seed_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="do not fit below eval.seed_offset=5"):
        load_config(None, ["rollout.task_sampler=curriculum", "rollout.num_tasks=2", "eval.seed_offset=5",
                           "rollout.curriculum.pool_size=6"])


# --- in the training loop -------------------------------------------------------------------------------


def test_the_loop_logs_the_zero_signal_share_of_the_groups_collected(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "sft.enabled=false", "rollout.num_tasks=4"])
    run = Trainer(cfg, tmp_path)
    try:
        groups, _, metrics = run.collect(1)
    finally:
        run.close()
    assert [g.seed for g in groups] == task_seeds(cfg, 1)
    by_hand = sum(len({t.episode_return for t in g.trajectories}) == 1 for g in groups) / len(groups)
    assert metrics["rollout/zero_signal_groups"] == by_hand


def test_the_sampler_sees_the_groups_a_filter_drops(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "sft.enabled=false", "rollout.num_tasks=4",
                             "rollout.task_sampler=curriculum", "rollout.curriculum.pool_size=12",
                             "algorithm.hooks={dapo: {max_extra_rounds: 1, fill_last_round: false}}"])
    run = Trainer(cfg, tmp_path)
    try:
        _, _, metrics = run.collect(1)
        observed = int(run.task_sampler.groups.sum())
    finally:
        run.close()
    collected = metrics["dapo/kept_groups"] + metrics["dapo/dropped_groups"]
    assert observed == collected == 4 * (1 + metrics["rollout/extra_rounds"])
    assert metrics["rollout/zero_signal_groups"] == metrics["dapo/dropped_groups"] / collected
    assert metrics["curriculum/pool_coverage"] > 0


def test_a_resumed_curriculum_run_samples_what_the_uninterrupted_run_did(tmp_path: Path) -> None:
    overrides = [*SMALL, "iterations=3", "rollout.task_sampler=curriculum", "rollout.curriculum.pool_size=5",
                 "eval.num_episodes=2"]
    full = train(load_config(None, overrides), tmp_path / "full")
    train(load_config(None, overrides), tmp_path / "split", stop_after=2)
    saved = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)["plugins"]["task_sampler"]
    assert sum(saved["groups"]) == 2 * 2  # two iterations of two tasks observed before the stop
    resumed = train(load_config(None, overrides), tmp_path / "split", resume=True)

    def strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]

    assert strip(resumed["history"]) == strip(full["history"])
    assert all("rollout/zero_signal_groups" in m and "curriculum/mean_score" in m for m in full["history"])

    def seeds(run: Path, iteration: int) -> list[int]:
        lines = RunFolder(run).trajectory_file(iteration).read_text().splitlines()
        return [json.loads(line)["seed"] for line in lines]

    sampler = CurriculumSampler(CurriculumSettings(pool_size=5), seed=0, seed_offset=1_000_000)
    pool = set(sampler.pool.tolist())
    for iteration in (1, 2, 3):
        assert seeds(tmp_path / "split", iteration) == seeds(tmp_path / "full", iteration)
        assert set(seeds(tmp_path / "full", iteration)) <= pool
