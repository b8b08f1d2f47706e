"""PPO with a learned critic (``ppo``): GAE over turns against a loop reference and hand-computed values,
the critic's fit, its state in checkpoints, and the run as a plug-in of the ordinary loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from learning import small

from agentgym.errors import ConfigError
from agentgym.rollout.hooks import CollectContext
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.trainers.ppo import VALUE_KEY, PPOArgs, ValueCritic, gae, ppo_advantages
from agentgym.training.api import TurnTable, get_algorithm
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import train


def batch(rng: np.random.Generator, num_groups: int, max_turns: int, *, with_values: bool = True,
          equal: bool = False) -> list[EpisodeGroup]:
    """Random groups of random-length trajectories (rewards on every turn, some invalid actions)."""
    groups = []
    for g in range(num_groups):
        trajectories = []
        for _ in range(int(rng.integers(1, 5))):
            turns = [Turn([int(rng.integers(1, 50))], [1], [0.0], 1.0 if equal else float(rng.normal()), "s",
                          invalid=bool(rng.random() < 0.2),
                          extras={VALUE_KEY: float(rng.normal())} if with_values else {})
                     for _ in range(int(rng.integers(1, max_turns + 1)))]
            trajectories.append(Trajectory(turns, "t", g))
        groups.append(EpisodeGroup(f"g{g}", "t", g, trajectories))
    return groups


def gae_loop(groups: list[EpisodeGroup], gamma: float, lam: float, penalty: float) -> list[float]:
    """GAE the textbook way: backwards over each trajectory's turns."""
    out: list[float] = []
    for group in groups:
        for trajectory in group.trajectories:
            turns = trajectory.turns
            advantages = [0.0] * len(turns)
            running = 0.0
            for t in reversed(range(len(turns))):
                value = turns[t].extras[VALUE_KEY]
                following = turns[t + 1].extras[VALUE_KEY] if t + 1 < len(turns) else 0.0
                reward = turns[t].reward - penalty * turns[t].invalid
                running = reward + gamma * following - value + gamma * lam * running
                advantages[t] = running
            out += advantages
    return out


def values_of(groups: list[EpisodeGroup]) -> np.ndarray:
    return np.array([turn.extras[VALUE_KEY] for g in groups for t in g.trajectories for turn in t.turns])


# --- GAE ---------------------------------------------------------------------------------------------


def test_gae_by_hand_on_two_trajectories() -> None:
    def turn(reward: float, value: float, invalid: bool = False) -> Turn:
        return Turn([], [], [], reward, "s", invalid=invalid, extras={VALUE_KEY: value})

    three = Trajectory([turn(0.0, 0.5), turn(0.0, 0.25, True), turn(1.0, 0.5)], "t", 0)
    groups = [EpisodeGroup("g", "t", 0, [three, Trajectory([turn(0.0, 1.0)], "t", 0)])]
    table = TurnTable.from_groups(groups)
    # γ = 0.5, λ = 0.5, penalty 0.1: δ = (0 + .5·.25 − .5, −.1 + .5·.5 − .25, 1 − .5) = (−.375, −.1, .5);
    # Â_2 = .5, Â_1 = −.1 + .25·.5 = .025, Â_0 = −.375 + .25·.025 = −.36875; the one-turn episode: 0 − 1 = −1.
    advantages = gae(table, values_of(groups), gamma=0.5, lam=0.5, invalid_action_penalty=0.1)
    assert advantages.tolist() == pytest.approx([-0.36875, 0.025, 0.5, -1.0])


@pytest.mark.parametrize(("gamma", "lam", "max_turns"), [(0.95, 0.95, 6), (0.01, 0.9, 40), (1.0, 1.0, 30),
                                                         (0.9, 0.0, 200), (0.5, 0.3, 1)])
def test_vectorised_gae_equals_the_loop_on_random_batches(gamma: float, lam: float, max_turns: int) -> None:
    rng = np.random.default_rng(int(gamma * 100 + lam * 10 + max_turns))
    groups = batch(rng, 12, max_turns)
    got = gae(TurnTable.from_groups(groups), values_of(groups), gamma, lam, invalid_action_penalty=0.1)
    np.testing.assert_allclose(got, gae_loop(groups, gamma, lam, 0.1), rtol=1e-12, atol=1e-12)


def test_lambda_one_is_the_return_minus_the_value_and_lambda_zero_the_td_error() -> None:
    rng = np.random.default_rng(3)
    groups = batch(rng, 6, 8)
    table = TurnTable.from_groups(groups)
    values = values_of(groups)
    from agentgym.training.api import discounted_returns

    monte_carlo = discounted_returns(table, 0.9) - values
    np.testing.assert_allclose(gae(table, values, 0.9, 1.0), monte_carlo, atol=1e-12)
    last = np.r_[table.trajectory[1:] != table.trajectory[:-1], True]
    following = np.where(last, 0.0, np.r_[values[1:], 0.0])
    td_error = table.reward + 0.9 * following - values
    np.testing.assert_allclose(gae(table, values, 0.9, 0.0), td_error, atol=1e-12)


def test_advantages_are_normalised_over_the_batch_and_equal_returns_with_a_perfect_critic_give_zero() -> None:
    rng = np.random.default_rng(5)
    advantages = ppo_advantages(batch(rng, 8, 5), PPOArgs())
    assert abs(advantages.mean()) < 1e-9 and abs(advantages.std() - 1.0) < 1e-4
    # Every reward 1 and V(s_t) = the exact remaining return: every δ is 0, so every advantage is 0.
    groups = batch(rng, 4, 5, equal=True)
    groups = [EpisodeGroup(g.group_id, "t", g.seed, [exact_values(t) for t in g.trajectories])
              for g in groups]
    np.testing.assert_allclose(ppo_advantages(groups, PPOArgs(gamma=1.0, lam=0.7)), 0.0, atol=1e-9)


def exact_values(trajectory: Trajectory) -> Trajectory:
    """The trajectory with every turn's value set to its undiscounted remaining return."""
    remaining = np.cumsum([turn.reward for turn in trajectory.turns][::-1])[::-1]
    turns = [Turn(turn.prompt_ids, turn.response_ids, turn.response_logprobs, turn.reward, "s",
                  extras={VALUE_KEY: float(value)})
             for turn, value in zip(trajectory.turns, remaining, strict=True)]
    return Trajectory(turns, "t", trajectory.seed)


def test_missing_values_are_a_clear_error() -> None:
    groups = batch(np.random.default_rng(0), 2, 3, with_values=False)
    with pytest.raises(ConfigError, match="ppo needs the critic's value of every turn"):
        ppo_advantages(groups, PPOArgs())


@pytest.mark.parametrize(("values", "message"), [
    ({"lam": 1.5}, "algorithm.args.lam must be in \\[0, 1\\]"),
    ({"critic_hidden_size": 30, "critic_heads": 4}, "not a multiple of critic_heads=4"),
    ({"critic_epochs": 0}, "critic_epochs must be >= 1"),
    ({"critic_lr": 0}, "critic_lr must be > 0"),
])
def test_bad_arguments_are_one_line_errors(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_algorithm("ppo").make_args(values)


# --- the critic --------------------------------------------------------------------------------------


class Vocabulary:
    """The little of a tokenizer the critic reads (its vocabulary size)."""

    eos_token_id = pad_token_id = 0

    def __len__(self) -> int:
        return 32


def two_state_groups(rng: np.random.Generator) -> list[EpisodeGroup]:
    """One-turn episodes whose return is decided by the prompt: [3, 5] → 1, [3, 9] → 0."""
    trajectories = []
    for _ in range(32):
        good = bool(rng.random() < 0.5)
        turn = Turn([3, 5] if good else [3, 9], [1], [0.0], float(good), "s")
        trajectories.append(Trajectory([turn], "t", 0))
    return [EpisodeGroup("g", "t", 0, trajectories)]


def test_the_critic_learns_the_value_of_each_state() -> None:
    critic = ValueCritic(PPOArgs(critic_lr=3e-3, critic_epochs=4, critic_minibatch=16))
    context = CollectContext(tokenizer=Vocabulary())  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    explained = []
    for iteration in range(1, 16):
        critic.begin_iteration(iteration, context)
        valued = critic.after_collect(two_state_groups(rng), context)
        explained.append(critic.metrics()["critic/explained_variance"])
    assert all(VALUE_KEY in turn.extras for t in valued[0].trajectories for turn in t.turns)
    with torch.no_grad():
        good, bad = critic.values([[3, 5], [3, 9]]).tolist()
    assert good == pytest.approx(1.0, abs=0.15) and bad == pytest.approx(0.0, abs=0.15)
    assert explained[0] <= 0.0 < 0.8 < explained[-1]  # a zero-initialised head explains nothing at first


def test_the_values_written_are_those_before_the_fit() -> None:
    critic = ValueCritic(PPOArgs())
    context = CollectContext(tokenizer=Vocabulary())  # type: ignore[arg-type]
    groups = two_state_groups(np.random.default_rng(1))
    critic.after_collect(groups, context)  # builds and fits once
    with torch.no_grad():
        before = critic.values([turn.prompt_ids for t in groups[0].trajectories for turn in t.turns]).tolist()
    valued = critic.after_collect(groups, context)
    written = [turn.extras[VALUE_KEY] for t in valued[0].trajectories for turn in t.turns]
    assert written == pytest.approx(before, abs=1e-6)


def test_the_critic_state_round_trips_before_and_after_it_is_built() -> None:
    context = CollectContext(tokenizer=Vocabulary())  # type: ignore[arg-type]
    trained = ValueCritic(PPOArgs())
    trained.after_collect(two_state_groups(np.random.default_rng(2)), context)
    state = trained.state_dict()
    restored = ValueCritic(PPOArgs())
    assert ValueCritic(PPOArgs()).state_dict() == {}
    restored.load_state_dict(state)  # before its first batch: applied when it is built
    groups = two_state_groups(np.random.default_rng(3))
    a = trained.after_collect(groups, context)
    b = restored.after_collect(groups, context)
    assert [t.turns[0].extras[VALUE_KEY] for t in a[0].trajectories] == \
           [t.turns[0].extras[VALUE_KEY] for t in b[0].trajectories]
    assert trained.metrics() == restored.metrics()


# --- in the loop ---------------------------------------------------------------------------------------


def test_a_resumed_ppo_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    overrides = small("algorithm.name=ppo", "iterations=3", "rollout.group_size=1", "rollout.num_tasks=4")
    full = train(load_config(None, overrides), tmp_path / "full")
    train(load_config(None, overrides), tmp_path / "split", stop_after=2)
    saved = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)["plugins"]["hooks"]["0"]
    assert set(saved) == {"model", "optimizer"}
    resumed = train(load_config(None, overrides), tmp_path / "split", resume=True)

    def strip(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]

    assert strip(resumed["history"]) == strip(full["history"])
    assert all("critic/value_loss" in m for m in full["history"])
