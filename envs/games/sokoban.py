"""``SokobanEnv`` (``sokoban-v0``): text Sokoban on generated levels that a solver has verified."""

from __future__ import annotations

import heapq
import re
import threading
from collections import OrderedDict, deque
from typing import Any, ClassVar

import numpy as np

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_int
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
MIN_SIZE, MAX_SIZE = 5, 10
MAX_BOXES = 4
MAX_GENERATION_TRIES = 10_000
#: Levels whose optimal solution is shorter than this are regenerated.
MIN_SOLUTION_MOVES = 4
#: Levels whose optimal solution is longer than this are regenerated (``sokoban-v0`` allows 60 turns).
MAX_SOLUTION_MOVES = 45
#: States the solver expands before it gives up on one query.
SEARCH_LIMIT = 200_000
WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL = "#", "_", "O", "X", "*", "P", "S"

State = tuple[int, tuple[int, ...]]
"""``(player, boxes)``: flat grid indices, boxes sorted, so equal states compare equal."""

_ACTION_INDEX = {name: i for i, name in enumerate(ACTIONS)}
_ACTION_LIST = ", ".join(ACTIONS)
_TASK_RE = re.compile(r"sokoban/size(\d+)/boxes(\d+)/(\d+)")
_ECHO_CHARS = 20
_UNREACHABLE = 1 << 30
_PULL_PROBABILITY = 0.6
_PULL_ROUNDS_PER_BOX = 3
_LEVEL_CACHE_SIZE = 256

_INSTRUCTIONS = (
    "You are playing Sokoban. Push every box onto a goal. The map uses these symbols: '#' wall, "
    "'_' floor, 'O' goal, 'X' box, '*' box on a goal, 'P' you, 'S' you standing on a goal; up is "
    "towards the top line. Each turn you move one square. Walking into a box pushes it one square "
    "if the square behind it is free; you cannot pull boxes, and a box pushed into a corner that "
    f"is not a goal is stuck for good. Answer with exactly one of: {_ACTION_LIST}."
)


def format_task_id(size: int, num_boxes: int, seed: int) -> str:
    """The canonical task id of a Sokoban level.

    Example:
        >>> format_task_id(6, 1, 123)
        'sokoban/size6/boxes1/123'
    """
    return f"sokoban/size{size}/boxes{num_boxes}/{seed}"


def parse_task_id(task_id: Any) -> tuple[int, int, int]:
    """``(size, num_boxes, seed)`` of a task id written by ``format_task_id``.

    Raises:
        ConfigError: ``task_id`` is not a canonical Sokoban task id or its parameters are out of range.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(
            f"malformed sokoban task_id {task_id!r}: expected 'sokoban/size<N>/boxes<K>/<seed>', "
            "e.g. 'sokoban/size6/boxes1/123'"
        )
    size, num_boxes, seed = (int(g) for g in match.groups())
    check_int(size, "task_id size", MIN_SIZE, MAX_SIZE)
    check_int(num_boxes, "task_id boxes", 1, MAX_BOXES)
    canonical = format_task_id(size, num_boxes, seed)
    if canonical != task_id:
        raise ConfigError(f"sokoban task_id {task_id!r} is not canonical; write it as {canonical!r}")
    return size, num_boxes, seed



class _Level:
    """The static part of one level (room, goals, start) plus caches filled on demand."""

    def __init__(
        self, task_id: str, size: int, floor: bytearray, goals: tuple[int, ...], attempt: int
    ) -> None:
        self.task_id = task_id
        self.attempt = attempt
        width = self.width = size + 2
        self.deltas = (-width, width, -1, 1)
        self.floor = floor
        self.goals = goals
        self.is_goal = bytearray(width * width)
        for g in goals:
            self.is_goal[g] = 1
        self.push_distance = self._push_distances()
        self.start: State = (-1, ())
        # Next move of an optimal plan by state (-1: none). Shared by every env playing the level
        # in this process; among equally short plans, the first one found is kept.
        self.plans: dict[State, int] = {}
        self._lock = threading.Lock()
        base = [
            [
                WALL if not floor[r * width + c] else GOAL if self.is_goal[r * width + c] else FLOOR
                for c in range(width)
            ]
            for r in range(width)
        ]
        self.base_chars = list("\n".join("".join(row) for row in base))
        # Where square p sits in the map text (each line ends in a newline), and its "(row,col)".
        self.text_index = [(p // width) * (width + 1) + p % width for p in range(width * width)]
        self.coords = [f"({p // width},{p % width})" for p in range(width * width)]

    def _push_distances(self) -> list[int]:
        """Fewest pushes that bring a lone box from each square to some goal (``_UNREACHABLE``: never).

        Computed backwards from the goals: a box at ``b`` came from ``b - d`` pushed by a player
        standing at ``b - 2d``. Squares a box can never leave for a goal are simple deadlocks.
        """
        width, floor = self.width, self.floor
        dist = [_UNREACHABLE] * (width * width)
        queue = deque(self.goals)
        for g in self.goals:
            dist[g] = 0
        while queue:
            b = queue.popleft()
            for d in self.deltas:
                a = b - d
                if floor[a] and floor[a - d] and dist[a] == _UNREACHABLE:
                    dist[a] = dist[b] + 1
                    queue.append(a)
        return dist

    def frozen(self, box: int, boxes: tuple[int, ...]) -> bool:
        """True when ``box`` is in a 2x2 block of walls and boxes that holds a box off its goal.

        No box in such a block can ever move again (each is blocked on both axes).
        """
        width, floor = self.width, self.floor
        for corner in (box, box - 1, box - width, box - width - 1):
            block = (corner, corner + 1, corner + width, corner + width + 1)
            if all(not floor[c] or c in boxes for c in block) and any(
                floor[c] and not self.is_goal[c] for c in block
            ):
                return True
        return False

    def stuck(self, boxes: tuple[int, ...]) -> bool:
        """True when a simple deadlock (dead square or frozen 2x2 block) makes the level unsolvable."""
        dist = self.push_distance
        return any(not self.is_goal[b] and (dist[b] == _UNREACHABLE or self.frozen(b, boxes)) for b in boxes)

    def solve(self, state: State, limit: int = SEARCH_LIMIT) -> list[tuple[State, int]] | None:
        """An optimal plan from ``state`` as ``(state, action index)`` pairs, or ``None``.

        A* over ``(player, boxes)`` with one unit of cost per move. The heuristic, the sum of each
        box's push distance to its nearest goal, changes by at most 1 per move, so it is consistent
        and the first goal state popped is optimal. ``None``: unsolvable, or more than ``limit``
        states expanded.
        """
        dist, floor, deltas = self.push_distance, self.floor, self.deltas
        player, boxes = state
        if self.stuck(boxes):
            return None
        h0 = sum(dist[b] for b in boxes)
        if h0 == 0:
            return []
        best_cost = {state: 0}
        parent: dict[State, tuple[State, int]] = {}
        # (f, -g, counter): deeper nodes first among equal f; the counter keeps the order total.
        heap = [(h0, 0, 0, player, boxes, h0)]
        counter = expanded = 0
        while heap:
            _, neg_g, _, p, bx, h = heapq.heappop(heap)
            g = -neg_g
            here = (p, bx)
            if best_cost[here] < g:
                continue
            if h == 0:
                plan: list[tuple[State, int]] = []
                while here != state:
                    prev, action = parent[here]
                    plan.append((prev, action))
                    here = prev
                plan.reverse()
                return plan
            expanded += 1
            if expanded > limit:
                return None
            for action, d in enumerate(deltas):
                q = p + d
                if not floor[q]:
                    continue
                if q in bx:
                    r = q + d
                    if not floor[r] or r in bx or dist[r] == _UNREACHABLE:
                        continue
                    nbx = tuple(sorted([r if b == q else b for b in bx])) if len(bx) > 1 else (r,)
                    if not self.is_goal[r] and self.frozen(r, nbx):
                        continue
                    nh = h - dist[q] + dist[r]
                else:
                    nbx, nh = bx, h
                nxt = (q, nbx)
                known = best_cost.get(nxt)
                if known is not None and known <= g + 1:
                    continue
                best_cost[nxt] = g + 1
                parent[nxt] = (here, action)
                counter += 1
                heapq.heappush(heap, (g + 1 + nh, -(g + 1), counter, q, nbx, nh))
        return None

    def plan_action(self, state: State) -> int:
        """The first move of an optimal plan from ``state`` (-1: none), cached by state."""
        action = self.plans.get(state)
        if action is None:
            plan = self.solve(state)
            with self._lock:
                if plan is None:
                    self.plans[state] = -1
                else:
                    # Every suffix of an optimal plan is optimal, so each state on it is answered.
                    for on_path, step_action in plan:
                        self.plans.setdefault(on_path, step_action)
            action = self.plans.get(state, -1)
        return action


def _generate(size: int, num_boxes: int, seed: int, max_tries: int) -> _Level:
    task_id = format_task_id(size, num_boxes, seed)
    for attempt in range(max_tries):
        # Each attempt draws from its own stream, so attempt k is the same whatever came before.
        level = _attempt_level(task_id, size, num_boxes, np.random.default_rng([seed, attempt]), attempt)
        if level is not None:
            return level
    raise _generation_error(size, num_boxes, seed, max_tries)


def _generation_error(size: int, num_boxes: int, seed: int, max_tries: int) -> ConfigError:
    return ConfigError(
        f"could not generate a solvable Sokoban level with size={size}, num_boxes={num_boxes} from "
        f"seed {seed} in max_generation_tries={max_tries}; raise max_generation_tries or lower num_boxes"
    )


def _reachable(floor: bytearray, boxes: set[int], start: int, width: int) -> set[int]:
    seen = {start}
    stack = [start]
    while stack:
        p = stack.pop()
        for q in (p - width, p + width, p - 1, p + 1):
            if floor[q] and q not in seen and q not in boxes:
                seen.add(q)
                stack.append(q)
    return seen


def _attempt_level(
    task_id: str, size: int, num_boxes: int, rng: np.random.Generator, attempt: int
) -> _Level | None:
    width = size + 2
    floor = bytearray(width * width)
    interior = [r * width + c for r in range(1, size + 1) for c in range(1, size + 1)]
    for p in interior:
        floor[p] = 1
    # Internal walls, each kept only if the floor stays in one piece.
    num_walls = size + int(rng.integers(size))
    placed, count = 0, len(interior)
    for p in rng.permutation(interior).tolist():
        if placed == num_walls:
            break
        floor[p] = 0
        anchor = next(q for q in interior if floor[q])
        if len(_reachable(floor, set(), anchor, width)) == count - 1:
            placed, count = placed + 1, count - 1
        else:
            floor[p] = 1
    cells = [p for p in interior if floor[p]]
    if len(cells) < num_boxes + 2:
        return None
    picks = rng.permutation(len(cells))[: num_boxes + 1].tolist()
    goals = tuple(sorted(cells[i] for i in picks[:num_boxes]))
    level = _Level(task_id, size, floor, goals, attempt)

    # Reverse play from the solved position: every pull is a push played backwards, so every
    # state it reaches is solvable. Each round the player walks to some box and pulls it one or
    # more squares in a straight line; the state whose boxes are farthest from the goals is kept.
    player, boxes = cells[picks[num_boxes]], set(goals)
    dist, deltas = level.push_distance, level.deltas
    best: State | None = None
    best_score = 0
    for _ in range(_PULL_ROUNDS_PER_BOX * num_boxes):
        reach = _reachable(floor, boxes, player, width)
        options = [
            (b, d)
            for b in sorted(boxes)
            for d in deltas
            if b + d in reach and floor[b + 2 * d] and b + 2 * d not in boxes
        ]
        if not options:
            break
        box, d = options[int(rng.random() * len(options))]
        while True:
            boxes.remove(box)
            box += d
            boxes.add(box)
            player = box + d
            if not floor[player + d] or player + d in boxes or rng.random() >= _PULL_PROBABILITY:
                break
        score = sum(dist[b] for b in boxes)
        if score > best_score:
            best, best_score = (player, tuple(sorted(boxes))), score
    if best is None:
        return None
    # The player starts anywhere it could have walked to, so the first moves are a choice too.
    region = sorted(_reachable(floor, set(best[1]), best[0], width))
    best = (region[int(rng.random() * len(region))], best[1])
    plan = level.solve(best)
    if plan is None or not MIN_SOLUTION_MOVES <= len(plan) <= MAX_SOLUTION_MOVES:
        return None
    level.start = best
    for on_path, action in plan:
        level.plans[on_path] = action
    return level


_cache: OrderedDict[tuple[int, int, int], _Level] = OrderedDict()
_cache_lock = threading.Lock()


def _level(size: int, num_boxes: int, seed: int, max_tries: int) -> _Level:
    """The level of ``(size, num_boxes, seed)``, from a small LRU cache (GRPO groups replay levels)."""
    key = (size, num_boxes, seed)
    with _cache_lock:
        level = _cache.get(key)
        if level is not None:
            _cache.move_to_end(key)
    if level is None:
        level = _generate(size, num_boxes, seed, max_tries)
        with _cache_lock:
            _cache[key] = level
            while len(_cache) > _LEVEL_CACHE_SIZE:
                _cache.popitem(last=False)
    elif level.attempt >= max_tries:
        # Same answer as generating afresh with this smaller budget would give.
        raise _generation_error(size, num_boxes, seed, max_tries)
    return level


class SokobanEnv(Env):
    """Push every box onto a goal; levels are generated from the seed and verified solvable.

    The room is ``size`` x ``size`` squares inside a wall border. Symbols: ``#`` wall, ``_``
    floor, ``O`` goal, ``X`` box, ``*`` box on a goal, ``P`` player, ``S`` player on a goal. A
    level is built by pulling boxes away from their goals (reverse play), then an optimal solver
    confirms it and rejects levels solved in fewer than ``MIN_SOLUTION_MOVES`` or more than
    ``MAX_SOLUTION_MOVES`` moves. Walking into a wall, pushing a box into a wall or a box, or an
    unknown action changes nothing and sets ``info["invalid_action"]``. The episode terminates
    when every box is on a goal; a box stuck for good is mentioned in the observation.
    ``info["task_id"]`` (``"sokoban/size6/boxes1/123"``) names the level;
    ``reset(options={"task_id": ...})`` plays it again.

    Args:
        size: Interior side of the room, in ``[5, 10]``.
        num_boxes: Boxes (and goals), in ``[1, 4]``.
        max_generation_tries: Candidate levels tried per seed before giving up, in
            ``[1, 10000]``.
        reward_shaping: ``False``: reward 1.0 on the solving step, 0.0 otherwise. ``True``: also
            +0.1 for pushing a box onto a goal, -0.1 for pushing one off, -0.01 per step.

    Raises:
        ConfigError: an argument is out of range; ``reset`` raises it when no solvable level
            came out of ``max_generation_tries`` candidates.

    Example:
        >>> env = SokobanEnv(size=5)
        >>> obs, info = env.reset(seed=0)
        >>> print(obs)
        #######
        #__####
        #_____#
        ###OX_#
        #_#P_##
        #___###
        #######
        >>> info["task_id"], info["admissible_actions"], env.expert_action()
        ('sokoban/size5/boxes1/0', ['up', 'down', 'right'], 'up')
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(
        self,
        size: int = 6,
        num_boxes: int = 1,
        max_generation_tries: int = 100,
        reward_shaping: bool = False,
    ) -> None:
        check_int(size, "size", MIN_SIZE, MAX_SIZE)
        check_int(num_boxes, "num_boxes", 1, MAX_BOXES)
        check_int(max_generation_tries, "max_generation_tries", 1, MAX_GENERATION_TRIES)
        if not isinstance(reward_shaping, (bool, np.bool_)):
            raise ConfigError(f"reward_shaping must be True or False, got {reward_shaping!r}")
        self.size = int(size)
        self.num_boxes = int(num_boxes)
        self.max_generation_tries = int(max_generation_tries)
        self.reward_shaping = bool(reward_shaping)
        self._level: _Level | None = None
        self._player = -1
        self._boxes: tuple[int, ...] = ()
        # Derived from the boxes, refreshed only when they move: the map with the boxes drawn,
        # their part of the state key, and whether the level is solved or stuck.
        self._board = ""
        self._boxes_key = ""
        self._solved = self._stuck = False

    def parse_task_id(self, task_id: Any) -> tuple[int, int, int]:
        """``(size, num_boxes, level_seed)`` of a Sokoban task id (any size, not only this env's)."""
        return parse_task_id(task_id)

    def choose_task(self, seed: int | None) -> tuple[int, int, int]:
        """A level of this env's size and box count, generated from the seed."""
        return self.size, self.num_boxes, self.seed_or_draw(seed, 2**63)

    def start_task(self, task: tuple[int, int, int], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        size, num_boxes, level_seed = task
        self._level = _level(size, num_boxes, int(level_seed), self.max_generation_tries)
        self._player = self._level.start[0]
        self._set_boxes(self._level.start[1])
        info = self._info(invalid=False, success=False)
        info["instructions"] = _INSTRUCTIONS
        return self._render(), info

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: the level of this env's size and box count generated from the seed."""
        seed = int(split.seed_of(index))  # type: ignore[arg-type]
        return {"task_id": format_task_id(self.size, self.num_boxes, seed),
                "description": f"{self.size}x{self.size} Sokoban level with {self.num_boxes} box(es) "
                               f"generated from seed {seed}"}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        level = self._level
        text = action.strip() if isinstance(action, str) else ""
        move = _ACTION_INDEX.get(text.lower()) if len(text) <= 5 else None
        reward = -0.01 if self.reward_shaping else 0.0
        invalid = True
        if move is None:
            shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
            message = f"Unknown action {shown!r}. Valid actions: {_ACTION_LIST}."
        else:
            name = ACTIONS[move]
            d = level.deltas[move]
            q = self._player + d
            boxes = self._boxes
            if not level.floor[q]:
                message = "You bumped into a wall."
            elif q in boxes:
                r = q + d
                if not level.floor[r]:
                    message = f"The box cannot move {name}: a wall is behind it."
                elif r in boxes:
                    message = f"The box cannot move {name}: another box is behind it."
                else:
                    invalid = False
                    self._player = q
                    self._set_boxes(
                        tuple(sorted([r if b == q else b for b in boxes])) if len(boxes) > 1 else (r,)
                    )
                    if level.is_goal[r] and not level.is_goal[q]:
                        message = f"You pushed a box {name} onto a goal."
                        reward += 0.1 if self.reward_shaping else 0.0
                    elif level.is_goal[q] and not level.is_goal[r]:
                        message = f"You pushed a box {name} off its goal."
                        reward -= 0.1 if self.reward_shaping else 0.0
                    else:
                        message = f"You pushed a box {name}."
            else:
                invalid = False
                self._player = q
                message = f"You moved {name}."
        solved = self._solved
        if solved:
            if not invalid:
                reward += 1.0
            message += " Every box is on a goal: solved!"
        elif self._stuck:
            message += " A box is stuck and can no longer reach a goal."
        info = self._info(invalid=invalid, success=solved)
        return f"{message}\n{self._render()}", reward, solved, False, info

    def expert_action(self) -> str | None:
        """First move of an optimal (fewest moves) plan from here; ``None`` when none exists.

        ``None`` also when the solver gives up after ``SEARCH_LIMIT`` states (only far from the
        generated start: the start is always solved within it). Among equally short plans the
        one found first in this process is followed.
        """
        level = self._level
        action = level.plan_action((self._player, self._boxes))
        return None if action < 0 else ACTIONS[action]

    def snapshot(self) -> bytes:
        """The level, player, boxes and ``np_random`` as pickled bytes."""
        level = self._level
        return pack_snapshot(self, {"task_id": level.task_id, "player": self._player, "boxes": self._boxes})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        # The level was generated once already, so the widest budget only re-finds it.
        level = _level(*parse_task_id(state["task_id"]), MAX_GENERATION_TRIES)
        self._level = level
        self._player = int(state["player"])
        self._set_boxes(tuple(int(b) for b in state["boxes"]))

    def render(self) -> str | None:
        """The map, or ``None`` before the first reset."""
        return None if self._level is None else self._render()

    # --- helpers ---------------------------------------------------------------------------------

    def _set_boxes(self, boxes: tuple[int, ...]) -> None:
        level = self._level
        assert level is not None
        self._boxes = boxes
        chars = level.base_chars.copy()
        for b in boxes:
            chars[level.text_index[b]] = BOX_ON_GOAL if level.is_goal[b] else BOX
        self._board = "".join(chars)
        self._boxes_key = "".join(level.coords[b] for b in boxes)
        self._solved = all(level.is_goal[b] for b in boxes)
        self._stuck = not self._solved and level.stuck(boxes)

    def _render(self) -> str:
        level = self._level
        assert level is not None
        i = level.text_index[self._player]
        mark = PLAYER_ON_GOAL if level.is_goal[self._player] else PLAYER
        return self._board[:i] + mark + self._board[i + 1 :]

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        level = self._level
        assert level is not None
        floor, player, boxes = level.floor, self._player, self._boxes
        admissible = []
        for name, d in zip(ACTIONS, level.deltas, strict=True):
            q = player + d
            if floor[q] and (q not in boxes or (floor[q + d] and q + d not in boxes)):
                admissible.append(name)
        return {
            "state_key": f"{level.task_id}@P{level.coords[player]}B{self._boxes_key}",
            "task_id": level.task_id,
            "admissible_actions": admissible,
            "invalid_action": invalid,
            "success": success,
        }
