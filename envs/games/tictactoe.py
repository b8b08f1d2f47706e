"""``TicTacToeEnv`` (``tictactoe-v0``): tic-tac-toe as X against a minimax opponent of tunable strength."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar, Literal

import numpy as np
from gymnasium.utils import seeding

from agentgym.core import Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

FirstPlayer = Literal["agent", "opponent", "random"]

AGENT, OPPONENT, EMPTY = "X", "O", "."
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6),
)
_FIRST_PLAYERS = ("agent", "opponent", "random")
_TASK_RE = re.compile(r"tictactoe/(agent|opponent)-first/(0|[1-9][0-9]*)")
_SEED_BOUND = 2**63
_ECHO_CHARS = 20
_INSTRUCTIONS = (
    "We are playing tic-tac-toe on a 3x3 board. You are X, your opponent is O; three in a row, "
    "column or diagonal wins. The cells are numbered 1 to 9, left to right and top to bottom:\n"
    " 1 | 2 | 3\n 4 | 5 | 6\n 7 | 8 | 9\n"
    "Empty cells show their number. Each turn, answer with the number of an empty cell and nothing "
    "else, e.g. 5."
)


def winner(board: str) -> str | None:
    """``"X"`` or ``"O"`` when that side has three in a line, else ``None``.

    Example:
        >>> winner("XXX.OO..."), winner("XO.......")
        ('X', None)
    """
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


@functools.cache
def _value(board: str, to_move: str) -> int:
    """Negamax value for ``to_move``: ``1 + empty cells`` for a win (sooner is better), 0 a draw."""
    other = OPPONENT if to_move == AGENT else AGENT
    if winner(board) is not None:  # the previous mover (``other``) just won
        return -(1 + board.count(EMPTY))
    if EMPTY not in board:
        return 0
    return max(-_value(board[:i] + to_move + board[i + 1 :], other) for i in range(9) if board[i] == EMPTY)


@functools.cache
def best_moves(board: str, to_move: str) -> tuple[int, ...]:
    """The cells (0-8) where ``to_move`` keeps the minimax value: wins soonest, loses latest.

    Example:
        >>> best_moves("XX.OO....", "X")  # take the win at cell 2 (shown to the agent as 3)
        (2,)
    """
    other = OPPONENT if to_move == AGENT else AGENT
    scores = {i: -_value(board[:i] + to_move + board[i + 1 :], other) for i in range(9) if board[i] == EMPTY}
    top = max(scores.values())
    return tuple(i for i, s in scores.items() if s == top)


def format_task_id(agent_first: bool, seed: int) -> str:
    """The task id of a game: who moves first and the seed of the opponent's choices.

    Example:
        >>> format_task_id(True, 7)
        'tictactoe/agent-first/7'
    """
    return f"tictactoe/{'agent' if agent_first else 'opponent'}-first/{seed}"


def parse_task_id(task_id: Any) -> tuple[bool, int]:
    """``(agent_first, seed)`` of a task id written by ``format_task_id``.

    Raises:
        ConfigError: ``task_id`` is not a canonical tic-tac-toe task id.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(
            f"malformed tictactoe task_id {task_id!r}: expected 'tictactoe/<agent|opponent>-first/<seed>', "
            "e.g. 'tictactoe/agent-first/7'"
        )
    return match.group(1) == "agent", int(match.group(2))


class TicTacToeEnv(Env):
    """Tic-tac-toe: the agent plays X against an O opponent that mixes minimax and random moves.

    Each opponent move is a minimax move (a uniformly drawn one among equally good moves) with
    probability ``opponent_strength``, else a uniformly random legal move; all draws come from
    ``np_random``. The opponent replies inside ``step``, so the agent always sees its own turn.
    Actions are cell numbers ``"1"``-``"9"`` (row by row from the top left); anything else, or a
    taken cell, is invalid and changes nothing. Rewards: win +1.0, draw 0.0, loss -1.0, given on
    the step that ends the game; ``success`` means a win. ``info["task_id"]``
    (``"tictactoe/agent-first/7"``) names who starts and the seed of the opponent's choices;
    ``reset(options={"task_id": ...})`` replays them (with this env's ``opponent_strength``).
    Expert: minimax (never loses; wins as soon as it can, lowest cell on ties).

    Args:
        opponent_strength: Probability in ``[0, 1]`` that the opponent plays a minimax move.
        first_player: ``"agent"``, ``"opponent"``, or ``"random"`` (drawn from the seed). A reset
            may override it with ``options={"first_player": ...}``.

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = TicTacToeEnv(first_player="agent")
        >>> obs, info = env.reset(seed=0)
        >>> info["admissible_actions"]
        ['1', '2', '3', '4', '5', '6', '7', '8', '9']
        >>> obs, reward, terminated, truncated, info = env.step("5")
        >>> print(obs)
        You played 5. The opponent played 1.
         O | 2 | 3
        ---+---+---
         4 | X | 6
        ---+---+---
         7 | 8 | 9
        >>> info["state_key"]
        'O...X....|X'
    """

    has_expert: ClassVar[bool] = True
    #: Minimax against a perfect opponent draws: a draw is the best there is, not a win.
    expert_solves_every_task: ClassVar[bool] = False
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, opponent_strength: float = 1.0, first_player: FirstPlayer = "random") -> None:
        if (
            isinstance(opponent_strength, bool)
            or not isinstance(opponent_strength, (int, float, np.integer, np.floating))
            or not 0.0 <= opponent_strength <= 1.0  # also rejects NaN
        ):
            raise ConfigError(f"opponent_strength must be a number in [0.0, 1.0], got {opponent_strength!r}")
        self._check_first_player(first_player, "first_player")
        self.opponent_strength = float(opponent_strength)
        self.first_player = first_player
        self.instructions = _INSTRUCTIONS
        self._board = EMPTY * 9
        self._task_id: str | None = None
        self._over = False

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: who moves first (this env's ``first_player``, else the seed's coin) and the seed."""
        seed = int(split.seed_of(index))  # type: ignore[arg-type]
        coin = bool(seeding.np_random(seed)[0].random() < 0.5)  # reset's first draw from the task seed
        agent_first = coin if self.first_player == "random" else self.first_player == "agent"
        return {"task_id": format_task_id(agent_first, seed),
                "description": f"{'you move' if agent_first else 'the opponent moves'} first; seed {seed}"}

    def parse_task_id(self, task_id: Any) -> tuple[int, bool | None]:
        """``(task_seed, agent_first)`` of a task id."""
        agent_first, task_seed = parse_task_id(task_id)
        return task_seed, agent_first

    def choose_task(self, seed: int | None) -> tuple[int, bool | None]:
        """The seed as the task seed; who moves first is decided in ``start_task`` (``None`` here)."""
        return self.seed_or_draw(seed, _SEED_BOUND), None

    def start_task(
        self, task: tuple[int, bool | None], options: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        task_seed, agent_first = task
        first = options.get("first_player", self.first_player)
        self._check_first_player(first, "options['first_player']")
        if agent_first is not None and first != "random" and (first == "agent") != agent_first:
            raise ConfigError(
                f"options['first_player']={first!r} contradicts task_id {options.get('task_id')!r}; "
                "pass only one of them"
            )
        # Every game's randomness comes from its task seed, so a task id replays the game exactly.
        self._np_random, self._np_random_seed = seeding.np_random(task_seed)
        coin = bool(self.np_random.random() < 0.5)  # drawn always, so the stream never depends on options
        if agent_first is None:
            agent_first = coin if first == "random" else first == "agent"
        self._task_id = format_task_id(agent_first, task_seed)
        self._board, self._over = EMPTY * 9, False
        if agent_first:
            text = "You move first."
        else:
            text = f"The opponent moved first and played {self._opponent_move() + 1}."
        info = self._info(invalid=False)
        info["instructions"] = self.instructions
        return f"{text}\n{self._drawing()}", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action.strip() if isinstance(action, str) else ""
        cell = int(text) - 1 if re.fullmatch(r"[1-9]", text) else None
        if cell is None or self._board[cell] != EMPTY:
            shown = text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "..."
            problem = (
                f"Cell {text} is already taken." if cell is not None
                else f"{shown!r} is not a cell number."
            )
            free = ", ".join(str(i + 1) for i in range(9) if self._board[i] == EMPTY)
            message = f"Invalid move: {problem} Answer with the number of an empty cell: {free}."
            return f"{message}\n{self._drawing()}", 0.0, False, False, self._info(invalid=True)
        self._place(cell, AGENT)
        parts = [f"You played {cell + 1}."]
        reward = 0.0
        if winner(self._board) == AGENT:
            parts.append("You win!")
            reward = 1.0
        elif EMPTY not in self._board:
            parts.append("The board is full: a draw.")
        else:
            parts.append(f"The opponent played {self._opponent_move() + 1}.")
            if winner(self._board) == OPPONENT:
                parts.append("The opponent wins.")
                reward = -1.0
            elif EMPTY not in self._board:
                parts.append("The board is full: a draw.")
        self._over = winner(self._board) is not None or EMPTY not in self._board
        return f"{' '.join(parts)}\n{self._drawing()}", reward, self._over, False, self._info(invalid=False)

    def expert_action(self) -> str | None:
        """The minimax move (lowest cell among the best), or ``None`` once the game is over."""
        if self._over:
            return None
        return str(best_moves(self._board, AGENT)[0] + 1)

    def snapshot(self) -> bytes:
        """The board, the task and ``np_random`` as pickled bytes."""
        return pack_snapshot(self, {"board": self._board, "task_id": self._task_id, "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        parse_task_id(state["task_id"])
        self._board, self._task_id, self._over = state["board"], state["task_id"], bool(state["over"])

    def render(self) -> str | None:
        """The board with numbers in the empty cells, or ``None`` before the first reset."""
        return None if self._task_id is None else self._drawing()

    # --- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _check_first_player(value: Any, name: str) -> None:
        if value not in _FIRST_PLAYERS:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, _FIRST_PLAYERS))}, got {value!r}")

    def _place(self, cell: int, mark: str) -> None:
        self._board = self._board[:cell] + mark + self._board[cell + 1 :]

    def _opponent_move(self) -> int:
        rng = self.np_random
        # Both draws happen on every move, so the stream does not depend on the strength setting.
        plays_best = rng.random() < self.opponent_strength
        pick = rng.random()
        choices = best_moves(self._board, OPPONENT) if plays_best else tuple(
            i for i in range(9) if self._board[i] == EMPTY
        )
        cell = choices[int(pick * len(choices))]
        self._place(cell, OPPONENT)
        return cell

    def _drawing(self) -> str:
        cells = [f" {mark if mark != EMPTY else i + 1} " for i, mark in enumerate(self._board)]
        rows = ["|".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
        return "\n---+---+---\n".join(row.rstrip() for row in rows)

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        return {
            "state_key": f"{self._board}|{'-' if self._over else AGENT}",
            "task_id": self._task_id,
            "admissible_actions": [
                str(i + 1) for i in range(9) if self._board[i] == EMPTY and not self._over
            ],
            "invalid_action": invalid,
            "success": winner(self._board) == AGENT,
        }
