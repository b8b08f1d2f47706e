"""Tests of ``maze-v0`` (``agentgym.envs.games.maze.MazeEnv``)."""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import pytest

import agentgym
from agentgym.envs.games.maze import MazeEnv

OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def find(rows: list[str], char: str) -> tuple[int, int]:
    for r, row in enumerate(rows):
        if char in row:
            return r, row.index(char)
    raise AssertionError(f"{char!r} not on the map")


def shortest_path_length(text: str) -> int:
    """Fewest moves from P to G over the rendered map (independent of the env's own search)."""
    rows = text.splitlines()
    start, goal = find(rows, "P"), find(rows, "G")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return dist[(r, c)]
        for dr, dc in STEP.values():
            nxt = (r + dr, c + dc)
            if rows[nxt[0]][nxt[1]] != "#" and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    raise AssertionError("the goal is unreachable")


def run(env: agentgym.EpisodeGuard, actions: list[str]) -> list[tuple]:
    return [env.step(a) for a in actions]


def test_same_seed_same_episode_and_seeds_differ():
    first, second = agentgym.make("maze-v0"), agentgym.make("maze-v0")
    obs_a, info_a = first.reset(seed=11)
    obs_b, info_b = second.reset(seed=11)
    assert (obs_a, info_a) == (obs_b, info_b)
    actions = ["up", "left", "down", "right", "jump", "right", "up"]
    assert run(first, actions) == run(second, actions)
    maps = {agentgym.make("maze-v0").reset(seed=s)[0] for s in range(6)}
    assert len(maps) > 1


def test_reset_without_seed_continues_the_seeded_sequence():
    first, second = MazeEnv(), MazeEnv()
    first.reset(seed=5)
    second.reset(seed=5)
    ids_a = [first.reset()[1]["task_id"] for _ in range(3)]
    ids_b = [second.reset()[1]["task_id"] for _ in range(3)]
    assert ids_a == ids_b
    assert len(set(ids_a)) == 3


def test_task_id_replays_the_level():
    obs, info = agentgym.make("maze-v0", size=5, loop_fraction=0.3).reset(seed=123)
    assert info["task_id"] == "maze/size5/loop0.3/123"
    # A differently configured env plays the level the task id names.
    other = agentgym.make("maze-v0")
    obs2, info2 = other.reset(seed=7, options={"task_id": info["task_id"]})
    assert (obs2, info2["state_key"], info2["task_id"]) == (obs, info["state_key"], info["task_id"])


@pytest.mark.parametrize(
    "task_id",
    [
        "maze/size4/loop0.15",
        "maze/size4/loop0.15/-1",
        "maze/size04/loop0.15/1",
        "maze/size4/loop.15/1",
        "maze/size1/loop0.15/1",
        "maze/size4/loop1.5/1",
        "maze/size4/loop0.1.5/1",
        "sokoban/size6/boxes1/1",
        "",
        42,
    ],
)
def test_malformed_task_id_is_a_config_error(task_id):
    env = agentgym.make("maze-v0")
    with pytest.raises(agentgym.ConfigError, match="task_id"):
        env.reset(seed=0, options={"task_id": task_id})


def test_expert_solves_every_level_along_a_shortest_path():
    env = agentgym.make("maze-v0")
    for seed in range(50):
        _, info = env.reset(seed=seed)
        optimal = shortest_path_length(env.render())
        assert optimal > 0
        reward = terminated = truncated = None
        while not env.episode_over:
            action = env.expert_action()
            assert action in info["admissible_actions"]
            _, reward, terminated, truncated, info = env.step(action)
            assert not info["invalid_action"]
        assert terminated and not truncated and info["success"] and reward == 1.0, seed
        assert env.turn == optimal, seed
        assert env.expert_action() is None


def test_rewards_and_success_only_at_the_goal():
    env = agentgym.make("maze-v0")
    env.reset(seed=3)
    rewards, successes = [], []
    while not env.episode_over:
        _, reward, _, _, info = env.step(env.expert_action())
        rewards.append(reward)
        successes.append(info["success"])
    assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
    assert successes == [False] * (len(successes) - 1) + [True]


def test_expert_on_a_large_maze():
    env = agentgym.make("maze-v0", size=25, max_turns=5000)
    env.reset(seed=1)
    optimal = shortest_path_length(env.render())
    while not env.episode_over:
        env.step(env.expert_action())
    assert env.turn == optimal


def test_state_key_names_the_position_only():
    first, second = agentgym.make("maze-v0"), agentgym.make("maze-v0")
    _, info = first.reset(seed=2)
    start_key = info["state_key"]
    a, b = info["admissible_actions"][0], info["admissible_actions"][-1]
    blocked = next(x for x in STEP if x not in info["admissible_actions"])
    keys = [i["state_key"] for *_, i in run(first, [a, OPPOSITE[a]])]
    second.reset(seed=2)
    keys2 = [i["state_key"] for *_, i in run(second, [b, OPPOSITE[b], blocked, blocked, "noise"])]
    assert keys[-1] == keys2[-1] == start_key
    assert keys[0] != start_key
    # More turns in the same place keep the key: invalid actions leave the state alone.
    assert keys2[2:] == [start_key] * 3


def test_state_keys_match_positions_one_to_one():
    env = agentgym.make("maze-v0", max_turns=200)
    _, info = env.reset(seed=4)
    by_key: dict[str, str] = {info["state_key"]: env.render()}
    by_map: dict[str, str] = {env.render(): info["state_key"]}
    rng = np.random.default_rng(0)
    for _ in range(150):
        actions = info["admissible_actions"]
        _, _, terminated, _, info = env.step(actions[rng.integers(len(actions))])
        assert by_key.setdefault(info["state_key"], env.render()) == env.render()
        assert by_map.setdefault(env.render(), info["state_key"]) == info["state_key"]
        if terminated:
            break
    assert len(by_key) > 5


@pytest.mark.parametrize("action", ["jump", "", "   ", "x" * 100_000, "up up", "\x00", "upp", "u"])
def test_unknown_actions_are_answered_not_raised(action):
    env = agentgym.make("maze-v0")
    obs, info = env.reset(seed=9)
    new_obs, reward, terminated, truncated, new_info = env.step(action)
    assert new_info["invalid_action"] and not new_info["success"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert new_info["state_key"] == info["state_key"]
    assert new_obs.startswith("Unknown action") and "up, down, left, right" in new_obs
    assert new_obs.endswith(obs) and len(new_obs) < len(obs) + 120


def test_wall_bump_changes_nothing():
    env = agentgym.make("maze-v0")
    obs, info = env.reset(seed=9)
    blocked = next(a for a in STEP if a not in info["admissible_actions"])
    new_obs, reward, _, _, new_info = env.step(blocked)
    assert new_info["invalid_action"] and reward == 0.0
    assert new_obs == "You bumped into a wall.\n" + obs
    assert new_info["state_key"] == info["state_key"]


def test_actions_ignore_case_and_whitespace():
    env = agentgym.make("maze-v0")
    _, info = env.reset(seed=9)
    action = info["admissible_actions"][0]
    _, _, _, _, step_info = env.step(f"  {action.upper()}\n")
    assert not step_info["invalid_action"]
    assert step_info["state_key"] != info["state_key"]


def test_infos_are_json_safe_and_complete():
    env = agentgym.make("maze-v0")
    _obs, info = env.reset(seed=0)
    assert {"state_key", "task_id", "admissible_actions", "invalid_action", "success", "instructions"} <= set(
        info
    )
    assert "up, down, left, right" in info["instructions"]
    json.dumps(info)
    *_, step_info = env.step("down")
    assert set(step_info) == {"state_key", "task_id", "admissible_actions", "invalid_action", "success"}
    json.dumps(step_info)


def test_local_observation():
    env = agentgym.make("maze-v0", observation="local")
    obs, info = env.reset(seed=0)
    lines = obs.splitlines()
    assert [len(line) for line in lines[:3]] == [3, 3, 3] and lines[1][1] == "P"
    assert lines[3].startswith("The goal is")
    assert "3x3" in info["instructions"]
    grid = agentgym.make("maze-v0")
    grid.reset(seed=0)
    assert env.render() == grid.render()


def test_snapshot_restores_on_a_fresh_instance():
    env = MazeEnv()
    env.reset(seed=21)
    for action in ["up", "down", "left", "right", "left"]:
        env.step(action)
    data = env.snapshot()
    copy = MazeEnv()
    copy.restore(data)
    assert copy.render() == env.render()
    assert copy.np_random.bit_generator.state == env.np_random.bit_generator.state
    moves = ["up", "right", "jump", "down", "left", "left"]
    assert [copy.step(a) for a in moves] == [env.step(a) for a in moves]
    assert copy.expert_action() == env.expert_action()
    assert copy.reset() == env.reset()


def test_restore_rejects_foreign_bytes():
    import pickle

    with pytest.raises(agentgym.ConfigError):
        MazeEnv().restore(pickle.dumps({"kind": "other"}))


@pytest.mark.parametrize("mode", ["snapshot", "replay"])
def test_fork_continues_identically(mode):
    env = agentgym.make("maze-v0")
    env.reset(seed=31)
    run(env, ["right", "down", "down", "left"])
    child = env.fork(mode)
    assert child.turn == env.turn
    moves = ["up", "left", "xyz", "down", "right", "right", "down"]
    assert run(child, moves) == run(env, moves)
    assert child.reset() == env.reset()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 1},
        {"size": 26},
        {"size": 4.0},
        {"size": True},
        {"loop_fraction": -0.1},
        {"loop_fraction": 1.5},
        {"loop_fraction": math.nan},
        {"loop_fraction": "0.1"},
        {"observation": "pixels"},
    ],
)
def test_bad_arguments_are_config_errors(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(agentgym.ConfigError, match=name):
        agentgym.make("maze-v0", **kwargs)


def test_loop_fraction_extremes():
    perfect = agentgym.make("maze-v0", loop_fraction=0.0)
    perfect.reset(seed=0)
    open_squares = sum(row.count("_") for row in perfect.render().splitlines()) + 2
    # A perfect maze on n*n cells is a tree: n*n cells plus n*n - 1 passages.
    assert open_squares == 2 * 16 - 1
    agentgym.make("maze-v0", loop_fraction=1).reset(seed=0)


def test_check_env_passes():
    agentgym.check_env("maze-v0")
    agentgym.check_env(lambda: agentgym.make("maze-v0", size=3, observation="local"))
