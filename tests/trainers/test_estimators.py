"""Advantage estimators: hand-computed groups, invariants, loop-vs-vectorised equivalence."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from agentgym.errors import ConfigError, RegistryError
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.training.api.algorithm import get_algorithm, list_algorithms
from agentgym.training.api.turn_table import Batch, TurnTable, discounted_returns


def traj(steps: list[tuple[str, float] | tuple[str, float, bool]]) -> Trajectory:
    turns = [Turn([0], [1], [-0.1], s[1], s[0], invalid=bool(s[2]) if len(s) > 2 else False) for s in steps]
    return Trajectory(turns, "task", 0)


def group(*trajectories: Trajectory, gid: str = "g") -> EpisodeGroup:
    return EpisodeGroup(gid, "task", 0, list(trajectories))


def gigpo(groups: list[EpisodeGroup], **args: object) -> np.ndarray:
    algo = get_algorithm("gigpo")
    return algo.estimator(groups, algo.make_args(args))


# --- GiGPO on hand-computed groups ------------------------------------------------------------

def test_gigpo_repeated_states_across_trajectories_mean_norm() -> None:
    # Three trajectories from A. Rewards only at the end. γ = 0.5.
    t1 = traj([("A", 0.0), ("B", 1.0)])               # R=1, G=[0.5, 1]
    t2 = traj([("A", 0.0), ("C", 0.0), ("B", 1.0)])   # R=1, G=[0.25, 0.5, 1]
    t3 = traj([("A", 0.0), ("C", 0.0)])               # R=0, G=[0, 0]
    adv = gigpo([group(t1, t2, t3)], gamma=0.5, invalid_action_penalty=0.0)
    # Episode: mean R = 2/3 → A^E = [1/3, 1/3, -2/3].
    # State A: G = [0.5, 0.25, 0] mean 0.25 → [0.25, 0, -0.25]
    # State B: G = [1, 1] mean 1 → [0, 0]; State C: G = [0.5, 0] mean 0.25 → [0.25, -0.25]
    expected = [1/3 + 0.25, 1/3 + 0.0,
                1/3 + 0.0, 1/3 + 0.25, 1/3 + 0.0,
                -2/3 - 0.25, -2/3 - 0.25]
    np.testing.assert_allclose(adv, expected, atol=1e-12)


def test_gigpo_mean_std_norm_uses_unbiased_std() -> None:
    t1 = traj([("A", 1.0)])
    t2 = traj([("A", 0.0)])
    adv = gigpo([group(t1, t2)], gamma=1.0, mode="mean_std_norm", invalid_action_penalty=0.0)
    std = math.sqrt(0.5)  # values 1, 0: unbiased std = sqrt(((.5)^2 + (.5)^2) / 1)
    episode = np.array([0.5, -0.5]) / (std + 1e-6)
    np.testing.assert_allclose(adv, 2 * episode, atol=1e-9)  # the step group {A} is identical here


def test_gigpo_singleton_states_get_no_step_advantage() -> None:
    t1 = traj([("A", 0.0), ("X", 1.0)])
    t2 = traj([("A", 0.0), ("Y", 0.0)])
    adv = gigpo([group(t1, t2)], gamma=1.0, invalid_action_penalty=0.0, step_advantage_weight=10.0)
    # X and Y are singletons: only the episode part (±0.5) remains on the second turns.
    np.testing.assert_allclose(adv[[1, 3]], [0.5, -0.5])
    np.testing.assert_allclose(adv[[0, 2]], [0.5 + 10 * 0.5, -0.5 - 10 * 0.5])


def test_gigpo_all_equal_returns_give_zero() -> None:
    t1 = traj([("A", 0.0), ("B", 1.0)])
    t2 = traj([("A", 0.0), ("B", 1.0)])
    for mode in ("mean_norm", "mean_std_norm"):
        np.testing.assert_allclose(gigpo([group(t1, t2)], mode=mode, invalid_action_penalty=0.0), 0.0,
                                   atol=1e-12)


def test_gigpo_invalid_action_penalty_hits_only_the_offending_turn() -> None:
    t1 = traj([("A", 0.0, True), ("A", 1.0)])   # bumped a wall, then solved: R = 1
    t2 = traj([("A", 1.0)])                    # solved at once: R = 1
    adv = gigpo([group(t1, t2)], gamma=1.0, invalid_action_penalty=0.1)
    # Episode: equal returns → centred 0, minus 0.1 on the invalid turn: [-0.1, 0, 0]
    # State A: G = [1 - 0.1, 1, 1] mean 0.9667 → [-0.0667, 0.0333, 0.0333]
    mean_a = (0.9 + 1 + 1) / 3
    np.testing.assert_allclose(adv, [-0.1 + 0.9 - mean_a, 1 - mean_a, 1 - mean_a], atol=1e-12)


@pytest.mark.parametrize("name", ["grpo", "gigpo"])
def test_invalid_penalty_stays_bounded_when_returns_are_all_equal(name: str) -> None:
    # Regression: with std normalisation, an all-zero-return group has σ = 0; the penalty must not
    # be divided by it (that gave -0.1 / 1e-6 = -1e5 and collapsed GRPO training).
    t1 = traj([("A", 0.0, True), ("B", 0.0)])
    t2 = traj([("A", 0.0), ("C", 0.0)])
    algo = get_algorithm(name)
    args = {"invalid_action_penalty": 0.1, ("normalize_std" if name == "grpo" else "mode"):
            (True if name == "grpo" else "mean_std_norm")}
    adv = algo.estimator([group(t1, t2)], algo.make_args(args))
    assert np.abs(adv).max() <= 1.0
    assert adv[0] == pytest.approx(-0.1 if name == "grpo" else adv[0]) and adv[0] < 0


def test_gigpo_turn_weighted_baseline_differs_from_trajectory_baseline() -> None:
    t1 = traj([("A", 0.0), ("B", 0.0), ("C", 0.0)])  # long failure, R = 0
    t2 = traj([("A", 1.0)])                         # short success, R = 1
    traj_adv = gigpo([group(t1, t2)], step_advantage_weight=0.0, invalid_action_penalty=0.0)
    turn_adv = gigpo([group(t1, t2)], step_advantage_weight=0.0, invalid_action_penalty=0.0,
                     episode_baseline="turn")
    np.testing.assert_allclose(traj_adv, [-0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(turn_adv, [-0.25, -0.25, -0.25, 0.75])  # mean over 4 turns = 0.25


def test_states_are_never_shared_across_groups() -> None:
    g1 = group(traj([("A", 1.0)]), traj([("B", 0.0)]), gid="g1")
    g2 = group(traj([("A", 0.0)]), traj([("B", 1.0)]), gid="g2")
    adv = gigpo([g1, g2], gamma=1.0, invalid_action_penalty=0.0)
    # Every state is a singleton within its group: only the episode part remains.
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5])


def test_single_trajectory_group_has_no_baseline() -> None:
    for name in ("grpo", "rloo", "gigpo"):
        algo = get_algorithm(name)
        adv = algo.estimator([group(traj([("A", 1.0), ("B", 1.0)]))], algo.make_args({}))
        np.testing.assert_allclose(adv, 0.0)


# --- GRPO / RLOO --------------------------------------------------------------------------------

def test_grpo_hand_computed_and_dr_grpo() -> None:
    g = group(traj([("A", 1.0)]), traj([("A", 0.0), ("B", 0.0)]), traj([("A", 0.0)]))
    algo = get_algorithm("grpo")
    std = np.std([1.0, 0.0, 0.0], ddof=1)
    np.testing.assert_allclose(algo.estimator([g], algo.make_args({})),
                               np.array([2/3, -1/3, -1/3, -1/3]) / (std + 1e-6))
    np.testing.assert_allclose(algo.estimator([g], algo.make_args({"normalize_std": False})),
                               [2/3, -1/3, -1/3, -1/3])


def test_rloo_equals_leave_one_out_mean() -> None:
    rewards = [3.0, 1.0, 0.0, 2.0]
    g = group(*[traj([("A", r)]) for r in rewards])
    algo = get_algorithm("rloo")
    expected = [r - (sum(rewards) - r) / 3 for r in rewards]
    np.testing.assert_allclose(algo.estimator([g], algo.make_args({})), expected)


# --- invariants ---------------------------------------------------------------------------------

def random_groups(rng: np.random.Generator, num_groups: int = 5) -> list[EpisodeGroup]:
    groups = []
    for gi in range(num_groups):
        trajectories = []
        for _ in range(int(rng.integers(1, 6))):
            length = int(rng.integers(1, 8))
            steps = [(f"s{int(rng.integers(0, 4))}", float(rng.choice([0.0, 0.0, 1.0, -0.5])),
                      bool(rng.random() < 0.2))
                     for _ in range(length)]
            trajectories.append(traj(steps))
        groups.append(group(*trajectories, gid=f"g{gi}"))
    return groups


@pytest.mark.parametrize("seed", range(5))
def test_grpo_advantages_are_zero_mean_per_group_and_scale_invariant(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = random_groups(rng)
    algo = get_algorithm("grpo")
    adv = algo.estimator(groups, algo.make_args({}))
    table = TurnTable.from_groups(groups)
    first_turn = table.step == 0  # one row per trajectory
    for g in range(len(groups)):
        np.testing.assert_allclose(adv[first_turn & (table.group == g)].sum(), 0.0, atol=1e-9)
    scaled = [EpisodeGroup(g.group_id, g.task_id, g.seed, [Trajectory(
        [Turn(t.prompt_ids, t.response_ids, t.response_logprobs, 7.0 * t.reward, t.state_key, t.invalid)
         for t in tr.turns], tr.task_id, tr.seed) for tr in g.trajectories]) for g in groups]
    np.testing.assert_allclose(algo.estimator(scaled, algo.make_args({"epsilon": 0.0})),
                               algo.estimator(groups, algo.make_args({"epsilon": 0.0})), atol=1e-9)


def gigpo_reference(groups: list[EpisodeGroup], gamma: float, mode: str, weight: float, penalty: float,
                    eps: float, baseline: str) -> list[float]:
    """Plain-Python GiGPO, written straight from the paper's equations, one turn at a time."""
    out: list[float] = []
    for g in groups:
        returns = [sum(t.reward for t in tr.turns) for tr in g.trajectories]
        scores = [[returns[i] - penalty * t.invalid for t in tr.turns] for i, tr in enumerate(g.trajectories)]
        pool = returns if baseline == "trajectory" else [s for row in scores for s in row]
        mu = sum(pool) / len(pool)
        sd = math.sqrt(sum((x - mu) ** 2 for x in pool) / max(len(pool) - 1, 1))
        step_values: dict[str, list[float]] = defaultdict(list)
        discounted = []
        for tr in g.trajectories:
            running, row = 0.0, []
            for t in reversed(tr.turns):
                running = t.reward + gamma * running
                row.append(running)
            row = [v - penalty * t.invalid for v, t in zip(reversed(row), tr.turns, strict=True)]
            discounted.append(row)
            for v, t in zip(row, tr.turns, strict=True):
                step_values[t.state_key].append(v)
        for i, tr in enumerate(g.trajectories):
            for j, t in enumerate(tr.turns):
                a_e = 0.0
                if len(g.trajectories) > 1 and baseline == "trajectory":
                    centred = returns[i] - mu
                    a_e = (centred if mode == "mean_norm"
                           else (centred / (sd + eps) if sd + eps > 0 else 0.0))
                    a_e -= penalty * tr.turns[j].invalid
                elif len(g.trajectories) > 1:
                    a_e = scores[i][j] - mu if mode == "mean_norm" else (scores[i][j] - mu) / (sd + eps)
                vals = step_values[t.state_key]
                a_s = 0.0
                if len(vals) > 1:
                    m = sum(vals) / len(vals)
                    s = math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1))
                    a_s = discounted[i][j] - m if mode == "mean_norm" else (discounted[i][j] - m) / (s + eps)
                out.append(a_e + weight * a_s)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("baseline", ["trajectory", "turn"])
def test_gigpo_vectorised_equals_loop_reference(seed: int, mode: str, baseline: str) -> None:
    rng = np.random.default_rng(seed)
    groups = random_groups(rng, num_groups=int(rng.integers(1, 7)))
    gamma, weight, penalty = float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.0, 2.0)), 0.1
    adv = gigpo(groups, gamma=gamma, mode=mode, step_advantage_weight=weight, invalid_action_penalty=penalty,
                episode_baseline=baseline)
    np.testing.assert_allclose(adv, gigpo_reference(groups, gamma, mode, weight, penalty, 1e-6, baseline),
                               atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_discounted_returns_match_loop(seed: int) -> None:
    groups = random_groups(np.random.default_rng(seed))
    table = TurnTable.from_groups(groups)
    expected = []
    for g in groups:
        for tr in g.trajectories:
            running, row = 0.0, []
            for t in reversed(tr.turns):
                running = t.reward + 0.9 * running
                row.append(running)
            expected.extend(reversed(row))
    np.testing.assert_allclose(discounted_returns(table, 0.9), expected)


# --- the plug-in ----------------------------------------------------------------------------------

def test_registry_lists_builtins_and_validates_args() -> None:
    assert {"grpo", "rloo", "gigpo"} <= {a.name for a in list_algorithms()}
    with pytest.raises(RegistryError, match="Did you mean 'gigpo'"):
        get_algorithm("gigppo")
    with pytest.raises(ConfigError, match="Did you mean algorithm.args.gamma"):
        get_algorithm("gigpo").make_args({"gama": 0.9})
    with pytest.raises(ConfigError, match="algorithm.args.gamma must be a number"):
        get_algorithm("gigpo").make_args({"gamma": "high"})
    # Literal fields are checked when the arguments are built, not when the estimator first runs.
    with pytest.raises(ConfigError, match="algorithm.args.mode must be one of 'mean_norm', 'mean_std_norm'"):
        get_algorithm("gigpo").make_args({"mode": "bogus"})
    with pytest.raises(ConfigError, match="algorithm.args.episode_baseline must be one of"):
        get_algorithm("gigpo").make_args({"episode_baseline": "step"})
    assert get_algorithm("gigpo").make_args({"gamma": 1}).gamma == 1.0
    assert get_algorithm("gigpo").make_args({"gamma": "0.5"}).gamma == 0.5  # YAML 1.1 strings of numbers


def test_repeated_state_within_one_trajectory_forms_a_step_group() -> None:
    # A loop back to A inside one trajectory: the two visits are compared with each other.
    adv = gigpo([group(traj([("A", 0.0), ("A", 1.0)]))], gamma=0.5, invalid_action_penalty=0.0)
    np.testing.assert_allclose(adv, [-0.25, 0.25])  # G = [0.5, 1], mean 0.75; no episode baseline


def test_empty_batch() -> None:
    for algo in list_algorithms():
        assert algo.estimator([], algo.make_args({})).shape == (0,)


# --- precision: long trajectories, small γ, all-equal groups -------------------------------------------


def loop_returns(groups: list[EpisodeGroup], gamma: float) -> list[float]:
    expected: list[float] = []
    for g in groups:
        for tr in g.trajectories:
            running, row = 0.0, []
            for t in reversed(tr.turns):
                running = t.reward + gamma * running
                row.append(running)
            expected.extend(reversed(row))
    return expected


def test_long_trajectory_then_an_early_reward_keeps_every_return() -> None:
    """800 zero rewards then a 1, followed in the batch by a trajectory that starts with a 1: the old
    suffix-sum / γ^t form underflowed to returns of 0 where the answer is γ^k (and 1 at the start)."""
    long = traj([("s", 0.0)] * 800 + [("s", 1.0)])
    short = traj([("s", 1.0), ("s", 0.0)])
    table = TurnTable.from_groups([group(long, short)])
    returns = discounted_returns(table, 0.95)
    assert returns[800] == 1.0 and returns[801] == 1.0  # last turn of the long one, first of the short one
    np.testing.assert_allclose(returns[:801], 0.95 ** np.arange(800, -1, -1), rtol=1e-12)
    assert returns.tolist() == loop_returns([group(long, short)], 0.95)


@pytest.mark.parametrize("gamma", [0.5, 0.1, 0.95])
def test_small_gamma_long_trajectories_are_exact(gamma: float) -> None:
    rng = np.random.default_rng(0)
    trajectories = [traj([(f"s{int(rng.integers(0, 3))}", float(rng.choice([0.0, 1.0, -0.5])))
                          for _ in range(n)])
                    for n in rng.integers(40, 60, size=12)]
    groups = [group(*trajectories[:6], gid="a"), group(*trajectories[6:], gid="b")]
    assert discounted_returns(TurnTable.from_groups(groups), gamma).tolist() == loop_returns(groups, gamma)


@pytest.mark.parametrize("epsilon", [0.0, 1e-12, 1e-6])
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_anchor_groups_with_equal_returns_get_exactly_zero(epsilon: float, mode: str) -> None:
    """Three visits of state A with identical futures: their step advantages are exactly 0, whatever ε
    (returns like 0.1 would otherwise give a mean of 0.1000…02 and a noise-sized std)."""
    same = [("A", 0.0), ("B", 0.1), ("C", 0.1), ("D", 0.1)]
    groups = [group(traj(same), traj(same), traj(same))]
    for gamma in (0.5, 0.95, 1.0):
        adv = gigpo(groups, gamma=gamma, mode=mode, epsilon=epsilon, invalid_action_penalty=0.0)
        assert (adv == 0.0).all(), adv
    adv = get_algorithm("grpo").estimator(groups, get_algorithm("grpo").make_args({"epsilon": epsilon}))
    assert (adv == 0.0).all()


def test_rloo_invalid_action_penalty_is_subtracted_not_scaled() -> None:
    """λ = 0.1 costs exactly 0.1 at G = 2 (the G/(G−1) factor used to double it)."""
    algo = get_algorithm("rloo")
    clean = algo.estimator([group(traj([("s", 1.0), ("t", 0.0)]), traj([("s", 0.0)]))], algo.make_args({}))
    penalised = algo.estimator([group(traj([("s", 1.0), ("t", 0.0, True)]), traj([("s", 0.0)]))],
                               algo.make_args({"invalid_action_penalty": 0.1}))
    np.testing.assert_allclose(penalised - clean, [0.0, -0.1, 0.0], atol=1e-12)
    # A group of one has no baseline: 0 whatever the penalty.
    alone = algo.estimator([group(traj([("s", 1.0, True)]))], algo.make_args({"invalid_action_penalty": 0.1}))
    assert alone.tolist() == [0.0]


def test_a_batch_carries_one_table_with_the_plan_columns_and_a_plain_list_gets_a_new_one() -> None:
    turn = Turn([1], [2], [-0.1], 0.0, "s")
    parent = Trajectory([turn, turn, turn], "t", 0, trajectory_id="a")
    branch = Trajectory([turn, turn, turn], "t", 0, trajectory_id="b", fork_turn=2)
    groups = [EpisodeGroup("g", "t", 0, [parent, branch])]
    batch = Batch.of(groups)
    table = TurnTable.of(batch)
    assert table is batch.table  # what the estimator reads is the table the loop hands the update
    assert list(batch) == groups and len(batch) == 1 and batch[0] is groups[0]
    assert table.trajectory_id.tolist() == ["a"] * 3 + ["b"] * 3
    assert table.copied.tolist() == [False, False, False, True, True, False]
    # Nothing is remembered between calls: a plain list gets a table of its own, never an earlier batch's.
    assert TurnTable.of(groups) is not table and TurnTable.of(groups) is not TurnTable.of(groups)
    groups[0].trajectories.append(Trajectory([turn], "t", 0, trajectory_id="c"))
    assert TurnTable.of(groups).num_turns == 7


@pytest.mark.parametrize("name", ["grpo", "rloo", "gigpo", "hgpo", "graphgpo"])
def test_estimators_read_the_table_the_batch_carries(name: str) -> None:
    algo = get_algorithm(name)
    args = algo.make_args({})
    solved, failed = traj([("A", 0.0), ("B", 1.0)]), traj([("A", 0.0), ("C", 0.0)])
    groups = [group(solved, failed), group(traj([("A", 1.0)]), traj([("A", 0.0)]), gid="h")]
    plain = algo.estimator(groups, args)
    np.testing.assert_array_equal(algo.estimator(Batch.of(groups), args), plain)
    # A batch whose table was built from other rewards: the estimator answers from that table, so it read the
    # one it was handed instead of building its own from the groups.
    swapped = [group(failed, solved), group(traj([("A", 0.0)]), traj([("A", 1.0)]), gid="h")]
    handed = Batch(tuple(groups), TurnTable.from_groups(swapped))
    np.testing.assert_array_equal(algo.estimator(handed, args), algo.estimator(swapped, args))
    assert not np.array_equal(algo.estimator(handed, args), plain)
