"""``MazeEnv`` (``maze-v0``): a text gridworld maze generated from the seed."""

from __future__ import annotations

import functools
import math
import re
from collections import deque
from typing import Any, ClassVar, Literal

import numpy as np

from agentgym.core import Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

ObservationMode = Literal["grid", "local"]

ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
MIN_SIZE, MAX_SIZE = 2, 25
WALL, FLOOR, PLAYER, GOAL = "#", "_", "P", "G"

_ACTION_INDEX = {name: i for i, name in enumerate(ACTIONS)}
_ACTION_LIST = ", ".join(ACTIONS)
# Only the canonical spelling is accepted, so one level has exactly one task_id (and state_keys).
_TASK_RE = re.compile(r"maze/size(\d+)/loop([0-9.]+)/(\d+)")
# A valid action is a short word; longer strings are echoed only in part.
_ECHO_CHARS = 20

_INSTRUCTIONS = {
    "grid": (
        "You are in a maze drawn as a grid of characters: '#' is a wall, '_' is open floor, "
        "'P' is you and 'G' is the goal; up is towards the top line. Each turn you move one "
        "square; you cannot walk through walls. Reach G in as few moves as you can. "
        f"Answer with exactly one of: {_ACTION_LIST}."
    ),
    "local": (
        "You are in a maze. Each turn you see the 3x3 squares around you ('#' wall, '_' open "
        "floor, 'P' you in the centre, 'G' the goal when it is next to you) and where the goal is "
        "relative to you. Each turn you move one square; you cannot walk through walls. Reach the "
        f"goal in as few moves as you can. Answer with exactly one of: {_ACTION_LIST}."
    ),
}


def format_task_id(size: int, loop_fraction: float, seed: int) -> str:
    """The canonical task id of a maze level.

    Example:
        >>> format_task_id(4, 0.15, 123)
        'maze/size4/loop0.15/123'
    """
    return f"maze/size{size}/loop{float(loop_fraction)!r}/{seed}"


def parse_task_id(task_id: Any) -> tuple[int, float, int]:
    """``(size, loop_fraction, seed)`` of a task id written by ``format_task_id``.

    Raises:
        ConfigError: ``task_id`` is not a canonical maze task id or its parameters are out of range.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(
            f"malformed maze task_id {task_id!r}: expected 'maze/size<N>/loop<fraction>/<seed>', "
            "e.g. 'maze/size4/loop0.15/123'"
        )
    try:
        loop_fraction = float(match.group(2))
    except ValueError:
        loop_fraction = math.nan
    size, seed = int(match.group(1)), int(match.group(3))
    _check_size(size, "task_id size")
    _check_loop_fraction(loop_fraction, "task_id loop")
    canonical = format_task_id(size, loop_fraction, seed)
    if canonical != task_id:
        raise ConfigError(f"maze task_id {task_id!r} is not canonical; write it as {canonical!r}")
    return size, loop_fraction, seed


def _check_size(size: Any, name: str = "size") -> None:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not MIN_SIZE <= size <= MAX_SIZE:
        raise ConfigError(f"{name} must be an integer in [{MIN_SIZE}, {MAX_SIZE}], got {size!r}")


def _check_loop_fraction(value: Any, name: str = "loop_fraction") -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not 0.0 <= value <= 1.0  # also rejects NaN
    ):
        raise ConfigError(f"{name} must be a number in [0.0, 1.0], got {value!r}")


class _Level:
    """One generated maze: immutable after construction except for lazily filled caches."""

    def __init__(self, size: int, loop_fraction: float, seed: int) -> None:
        self.task_id = format_task_id(size, loop_fraction, seed)
        width = self.width = 2 * size + 1
        rng = np.random.default_rng(seed)
        is_open = bytearray(width * width)
        cells = [(2 * i + 1) * width + 2 * j + 1 for i in range(size) for j in range(size)]
        for p in cells:
            is_open[p] = 1
        # Walls between neighbouring cells, in a fixed order so the permutation alone decides.
        walls: list[tuple[int, int, int]] = []
        for i in range(size):
            for j in range(size):
                a = i * size + j
                if j + 1 < size:
                    walls.append((a, a + 1, cells[a] + 1))
                if i + 1 < size:
                    walls.append((a, a + size, cells[a] + width))
        # Randomised Kruskal: a perfect maze (exactly one path between any two cells).
        parent = list(range(size * size))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        kept: list[int] = []
        for k in rng.permutation(len(walls)).tolist():
            a, b, between = walls[k]
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
                is_open[between] = 1
            else:
                kept.append(between)
        # Removing some of the remaining walls adds loops, so several paths reach the goal.
        num_extra = round(loop_fraction * len(kept))
        for k in rng.permutation(len(kept))[:num_extra].tolist():
            is_open[kept[k]] = 1

        deltas = (-width, width, -1, 1)
        self.moves: list[tuple[int, int, int, int] | None] = [None] * (width * width)
        self.admissible: list[tuple[str, ...]] = [()] * (width * width)
        for p in range(width * width):
            if is_open[p]:
                nbrs = tuple(p + d if is_open[p + d] else -1 for d in deltas)
                self.moves[p] = nbrs  # type: ignore[assignment]
                self.admissible[p] = tuple(ACTIONS[a] for a in range(4) if nbrs[a] >= 0)

        self.start = cells[int(rng.integers(len(cells)))]
        from_start = self._distances(self.start)
        # The farthest cell (first in row-major order on ties) makes the longest shortest path.
        self.goal = max(cells, key=lambda p: (from_start[p], -p))
        self._to_goal: list[int] | None = None

        rows = [
            "".join(FLOOR if is_open[r * width + c] else WALL for c in range(width)) for r in range(width)
        ]
        gr, gc = divmod(self.goal, width)
        rows[gr] = rows[gr][:gc] + GOAL + rows[gr][gc + 1 :]
        self.rows = rows
        self.text = "\n".join(rows)
        self._state_keys: dict[int, str] = {}

    def _distances(self, source: int) -> list[int]:
        dist = [-1] * (self.width * self.width)
        dist[source] = 0
        queue = deque([source])
        moves = self.moves
        while queue:
            p = queue.popleft()
            for q in moves[p]:  # type: ignore[union-attr]
                if q >= 0 and dist[q] < 0:
                    dist[q] = dist[p] + 1
                    queue.append(q)
        return dist

    @property
    def to_goal(self) -> list[int]:
        """Moves from each square to the goal (-1 for walls)."""
        if self._to_goal is None:
            self._to_goal = self._distances(self.goal)
        return self._to_goal

    def state_key(self, pos: int) -> str:
        key = self._state_keys.get(pos)
        if key is None:
            r, c = divmod(pos, self.width)
            key = self._state_keys[pos] = f"{self.task_id}@({r},{c})"
        return key

    def render(self, pos: int) -> str:
        # Square p sits at p + row in the text: each line ends in a newline.
        i = pos + pos // self.width
        return self.text[:i] + PLAYER + self.text[i + 1 :]

    def render_local(self, pos: int) -> str:
        r, c = divmod(pos, self.width)
        rows = self.rows
        window = (f"{rows[r - 1][c - 1 : c + 2]}\n"
                  f"{rows[r][c - 1]}{PLAYER}{rows[r][c + 1]}\n"
                  f"{rows[r + 1][c - 1 : c + 2]}")
        gr, gc = divmod(self.goal, self.width)
        parts = []
        if gr != r:
            parts.append(f"{abs(gr - r)} {'down' if gr > r else 'up'}")
        if gc != c:
            parts.append(f"{abs(gc - c)} {'right' if gc > c else 'left'}")
        where = f"The goal is {' and '.join(parts)}." if parts else "You are on the goal."
        return f"{window}\n{where}"


@functools.lru_cache(maxsize=256)
def _level(size: int, loop_fraction: float, seed: int) -> _Level:
    # GRPO groups replay one level many times; generating it once per process is enough.
    return _Level(size, loop_fraction, seed)


class MazeEnv(Env):
    """Find the way through a maze drawn in text; each level is generated from the seed.

    The maze has ``size`` x ``size`` cells drawn on a ``(2*size+1)``-character square grid
    (``#`` wall, ``_`` floor, ``P`` the agent, ``G`` the goal); each action moves one character.
    The goal is the cell farthest from the start. Reward 1.0 on reaching the goal (the episode
    terminates), 0.0 otherwise. Walking into a wall or an unknown action changes nothing and sets
    ``info["invalid_action"]``. ``info["task_id"]`` (``"maze/size4/loop0.15/123"``) names the
    level; ``reset(options={"task_id": ...})`` plays it again.

    Args:
        size: Maze cells per side, in ``[2, 25]``.
        loop_fraction: Fraction of the walls left after carving a perfect maze that are removed
            again, in ``[0, 1]``; above 0 there are several paths to the goal.
        observation: ``"grid"`` shows the whole map; ``"local"`` shows the 3x3 squares around the
            agent and the goal's offset.

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = MazeEnv(size=2)
        >>> obs, info = env.reset(seed=0)
        >>> print(obs)
        #####
        #__P#
        #_#_#
        #G#_#
        #####
        >>> info["state_key"], info["admissible_actions"]
        ('maze/size2/loop0.15/0@(1,3)', ['down', 'left'])
        >>> env.expert_action()
        'left'
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(
        self, size: int = 4, loop_fraction: float = 0.15, observation: ObservationMode = "grid"
    ) -> None:
        _check_size(size)
        _check_loop_fraction(loop_fraction)
        if observation not in _INSTRUCTIONS:
            raise ConfigError(f"observation must be 'grid' or 'local', got {observation!r}")
        self.size = int(size)
        self.loop_fraction = float(loop_fraction)
        self.observation = observation
        self._level: _Level | None = None
        self._pos = -1

    def parse_task_id(self, task_id: Any) -> tuple[int, float, int]:
        """``(size, loop_fraction, level_seed)`` of a maze task id (any size, not only this env's)."""
        return parse_task_id(task_id)

    def choose_task(self, seed: int | None) -> tuple[int, float, int]:
        """This env's size and loop fraction, generated from the seed."""
        return self.size, self.loop_fraction, self.seed_or_draw(seed, 2**63)

    def start_task(self, task: tuple[int, float, int], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        size, loop_fraction, level_seed = task
        self._level = _level(size, loop_fraction, int(level_seed))
        self._pos = self._level.start
        info = self._info(invalid=False, success=False)
        info["instructions"] = _INSTRUCTIONS[self.observation]
        return self._observe(), info

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: the level of this env's size and loop fraction generated from the seed."""
        seed = int(split.seed_of(index))  # type: ignore[arg-type]
        return {"task_id": format_task_id(self.size, self.loop_fraction, seed),
                "description": f"{self.size}x{self.size} maze generated from seed {seed}"}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        level = self._level
        text = action.strip() if isinstance(action, str) else ""
        move = _ACTION_INDEX.get(text.lower()) if len(text) <= 5 else None
        reached = False
        invalid = True
        if move is None:
            shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
            message = f"Unknown action {shown!r}. Valid actions: {_ACTION_LIST}."
        else:
            target = level.moves[self._pos][move]  # type: ignore[index]
            if target < 0:
                message = "You bumped into a wall."
            else:
                self._pos, invalid = target, False
                reached = target == level.goal
                message = "You reached the goal!" if reached else f"You moved {ACTIONS[move]}."
        terminated = self._pos == level.goal
        info = self._info(invalid=invalid, success=terminated)
        return f"{message}\n{self._observe()}", (1.0 if reached else 0.0), terminated, False, info

    def expert_action(self) -> str | None:
        """First move of a shortest path to the goal (``up`` < ``down`` < ``left`` < ``right`` on ties)."""
        level = self._level
        dist = level.to_goal
        here = dist[self._pos]
        if here <= 0:
            return None
        for a, q in enumerate(level.moves[self._pos]):  # type: ignore[arg-type]
            if q >= 0 and dist[q] == here - 1:
                return ACTIONS[a]
        return None

    def snapshot(self) -> bytes:
        """The level, the agent's position and ``np_random`` as pickled bytes."""
        level = self._level
        return pack_snapshot(self, {"task_id": level.task_id, "pos": self._pos})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        level = _level(*parse_task_id(state["task_id"]))
        self._level, self._pos = level, int(state["pos"])

    def render(self) -> str | None:
        """The full map (whatever the observation mode), or ``None`` before the first reset."""
        return None if self._level is None else self._level.render(self._pos)

    # --- helpers ---------------------------------------------------------------------------------

    def _observe(self) -> str:
        level = self._level
        assert level is not None
        return level.render(self._pos) if self.observation == "grid" else level.render_local(self._pos)

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        level = self._level
        assert level is not None
        return {
            "state_key": level.state_key(self._pos),
            "task_id": level.task_id,
            "admissible_actions": list(level.admissible[self._pos]),
            "invalid_action": invalid,
            "success": success,
        }
