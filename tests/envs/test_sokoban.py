"""Tests of ``sokoban-v0`` (``agentgym.envs.games.sokoban.SokobanEnv``)."""

from __future__ import annotations

import json
import pickle
from collections import deque
from collections.abc import Callable

import numpy as np
import pytest

import agentgym
from agentgym.envs.games.sokoban import MAX_SOLUTION_MOVES, MIN_SOLUTION_MOVES, SokobanEnv

STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}

Square = tuple[int, int]
Board = tuple[Square, frozenset[Square]]


class Map:
    """A rendered level read back from its text: walls, goals, boxes and the player."""

    def __init__(self, text: str) -> None:
        self.walls: set[Square] = set()
        self.goals: set[Square] = set()
        boxes: set[Square] = set()
        players = []
        for r, row in enumerate(text.splitlines()):
            for c, char in enumerate(row):
                assert char in "#_OX*PS", f"unexpected symbol {char!r}"
                square = (r, c)
                if char == "#":
                    self.walls.add(square)
                if char in "O*S":
                    self.goals.add(square)
                if char in "X*":
                    boxes.add(square)
                if char in "PS":
                    players.append(square)
        assert len(players) == 1
        self.start: Board = (players[0], frozenset(boxes))

    def solved(self, board: Board) -> bool:
        return board[1] <= self.goals

    def move(self, board: Board, action: str) -> Board | None:
        """The board after ``action``, or ``None`` when the move is not allowed."""
        (r, c), boxes = board
        dr, dc = STEP[action]
        target = (r + dr, c + dc)
        if target in self.walls:
            return None
        if target in boxes:
            behind = (target[0] + dr, target[1] + dc)
            if behind in self.walls or behind in boxes:
                return None
            boxes = (boxes - {target}) | {behind}
        return target, boxes

    def search(self, goal: Callable[[Board], bool], limit: int = 300_000) -> list[str] | None:
        """Fewest actions from the start to a board where ``goal`` holds (breadth-first).

        Solved boards end the episode, so the search does not go past them.
        """
        if goal(self.start):
            return []
        parent: dict[Board, tuple[Board, str] | None] = {self.start: None}
        queue = deque([self.start])
        while queue and len(parent) < limit:
            board = queue.popleft()
            for action in STEP:
                nxt = self.move(board, action)
                if nxt is None or nxt in parent:
                    continue
                parent[nxt] = (board, action)
                if goal(nxt):
                    path = []
                    while parent[nxt] is not None:
                        nxt, step = parent[nxt]
                        path.append(step)
                    return path[::-1]
                if not self.solved(nxt):  # solving ends the episode
                    queue.append(nxt)
        return None


def run(env: agentgym.EpisodeGuard, actions: list[str]) -> list[tuple]:
    return [env.step(a) for a in actions]


def play_expert(env: agentgym.EpisodeGuard) -> tuple:
    result = None
    while not env.episode_over:
        action = env.expert_action()
        assert action is not None
        result = env.step(action)
        assert not result[4]["invalid_action"]
    return result


def test_same_seed_same_episode_and_seeds_differ():
    first, second = agentgym.make("sokoban-v0"), agentgym.make("sokoban-v0")
    assert first.reset(seed=5) == second.reset(seed=5)
    actions = ["up", "left", "left", "down", "right", "bogus", "up", "right", "down"]
    assert run(first, actions) == run(second, actions)
    maps = {agentgym.make("sokoban-v0").reset(seed=s)[0] for s in range(6)}
    assert len(maps) > 1


def test_task_id_replays_the_level():
    obs, info = agentgym.make("sokoban-v0", num_boxes=2).reset(seed=77)
    assert info["task_id"] == "sokoban/size6/boxes2/77"
    other = agentgym.make("sokoban-v0")
    obs2, info2 = other.reset(seed=1, options={"task_id": info["task_id"]})
    assert (obs2, info2["state_key"]) == (obs, info["state_key"])


@pytest.mark.parametrize(
    "task_id",
    [
        "sokoban/size6/boxes1",
        "sokoban/size06/boxes1/3",
        "sokoban/size6/boxes01/3",
        "sokoban/size4/boxes1/3",
        "sokoban/size6/boxes5/3",
        "sokoban/size6/boxes1/x",
        "maze/size4/loop0.15/1",
        None,  # no task_id: the seed picks the level
        3.5,
    ],
)
def test_malformed_task_id_is_a_config_error(task_id):
    env = agentgym.make("sokoban-v0")
    if task_id is None:
        env.reset(seed=0, options={"task_id": None})
        return
    with pytest.raises(agentgym.ConfigError, match="task_id"):
        env.reset(seed=0, options={"task_id": task_id})


@pytest.mark.parametrize("num_boxes, seeds", [(1, range(40)), (2, range(30))])
def test_expert_solves_every_level_optimally(num_boxes, seeds):
    env = agentgym.make("sokoban-v0", num_boxes=num_boxes)
    for seed in seeds:
        env.reset(seed=seed)
        optimal = Map(env.render()).search(Map(env.render()).solved)
        assert optimal is not None, seed
        *_, reward, terminated, truncated, info = play_expert(env)
        assert terminated and not truncated and info["success"] and reward == 1.0, seed
        assert env.turn == len(optimal), seed
        assert env.expert_action() is None


def test_every_generated_level_is_solvable_and_not_trivial():
    env = agentgym.make("sokoban-v0")
    for seed in range(100, 160):
        obs, _ = env.reset(seed=seed)
        level = Map(obs)
        assert len(level.start[1]) == len(level.goals) == 1
        assert not level.solved(level.start)
        solution = level.search(level.solved)
        assert solution is not None, seed
        assert MIN_SOLUTION_MOVES <= len(solution) <= MAX_SOLUTION_MOVES, seed


@pytest.mark.parametrize("size, num_boxes", [(5, 4), (8, 3), (10, 1)])
def test_other_sizes_generate_solvable_levels(size, num_boxes):
    env = agentgym.make("sokoban-v0", size=size, num_boxes=num_boxes)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        level = Map(obs)
        assert len(obs.splitlines()) == size + 2
        assert len(level.start[1]) == len(level.goals) == num_boxes
        play_expert(env)
        assert env.turn <= MAX_SOLUTION_MOVES


def test_generation_gives_up_with_a_config_error():
    seeds = range(1000, 1030)

    def failures() -> list[int]:
        failed = []
        for seed in seeds:
            try:
                agentgym.make("sokoban-v0", max_generation_tries=1).reset(seed=seed)
            except agentgym.ConfigError as exc:
                assert "max_generation_tries=1" in str(exc) and "num_boxes=1" in str(exc)
                failed.append(seed)
        return failed

    fresh = failures()
    assert 0 < len(fresh) < len(seeds)
    for seed in seeds:
        agentgym.make("sokoban-v0").reset(seed=seed)
    # Levels found with a larger budget are cached; a smaller budget still fails the same way.
    assert failures() == fresh


def test_state_key_is_canonical():
    first, second = agentgym.make("sokoban-v0"), agentgym.make("sokoban-v0")
    _, info = first.reset(seed=8)
    level = Map(first.render())
    walks = [
        a for a in STEP if level.move(level.start, a) and level.move(level.start, a)[1] == level.start[1]
    ]
    assert len(walks) >= 1
    a, b = walks[0], walks[-1]
    keys = [i["state_key"] for *_, i in run(first, [a, OPPOSITE[a]])]
    second.reset(seed=8)
    keys2 = [i["state_key"] for *_, i in run(second, [b, OPPOSITE[b], "nope", ""])]
    assert keys[-1] == keys2[-1] == info["state_key"]
    assert keys[0] != info["state_key"]
    assert keys2[-2:] == [info["state_key"]] * 2

    # The same boards after a push, reached by a detour in one env and directly in the other.
    push = level.search(lambda board: board[1] != level.start[1] and not level.solved(board))
    first.reset(seed=8)
    second.reset(seed=8)
    *_, direct = run(first, push)
    pushed = Map(first.render())
    detour = next(
        x for x in STEP if pushed.move(pushed.start, x) and pushed.move(pushed.start, x)[1] == pushed.start[1]
    )
    *_, around = run(second, [*push, detour, OPPOSITE[detour]])
    assert direct[4]["state_key"] == around[4]["state_key"]
    assert first.turn != second.turn


def test_state_keys_match_boards_one_to_one():
    env = agentgym.make("sokoban-v0", num_boxes=2, max_turns=300)
    _, info = env.reset(seed=4)
    by_key = {info["state_key"]: env.render()}
    by_map = {env.render(): info["state_key"]}
    rng = np.random.default_rng(1)
    for _ in range(250):
        if env.episode_over:
            break
        actions = info["admissible_actions"]
        *_, info = env.step(actions[rng.integers(len(actions))])
        assert not info["invalid_action"]
        assert by_key.setdefault(info["state_key"], env.render()) == env.render()
        assert by_map.setdefault(env.render(), info["state_key"]) == info["state_key"]
    assert len(by_key) > 10


def first_board(env: agentgym.EpisodeGuard, seeds: range, goal: Callable[[Map, Board], bool]) -> list[str]:
    """Reset ``env`` to the first seed whose level reaches a board where ``goal`` holds; drive it there."""
    for seed in seeds:
        env.reset(seed=seed)
        level = Map(env.render())
        path = level.search(lambda board, level=level: goal(level, board), limit=20_000)
        if path is not None:
            run(env, path)
            return path
    raise AssertionError("no seed reaches such a board")


def blocked_push(level: Map, board: Board, behind: str) -> str | None:
    """An action that pushes a box into a wall (``behind="wall"``) or a box (``"box"``), if any."""
    (r, c), boxes = board
    for action, (dr, dc) in STEP.items():
        box, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
        if box in boxes and beyond in (level.walls if behind == "wall" else boxes):
            return action
    return None


@pytest.mark.parametrize("behind, num_boxes", [("wall", 1), ("box", 2)])
def test_blocked_push_changes_nothing(behind, num_boxes):
    env = agentgym.make("sokoban-v0", num_boxes=num_boxes)
    first_board(env, range(40), lambda level, board: blocked_push(level, board, behind) is not None)
    before = env.render()
    level = Map(before)
    action = blocked_push(level, level.start, behind)
    obs, reward, terminated, _, info = env.step(action)
    assert info["invalid_action"] and reward == 0.0 and not terminated
    assert action not in info["admissible_actions"]
    assert (
        f"The box cannot move {action}: {'a wall' if behind == 'wall' else 'another box'} is behind it."
        in obs
    )
    assert env.render() == before


def test_deadlock_is_reported_and_expert_gives_up():
    env = agentgym.make("sokoban-v0")

    def cornered(level: Map, board: Board) -> bool:
        for r, c in board[1] - level.goals:
            vertical = (r - 1, c) in level.walls or (r + 1, c) in level.walls
            horizontal = (r, c - 1) in level.walls or (r, c + 1) in level.walls
            if vertical and horizontal:
                return True
        return False

    path = first_board(env, range(40), cornered)
    assert path
    assert "stuck" in env.step("xx")[0]
    assert env.expert_action() is None
    assert not env.episode_over


@pytest.mark.parametrize("action", ["jump", "", "   ", "x" * 100_000, "left right", "\u2191", "righ"])
def test_unknown_actions_are_answered_not_raised(action):
    env = agentgym.make("sokoban-v0")
    obs, info = env.reset(seed=9)
    new_obs, reward, terminated, truncated, new_info = env.step(action)
    assert new_info["invalid_action"] and not new_info["success"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert new_info["state_key"] == info["state_key"]
    assert new_obs.startswith("Unknown action") and "up, down, left, right" in new_obs
    assert new_obs.endswith(obs) and len(new_obs) < len(obs) + 120


def next_to_wall(level: Map, board: Board) -> str | None:
    (r, c), _ = board
    return next((a for a, (dr, dc) in STEP.items() if (r + dr, c + dc) in level.walls), None)


def test_wall_bump_and_case_insensitive_actions():
    env = agentgym.make("sokoban-v0")
    first_board(env, range(9, 40), lambda level, board: next_to_wall(level, board) is not None)
    obs = env.render()
    wall = next_to_wall(Map(obs), Map(obs).start)
    new_obs, _, _, _, info = env.step(wall)
    assert info["invalid_action"] and new_obs == "You bumped into a wall.\n" + obs
    assert wall not in info["admissible_actions"]
    allowed = info["admissible_actions"][0]
    *_, moved = env.step(f"\t{allowed.capitalize()}  ")
    assert not moved["invalid_action"] and moved["state_key"] != info["state_key"]


def test_admissible_actions_are_exactly_the_allowed_moves():
    env = agentgym.make("sokoban-v0", num_boxes=2, max_turns=100)
    _, info = env.reset(seed=12)
    rng = np.random.default_rng(2)
    for _ in range(60):
        if env.episode_over:
            break
        level = Map(env.render())
        assert info["admissible_actions"] == [a for a in STEP if level.move(level.start, a) is not None]
        *_, info = env.step(list(STEP)[rng.integers(4)])


@pytest.mark.parametrize("shaping", [False, True])
def test_rewards(shaping):
    env = agentgym.make("sokoban-v0", reward_shaping=shaping)
    first_board(env, range(3, 40), lambda level, board: next_to_wall(level, board) is not None)
    level = Map(env.render())
    rewards = [env.step(next_to_wall(level, level.start))[1]]
    while not env.episode_over:
        rewards.append(env.step(env.expert_action())[1])
    if not shaping:
        assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
    else:
        # One box: the last push puts it on its goal (+0.1) and solves the level (+1.0).
        assert rewards[:-1] == pytest.approx([-0.01] * (len(rewards) - 1))
        assert rewards[-1] == pytest.approx(1.0 + 0.1 - 0.01)


def test_shaping_penalises_pushing_a_box_off_its_goal():
    env = agentgym.make("sokoban-v0", num_boxes=2, reward_shaping=True)

    def off_goal_push(level: Map, board: Board) -> bool:
        return any(
            level.move(board, a) and len(level.move(board, a)[1] & level.goals) < len(board[1] & level.goals)
            for a in STEP
        )

    first_board(env, range(40), off_goal_push)
    level = Map(env.render())
    action = next(
        a
        for a in STEP
        if level.move(level.start, a)
        and len(level.move(level.start, a)[1] & level.goals) < len(level.start[1] & level.goals)
    )
    obs, reward, *_ = env.step(action)
    assert "off its goal" in obs
    assert reward == pytest.approx(-0.1 - 0.01)


def test_infos_are_json_safe_and_complete():
    env = agentgym.make("sokoban-v0")
    _, info = env.reset(seed=0)
    assert {"state_key", "task_id", "admissible_actions", "invalid_action", "success", "instructions"} <= set(
        info
    )
    for symbol in "#_OX*PS":
        assert f"'{symbol}'" in info["instructions"]
    json.dumps(info)
    *_, step_info = env.step("down")
    assert set(step_info) == {"state_key", "task_id", "admissible_actions", "invalid_action", "success"}
    json.dumps(step_info)


def test_snapshot_restores_on_a_fresh_instance():
    env = SokobanEnv(num_boxes=2)
    env.reset(seed=21)
    for action in ["up", "down", "left", "right", "left", "up"]:
        env.step(action)
    copy = SokobanEnv(num_boxes=2)
    copy.restore(env.snapshot())
    assert copy.render() == env.render()
    assert copy.np_random.bit_generator.state == env.np_random.bit_generator.state
    moves = ["up", "right", "jump", "down", "left", "left", "down", "down"]
    assert [copy.step(a) for a in moves] == [env.step(a) for a in moves]
    assert copy.expert_action() == env.expert_action()
    assert copy.reset() == env.reset()
    with pytest.raises(agentgym.ConfigError):
        SokobanEnv().restore(pickle.dumps({"kind": "agentgym.maze/1"}))


@pytest.mark.parametrize("mode", ["snapshot", "replay"])
def test_fork_continues_identically(mode):
    env = agentgym.make("sokoban-v0")
    env.reset(seed=31)
    run(env, ["right", "down", "down", "left"])
    child = env.fork(mode)
    assert child.turn == env.turn
    moves = ["up", "left", "xyz", "down", "right", "right", "down", "up", "up"]
    assert run(child, moves) == run(env, moves)
    assert child.reset() == env.reset()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 4},
        {"size": 11},
        {"size": 6.0},
        {"num_boxes": 0},
        {"num_boxes": 5},
        {"num_boxes": False},
        {"max_generation_tries": 0},
        {"max_generation_tries": 10**6},
        {"reward_shaping": "yes"},
    ],
)
def test_bad_arguments_are_config_errors(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(agentgym.ConfigError, match=name):
        agentgym.make("sokoban-v0", **kwargs)


def test_check_env_passes():
    agentgym.check_env("sokoban-v0")
    agentgym.check_env(lambda: agentgym.make("sokoban-v0", num_boxes=2, reward_shaping=True))
