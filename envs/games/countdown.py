"""``CountdownEnv`` (``countdown-v0``): reach a target number with + - * / over given numbers.

Also owns the safe expression evaluator (``evaluate``) and the solver (``solve``).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from gymnasium.utils import seeding

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_int
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

MIN_NUMBERS, MAX_NUMBERS = 2, 6
MAX_NUMBER, MAX_TARGET = 1000, 1_000_000
MIN_GENERATED_TARGET, MAX_GENERATED_TARGET = 10, 999
SMALL_NUMBERS = tuple(range(1, 11))
LARGE_NUMBERS = (25, 50, 75, 100)
#: Answers longer than this are rejected before parsing (bounds parser time and recursion).
MAX_ANSWER_CHARS = 200
MAX_ATTEMPTS_LIMIT = 100

_TASK_RE = re.compile(r"countdown/nums=([0-9]+(?:,[0-9]+)*)/target=([0-9]+)")
_INT_RE = re.compile(r"[1-9][0-9]*")
_ECHO_CHARS = 40
_OPS: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# Spellings models often use for the four operators.
_SPELLINGS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})
_INSTRUCTIONS = (
    "Countdown numbers game. Write an arithmetic expression that equals the target exactly, using "
    "the given numbers, the operators + - * / and parentheses. Each number may be used at most as "
    "many times as it is listed; you need not use them all. Division is exact: fractions are "
    "allowed along the way (for example 6 / (1 - 3/4) = 24), but the result must equal the target. "
    "No other numbers, operators (such as ** or //), unary minus, variables or text. {attempts} "
    "Answer with the expression only, e.g. (25 - 5) * 3 + 7."
)


class ExpressionError(ValueError):
    """An answer that is not a well-formed expression over the allowed numbers (says why)."""


def evaluate(expression: str, numbers: Sequence[int]) -> Fraction:
    """The exact value of ``expression`` under the Countdown rules; never runs code.

    The text is parsed with ``ast`` and only whole-number literals, ``+ - * /`` and parentheses
    are accepted; arithmetic is exact (``Fraction``), so intermediate results may be fractions or
    negative. Each literal must be one of ``numbers``, used at most as often as it is listed.

    Raises:
        ExpressionError: malformed, too long, a disallowed operator or number, a number used too
            often, or division by zero; the message says which.

    Example:
        >>> evaluate("2 + 3 * 4", [2, 3, 4]), evaluate("(2 + 3) * 4", [2, 3, 4])
        (Fraction(14, 1), Fraction(20, 1))
        >>> evaluate("6 / (1 - 3 / 4)", [1, 3, 4, 6])
        Fraction(24, 1)
        >>> evaluate("2 ** 3", [2, 3])  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ...
        agentgym.envs.games.countdown.ExpressionError: '**' is not allowed; use only + - * / and parentheses
    """
    if not isinstance(expression, str):
        raise ExpressionError("the answer must be text")
    text = expression.translate(_SPELLINGS).strip()
    if not text:
        raise ExpressionError("the answer is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise ExpressionError(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
    if "=" in text:
        raise ExpressionError("write the expression only, without '='")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExpressionError("it is not a well-formed arithmetic expression") from None
    literals: list[int] = []
    _check(tree.body, text, literals)
    available = Counter(numbers)
    for number, used in sorted(Counter(literals).items()):
        if number not in available:
            raise ExpressionError(f"{number} is not one of the numbers")
        if used > available[number]:
            times = "once" if available[number] == 1 else f"{available[number]} times"
            raise ExpressionError(f"{number} is used {used} times but is listed only {times}")
    return _value(tree.body)


def _check(node: ast.AST, text: str, literals: list[int]) -> None:
    """Reject every node but whole-number literals and the four binary operators."""
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            symbol = {ast.Pow: "**", ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@"}.get(type(node.op))
            shown = f"'{symbol}'" if symbol else "that operator"
            raise ExpressionError(f"{shown} is not allowed; use only + - * / and parentheses")
        _check(node.left, text, literals)
        _check(node.right, text, literals)
    elif isinstance(node, ast.Constant):
        source = ast.get_source_segment(text, node) or ""
        if type(node.value) is not int or not _INT_RE.fullmatch(source):
            raise ExpressionError(f"{source or node.value!r} is not a plain whole number")
        literals.append(node.value)
    elif isinstance(node, ast.UnaryOp):
        raise ExpressionError(
            "signs in front of a number (unary minus or plus) are not allowed; use subtraction"
        )
    else:
        raise ExpressionError(
            f"{type(node).__name__.lower()} is not allowed; use only numbers, + - * / and parentheses"
        )


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)  # _check admitted nothing else
    left, right = _value(node.left), _value(node.right)
    op = type(node.op)
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    if right == 0:
        raise ExpressionError("it divides by zero")
    return left / right


# --- solver --------------------------------------------------------------------------------------

_Item = tuple[int, str, int]  # (value, expression, precedence of its top operator: 1 + -, 2 * /, 3 a number)


def _combine(a: _Item, b: _Item) -> list[_Item]:
    """Results of one operation on ``a`` and ``b`` (``a`` >= ``b``), keeping positive integers.

    Parentheses appear only where precedence needs them; with exact fractions,
    ``x - (y - z) != x - y - z`` needs them but ``x * (y / z) == x * y / z`` does not.
    """
    (x, ex, px), (y, ey, py) = a, b
    left = f"({ex})" if px == 1 else ex
    out = [(x + y, f"{ex} + {ey}", 1)]
    if x > y:
        out.append((x - y, f"{ex} - {f'({ey})' if py == 1 else ey}", 1))
    if y > 1:  # multiplying or dividing by 1 changes nothing
        out.append((x * y, f"{left} * {f'({ey})' if py == 1 else ey}", 2))
        if x % y == 0:
            out.append((x // y, f"{left} / {f'({ey})' if py <= 2 else ey}", 2))
    return out


def _search(
    items: tuple[_Item, ...], target: int, depth: int, seen: set[tuple[tuple[int, ...], int]]
) -> str | None:
    key = (tuple(sorted(v for v, _, _ in items)), depth)
    if key in seen:
        return None
    seen.add(key)
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            a, b = (items[i], items[j]) if items[i][0] >= items[j][0] else (items[j], items[i])
            rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
            for made in _combine(a, b):
                if made[0] == target:
                    return made[1]
                if depth > 1:
                    found = _search((*rest, made), target, depth - 1, seen)
                    if found is not None:
                        return found
    return None


@functools.lru_cache(maxsize=1024)
def solve(numbers: tuple[int, ...], target: int) -> str | None:
    """An expression over ``numbers`` equal to ``target`` with the fewest operations, or ``None``.

    Depth-first search over pairs (iterative deepening on the number of operations), with
    positive-integer intermediate results only: a subset of what ``evaluate`` accepts, so every
    answer is valid, and enough for every generated puzzle (they are built that way).

    Example:
        >>> solve((3, 7, 25), 82)
        '25 * 3 + 7'
        >>> solve((3, 7), 5) is None
        True
    """
    if target in numbers:
        return str(target)
    items = tuple((n, str(n), 3) for n in numbers)
    for depth in range(1, len(numbers)):
        found = _search(items, target, depth, set())
        if found is not None:
            return found
    return None


# --- tasks ---------------------------------------------------------------------------------------


def format_task_id(numbers: Sequence[int], target: int) -> str:
    """The task id of a puzzle.

    Example:
        >>> format_task_id([3, 7, 25, 100], 412)
        'countdown/nums=3,7,25,100/target=412'
    """
    return f"countdown/nums={','.join(str(n) for n in numbers)}/target={target}"


def parse_task_id(task_id: Any) -> tuple[tuple[int, ...], int]:
    """``(numbers, target)`` of a task id written by ``format_task_id``.

    Any puzzle can be posed this way, including ones without a solution (then the expert and
    ``info["answer"]`` are ``None``).

    Raises:
        ConfigError: ``task_id`` is malformed, not canonical, or out of range.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if match is None:
        raise ConfigError(
            f"malformed countdown task_id {task_id!r}: expected 'countdown/nums=<n1>,<n2>,...,/target=<t>', "
            "e.g. 'countdown/nums=3,7,25,100/target=412'"
        )
    numbers = tuple(int(n) for n in match.group(1).split(","))
    target = int(match.group(2))
    if not MIN_NUMBERS <= len(numbers) <= MAX_NUMBERS or not all(1 <= n <= MAX_NUMBER for n in numbers):
        raise ConfigError(
            f"countdown task_id {task_id!r}: give {MIN_NUMBERS} to {MAX_NUMBERS} numbers, "
            f"each in [1, {MAX_NUMBER}]"
        )
    if not 1 <= target <= MAX_TARGET:
        raise ConfigError(f"countdown task_id {task_id!r}: target must be in [1, {MAX_TARGET}]")
    if format_task_id(numbers, target) != task_id:
        canonical = format_task_id(numbers, target)
        raise ConfigError(f"countdown task_id {task_id!r} is not canonical; write it as {canonical!r}")
    return numbers, target


def generate_puzzle(rng: np.random.Generator, num_numbers: int) -> tuple[tuple[int, ...], int]:
    """Numbers (a quarter of them drawn from 25/50/75/100, the rest from 1-10) and a reachable target.

    The target is the value of a random expression over three or more of the numbers (both when
    there are two) with positive-integer intermediate results, in ``[10, 999]`` and not itself one
    of the numbers; after 100 failed draws it falls back to the sum of all the numbers.
    """
    numbers = tuple(
        int(rng.choice(LARGE_NUMBERS)) if rng.random() < 0.25 else int(rng.choice(SMALL_NUMBERS))
        for _ in range(num_numbers)
    )
    for _ in range(100):
        size = int(rng.integers(min(3, num_numbers), num_numbers + 1))
        pool = [numbers[i] for i in rng.permutation(num_numbers)[:size].tolist()]
        while len(pool) > 1:
            i, j = rng.permutation(len(pool))[:2].tolist()
            a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
            results = [a + b] + ([a - b] if a > b else []) + ([a * b] if b > 1 else [])
            results += [a // b] if b > 1 and a % b == 0 else []
            made = results[int(rng.integers(len(results)))]
            pool = [v for k, v in enumerate(pool) if k not in (i, j)] + [made]
        target = pool[0]
        if MIN_GENERATED_TARGET <= target <= MAX_GENERATED_TARGET and target not in numbers:
            return numbers, target
    return numbers, sum(numbers)


class CountdownEnv(Env):
    """The Countdown numbers game: combine the given numbers with + - * / to hit the target.

    Each puzzle has 3-6 numbers (``min_numbers``-``max_numbers``) and a target built from a random
    expression over them, so a solution exists. The agent answers one expression, checked by
    ``evaluate`` (``ast`` with a whitelist, exact fractions: see its rules). Reward 1.0 when it
    equals the target (``success``), else 0.0. A malformed answer, a number not in the list, a
    number used too often or a division by zero is invalid (``info["invalid_action"]``) and uses up
    no attempt. With ``max_attempts > 1`` a wrong answer is told its value ("your expression = 17,
    target 23") and the agent tries again; the episode terminates on success or when the attempts
    are used up. ``countdown-v0`` is single turn (``max_turns=1``): one answer, and an invalid one
    ends the episode by truncation. ``info["task_id"]`` (``"countdown/nums=3,7,25,100/target=412"``)
    names the puzzle; ``reset(options={"task_id": ...})`` poses it (any puzzle can be posed).
    ``info["answer"]`` is the solver's expression: privileged, never in an observation.

    Args:
        min_numbers: Fewest numbers in a generated puzzle, in ``[2, 6]``.
        max_numbers: Most numbers in a generated puzzle, in ``[min_numbers, 6]``.
        max_attempts: Valid answers allowed per puzzle, in ``[1, 100]``.

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = CountdownEnv(max_attempts=2)
        >>> obs, info = env.reset(options={"task_id": "countdown/nums=3,7,25/target=82"})
        >>> print(obs)
        Numbers: 3 7 25
        Target: 82
        >>> print(env.step("25 * 3 + 3")[0])
        Invalid answer: 3 is used 2 times but is listed only once. This uses up no attempt.
        Numbers: 3 7 25
        Target: 82
        >>> print(env.step("25 * 3")[0])
        Your expression = 75, target 82. 1 attempt left.
        Numbers: 3 7 25
        Target: 82
        >>> env.step("25 * 3 + 7")[1]
        1.0
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, min_numbers: int = 3, max_numbers: int = 6, max_attempts: int = 1) -> None:
        check_int(min_numbers, "min_numbers", MIN_NUMBERS, MAX_NUMBERS)
        check_int(max_numbers, "max_numbers", int(min_numbers), MAX_NUMBERS)
        check_int(max_attempts, "max_attempts", 1, MAX_ATTEMPTS_LIMIT)
        self.min_numbers, self.max_numbers = int(min_numbers), int(max_numbers)
        self.max_attempts = int(max_attempts)
        attempts = (
            "You have one attempt." if self.max_attempts == 1
            else f"You have {self.max_attempts} attempts; after a wrong one you are told its value."
        )
        self.instructions = _INSTRUCTIONS.format(attempts=attempts)
        self._numbers: tuple[int, ...] = ()
        self._target = 0
        self._attempts = 0
        self._over = False

    def parse_task_id(self, task_id: Any) -> tuple[tuple[int, ...], int]:
        """The puzzle's numbers and target."""
        return parse_task_id(task_id)

    def choose_task(self, seed: int | None) -> tuple[tuple[int, ...], int]:
        """A puzzle drawn from the seeded ``np_random``."""
        count = int(self.np_random.integers(self.min_numbers, self.max_numbers + 1))
        return generate_puzzle(self.np_random, count)

    def start_task(
        self, task: tuple[tuple[int, ...], int], options: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        self._numbers, self._target = task
        self._attempts, self._over = 0, False
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        return self._puzzle(), info

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """A seeded task: the puzzle ``reset`` draws from the seed (drawn here the same way)."""
        rng, _ = seeding.np_random(split.seed_of(index))
        count = int(rng.integers(self.min_numbers, self.max_numbers + 1))
        numbers, target = generate_puzzle(rng, count)
        return {"task_id": format_task_id(numbers, target),
                "description": f"reach {target} from {', '.join(map(str, numbers))}"}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            value = evaluate(action, self._numbers)
        except ExpressionError as exc:
            return (
                f"Invalid answer: {exc}. This uses up no attempt.\n{self._puzzle()}",
                0.0, False, False, self._info(invalid=True, success=False),
            )
        self._attempts += 1
        solved = value == self._target
        left = self.max_attempts - self._attempts
        self._over = solved or left == 0
        shown = action.strip()
        shown = shown if len(shown) <= _ECHO_CHARS else shown[:_ECHO_CHARS] + "..."
        if solved:
            text = f"Correct: {shown} = {self._target}."
        else:
            tail = f"{left} {'attempt' if left == 1 else 'attempts'} left." if left else "No attempts left."
            text = f"Your expression = {value}, target {self._target}. {tail}\n{self._puzzle()}"
        return text, (1.0 if solved else 0.0), self._over, False, self._info(invalid=False, success=solved)

    def expert_action(self) -> str | None:
        """The solver's expression (``solve``), or ``None`` when it has none or the puzzle is over."""
        return None if self._over else solve(self._numbers, self._target)

    def snapshot(self) -> bytes:
        """The puzzle, the attempts used and ``np_random`` as pickled bytes."""
        task_id = format_task_id(self._numbers, self._target)
        return pack_snapshot(self, {"task_id": task_id, "attempts": self._attempts, "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        self._numbers, self._target = parse_task_id(state["task_id"])
        self._attempts, self._over = int(state["attempts"]), bool(state["over"])

    def render(self) -> str | None:
        """The puzzle (numbers and target), or ``None`` before the first reset."""
        return self._puzzle() if self._numbers else None

    # --- helpers ---------------------------------------------------------------------------------

    def _puzzle(self) -> str:
        return f"Numbers: {' '.join(map(str, self._numbers))}\nTarget: {self._target}"

    def _info(self, *, invalid: bool, success: bool) -> dict[str, Any]:
        task_id = format_task_id(self._numbers, self._target)
        return {
            # The attempts used are state (they decide when the episode ends); the wrong values
            # tried before are history and stay out.
            "state_key": f"{task_id}#attempts={self._attempts}",
            "task_id": task_id,
            "invalid_action": invalid,
            "success": success,
            "answer": solve(self._numbers, self._target),
        }

