"""``frozenlake-v0``: Gymnasium FrozenLake on a map generated from the seed, with a shortest-path expert."""

from __future__ import annotations

import functools
from collections import deque
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLakeEnv
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from agentgym.envs.games.toytext import ToyTextEnv
from agentgym.errors import ConfigError

# --- frozenlake-v0 -------------------------------------------------------------------------------

LAKE_ACTIONS: tuple[str, ...] = ("left", "down", "right", "up")
MIN_LAKE_SIZE, MAX_LAKE_SIZE = 2, 12
MIN_FROZEN_P = 0.6  # below this, valid maps get rare and generate_random_map retries for long
_LAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # in LAKE_ACTIONS order


@functools.lru_cache(maxsize=256)
def _lake_map(size: int, p: float, seed: int) -> tuple[str, ...]:
    # GRPO groups replay one map many times; generating it once per process is enough.
    return tuple(generate_random_map(size=size, p=p, seed=seed))


@functools.lru_cache(maxsize=256)
def _shortest_path_policy(desc: tuple[str, ...]) -> tuple[int, ...]:
    """Per square, the first action (``LAKE_ACTIONS`` order) of a shortest hole-free path to G (-1: none)."""
    rows, cols = len(desc), len(desc[0])
    goal = next((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "G")
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in _LAKE_MOVES:
            q = (r + dr, c + dc)
            if 0 <= q[0] < rows and 0 <= q[1] < cols and desc[q[0]][q[1]] != "H" and q not in dist:
                dist[q] = dist[(r, c)] + 1
                queue.append(q)
    policy = []
    for r in range(rows):
        for c in range(cols):
            here = dist.get((r, c))
            move = -1
            if here and desc[r][c] != "H":
                for a, (dr, dc) in enumerate(_LAKE_MOVES):
                    if dist.get((r + dr, c + dc)) == here - 1:
                        move = a
                        break
            policy.append(move)
    return tuple(policy)


@functools.lru_cache(maxsize=64)
def _value_iteration_policy(desc: tuple[str, ...], success_rate: float) -> tuple[int, ...]:
    """Greedy policy of value iteration on the slippery lake's known model (gamma 0.99).

    A discount below 1 breaks ties towards reaching the goal sooner: with gamma 1, an action that
    bumps into the edge forever would score as well as one that makes progress.
    """
    model = GymFrozenLakeEnv(desc=list(desc), is_slippery=True, success_rate=success_rate).P
    num_states, num_actions, gamma = len(model), len(LAKE_ACTIONS), 0.99
    width = max(len(model[s][a]) for s in range(num_states) for a in range(num_actions))
    prob = np.zeros((num_states, num_actions, width))
    succ = np.zeros((num_states, num_actions, width), dtype=np.int64)
    reward = np.zeros((num_states, num_actions, width))
    going_on = np.zeros((num_states, num_actions, width))
    for s in range(num_states):
        for a in range(num_actions):
            for k, (p, s2, r, done) in enumerate(model[s][a]):
                prob[s, a, k], succ[s, a, k], reward[s, a, k], going_on[s, a, k] = p, s2, r, not done
    value = np.zeros(num_states)
    for _ in range(100_000):
        q = (prob * (reward + gamma * going_on * value[succ])).sum(axis=2)
        new_value = q.max(axis=1)
        if np.max(np.abs(new_value - value)) < 1e-12:
            break
        value = new_value
    # The first action within 1e-9 of the best, so float noise cannot flip ties between machines.
    return tuple(int(np.flatnonzero(q[s] >= q[s].max() - 1e-9)[0]) for s in range(num_states))


def format_lake_name(size: int, p: float, is_slippery: bool) -> str:
    """The task-id prefix of a frozen-lake configuration.

    Example:
        >>> format_lake_name(4, 0.8, False)
        'frozenlake/size4/p0.8'
    """
    return f"frozenlake/size{size}/p{float(p)!r}" + ("/slippery" if is_slippery else "")


class FrozenLakeEnv(ToyTextEnv):
    """Cross a frozen lake without falling into a hole; each map is generated from the seed.

    The map (Gymnasium's ``generate_random_map(size, p, seed)``) is drawn as a grid: ``S`` start
    (top left), ``F`` frozen, ``H`` hole, ``G`` goal (bottom right) and ``P`` the agent. Reward 1.0
    on reaching the goal, 0.0 otherwise; falling into a hole ends the episode. Walking off the edge
    leaves the agent in place (a valid move). ``task_id``: ``"frozenlake/size4/p0.8/<seed>"``
    (``.../slippery/<seed>`` on slippery ice). Expert: a shortest hole-free path on firm ice, the
    value-iteration policy on the known transition model on slippery ice.

    Args:
        size: Squares per side, in ``[2, 12]``.
        p: Probability that a square is frozen (not a hole), in ``[0.6, 1.0]``.
        is_slippery: On slippery ice a move goes the chosen way with probability 1/3 and to either
            side otherwise (Gymnasium's rule).

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = FrozenLakeEnv()
        >>> obs, info = env.reset(seed=3)
        >>> print(obs)
        PFHF
        FFFF
        FFFF
        FFFG
        You are at row 1, column 1.
        >>> info["state_key"], env.expert_action()
        ('frozenlake/size4/p0.8/3@0', 'down')
    """

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = False) -> None:
        if (
            isinstance(size, bool)
            or not isinstance(size, (int, np.integer))
            or not MIN_LAKE_SIZE <= size <= MAX_LAKE_SIZE
        ):
            raise ConfigError(f"size must be an integer in [{MIN_LAKE_SIZE}, {MAX_LAKE_SIZE}], got {size!r}")
        if (
            isinstance(p, bool)
            or not isinstance(p, (int, float, np.integer, np.floating))
            or not MIN_FROZEN_P <= p <= 1.0  # also rejects NaN
        ):
            raise ConfigError(f"p must be a number in [{MIN_FROZEN_P}, 1.0], got {p!r}")
        if not isinstance(is_slippery, (bool, np.bool_)):
            raise ConfigError(f"is_slippery must be a bool, got {is_slippery!r}")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        # On slippery ice the planner's best move can still slide into a hole.
        self.expert_solves_every_task = not self.is_slippery  # type: ignore[misc]
        slip = (
            " The ice is slippery: you move the way you chose only 1 time in 3; otherwise you slide "
            "to one side of it (left or right of the chosen direction)." if self.is_slippery else ""
        )
        super().__init__(
            self._build,
            LAKE_ACTIONS,
            expert=self._expert_move,
            name=format_lake_name(self.size, self.p, self.is_slippery),
            instructions=(
                "You are crossing a frozen lake drawn as a grid of letters: S is the start, F frozen "
                "ice (safe), H a hole, G the goal and P you; row 1 is the top line. Each turn you "
                "move one square; moving off the edge leaves you where you are. Reach G without "
                f"falling into a hole.{slip} Answer with exactly one of: {', '.join(LAKE_ACTIONS)}."
            ),
        )

    def _build(self, seed: int) -> gymnasium.Env:
        desc = _lake_map(self.size, self.p, seed)
        return GymFrozenLakeEnv(desc=list(desc), is_slippery=self.is_slippery)

    def _desc(self) -> tuple[str, ...]:
        gym_env = self._gym
        return tuple(row.tobytes().decode() for row in gym_env.unwrapped.desc)  # type: ignore[attr-defined]

    def describe(self, obs: Any, *, terminated: bool) -> str:
        desc = self._desc()
        r, c = divmod(int(obs), len(desc[0]))
        rows = list(desc)
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        square = desc[r][c]
        if square == "H":
            where = "You fell into a hole."
        elif square == "G":
            where = "You reached the goal!"
        else:
            where = f"You are at row {r + 1}, column {c + 1}."
        return "\n".join(rows) + "\n" + where

    def _expert_move(self, gym_env: gymnasium.Env, obs: Any) -> int | None:
        desc = self._desc()
        if self.is_slippery:
            policy = _value_iteration_policy(desc, 1.0 / 3.0)
        else:
            policy = _shortest_path_policy(desc)
        move = policy[int(obs)]
        return None if move < 0 else move
