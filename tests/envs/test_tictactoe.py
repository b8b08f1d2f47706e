"""Tests of ``agentgym.envs.games.tictactoe``: rules, the minimax opponent and expert, the env contract."""

from __future__ import annotations

import numpy as np
import pytest

import agentgym
from agentgym.envs.games.tictactoe import TicTacToeEnv, best_moves, winner
from agentgym.envs.registration import register_games
from agentgym.errors import ConfigError

register_games()  # idempotent (override=True)


def play(env: agentgym.EpisodeGuard, seed: int, policy) -> tuple[float, dict]:
    """Final (reward, info) of one game; ``policy(env, info, rng) -> action``."""
    _, info = env.reset(seed=seed)
    rng = np.random.default_rng([seed, 2])
    while True:
        _, reward, terminated, truncated, info = env.step(policy(env, info, rng))
        if terminated or truncated:
            return reward, info


def expert_policy(env, info, rng) -> str:
    return env.expert_action()


def random_policy(env, info, rng) -> str:
    moves = info["admissible_actions"]
    return moves[int(rng.integers(len(moves)))]


@pytest.mark.parametrize(
    "kwargs", [{}, {"opponent_strength": 0.0}, {"opponent_strength": 0.5, "first_player": "opponent"}]
)
def test_check_env(kwargs: dict) -> None:
    agentgym.check_env(agentgym.make("tictactoe-v0", **kwargs))
    agentgym.check_env(agentgym.make("tictactoe-v0", **kwargs), seed=20, num_episodes=5)


def test_rules_helpers() -> None:
    assert winner("XXX" "OO." "...") == "X"
    assert winner("XO." "XO." ".O.") == "O"
    assert winner("OX." ".OX" "X.O") == "O"
    assert winner("XOX" "XOO" "OXX") is None
    assert best_moves("XX." "OO." "...", "X") == (2,)  # win at once rather than block
    assert best_moves("OO." "X.." "X..", "X") == (2,)  # block the only threat
    assert best_moves("X........", "O") == (4,)  # against a corner, only the centre draws


def test_expert_never_loses_to_perfect_play() -> None:
    env = agentgym.make("tictactoe-v0", opponent_strength=1.0)
    rewards = [play(env, seed, expert_policy)[0] for seed in range(100)]
    assert min(rewards) >= 0.0  # never a loss
    assert rewards.count(0.0) == 100  # perfect play on both sides is a draw


def test_expert_wins_often_against_a_random_opponent() -> None:
    env = agentgym.make("tictactoe-v0", opponent_strength=0.0)
    results = [play(env, seed, expert_policy) for seed in range(100)]
    rewards = [r for r, _ in results]
    assert min(rewards) >= 0.0
    assert np.mean([info["success"] for _, info in results]) >= 0.75  # measured over 300 seeds: 0.87


def test_random_agent_baseline() -> None:
    strong = agentgym.make("tictactoe-v0", opponent_strength=1.0)
    weak = agentgym.make("tictactoe-v0", opponent_strength=0.0)
    assert not any(play(strong, seed, random_policy)[1]["success"] for seed in range(60))
    assert 0.2 <= np.mean([play(weak, seed, random_policy)[1]["success"] for seed in range(60)]) <= 0.7


def test_rewards_follow_the_outcome() -> None:
    env = agentgym.make("tictactoe-v0", opponent_strength=1.0, first_player="agent")
    for seed in range(20):
        reward, info = play(env, seed, lambda e, i, r: i["admissible_actions"][0])  # lowest free cell
        board = info["state_key"].split("|")[0]
        expected = {"X": 1.0, "O": -1.0, None: 0.0}[winner(board)]
        assert reward == expected and info["success"] == (expected == 1.0)
        assert info["state_key"].endswith("|-") and info["admissible_actions"] == []
    assert reward == -1.0  # a perfect opponent punishes "lowest free cell"


def test_a_game_move_by_move() -> None:
    env = agentgym.make("tictactoe-v0", first_player="agent")
    obs, info = env.reset(seed=0)
    assert obs.startswith("You move first.\n 1 | 2 | 3") and info["state_key"] == ".........|X"
    assert "number of an empty cell" in info["instructions"]
    obs, _, _, _, info = env.step("5")
    assert obs.startswith("You played 5. The opponent played 1.")
    assert info["state_key"] == "O...X....|X" and "1" not in info["admissible_actions"]


@pytest.mark.parametrize("action", ["0", "10", "a", "", "5 5", "five", "x" * 5000, "1", " 1 "])
def test_invalid_moves_change_nothing(action: str) -> None:
    env = agentgym.make("tictactoe-v0", first_player="opponent")
    _, info = env.reset(seed=0)
    taken = next(str(i + 1) for i, mark in enumerate(info["state_key"][:9]) if mark == "O")
    assert taken == "1"  # the test relies on the opponent's first move at cell 1
    text, reward, terminated, truncated, after = env.step(action)
    assert after["invalid_action"] and "Invalid move" in text and len(text) < 300
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert after["state_key"] == info["state_key"]


def test_who_starts_comes_from_the_seed_or_an_option() -> None:
    env = agentgym.make("tictactoe-v0")
    starts = {env.reset(seed=seed)[1]["task_id"].split("/")[1] for seed in range(20)}
    assert starts == {"agent-first", "opponent-first"}
    _, info = env.reset(seed=3, options={"first_player": "opponent"})
    assert info["task_id"] == "tictactoe/opponent-first/3" and info["state_key"].count("O") == 1
    assert TicTacToeEnv(first_player="agent").reset(seed=3)[1]["task_id"] == "tictactoe/agent-first/3"


def test_task_id_replays_the_game() -> None:
    env, other = (agentgym.make("tictactoe-v0", opponent_strength=0.3) for _ in range(2))
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        assert other.reset(seed=seed + 100, options={"task_id": info["task_id"]}) == (obs, info)
        while not env.episode_over:
            move = random_policy(env, info, np.random.default_rng(seed))
            step = env.step(move)
            info = step[4]
            assert other.step(move) == step
    with pytest.raises(ConfigError, match="contradicts"):
        env.reset(options={"task_id": "tictactoe/agent-first/1", "first_player": "opponent"})
    for bad in ["tictactoe/x-first/1", "tictactoe/agent-first/01", "tictactoe/agent-first", 5]:
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": bad})


def test_bad_arguments_name_the_argument() -> None:
    for value in (-0.1, 1.5, float("nan"), "strong", True):
        with pytest.raises(ConfigError, match="opponent_strength"):
            TicTacToeEnv(opponent_strength=value)
    with pytest.raises(ConfigError, match="first_player"):
        TicTacToeEnv(first_player="X")
    with pytest.raises(ConfigError, match="first_player"):
        TicTacToeEnv().reset(seed=0, options={"first_player": "me"})


def test_render_and_snapshot() -> None:
    env = TicTacToeEnv(opponent_strength=0.5, first_player="agent")
    assert env.render() is None
    env.reset(seed=4)
    info = env.step("5")[4]
    board, saved = env.render(), env.snapshot()
    moves = info["admissible_actions"][:2]
    first = [env.step(move) for move in moves]
    copy = TicTacToeEnv(opponent_strength=0.5)
    copy.restore(saved)  # the opponent's random draws continue from the same np_random state
    assert copy.render() == board
    assert [copy.step(move) for move in moves] == first
