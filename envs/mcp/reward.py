"""The reward of ``mcp-v0``: ``answer_reward`` (answer match) and ``reward_function`` (a checker's hook).

A task is rewarded on its final answer. By default the answer is matched against the task's
``answer`` (``answer_matches``); a checker — a callable, or ``"module:function"`` naming one — can
take its place, and is where a judged reward plugs in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agentgym.envs.tools.search_qa import normalize_answer
from agentgym.errors import ConfigError
from agentgym.plugins import import_object

#: Default numeric tolerance of ``answer_matches`` (absolute and relative).
DEFAULT_TOLERANCE = 1e-6

_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class RewardFunction(Protocol):
    """Contract of a checker: ``reward(task=..., answer=..., transcript=...) -> float``.

    Called once per episode, when the policy answers, with keyword arguments only (so a checker may
    take ``**kwargs`` and ignore what it does not need):

    - ``task``: the task's row from the task file (a copy; ``id`` always set), privileged fields included;
    - ``answer``: the final answer as text;
    - ``transcript``: the episode's tool calls in order, each ``{"name", "arguments", "result"}`` or
      ``{"name", "arguments", "error"}`` (results as the policy saw them).

    It returns a finite number: the episode's reward on the answering step. ``success`` is
    ``reward >= 1``. It must be deterministic (the env contract asks the same actions to give the
    same rewards).
    """

    def __call__(self, *, task: dict[str, Any], answer: str,
                 transcript: list[dict[str, Any]]) -> float: ...


def _number(text: str) -> float | None:
    """The text as a number when it is one (thousands separators allowed), else ``None``."""
    cleaned = text.strip().replace(",", "")
    match = _NUMBER_RE.fullmatch(cleaned)
    return float(match.group()) if match else None


def answer_matches(given: str, expected: Any, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """Whether an answer matches the expected one (or any of a list of them).

    Two numbers match within ``tolerance`` (absolute, or relative to the expected value); other
    answers match when equal after SQuAD normalisation (case, punctuation, articles, spacing).

    Example:
        >>> answer_matches(" The Lumen. ", "lumen"), answer_matches("3.5000001", 3.5, 1e-6)
        (True, True)
        >>> answer_matches("1,250", "1250"), answer_matches("Harrow", ["Isk", "harrow"])
        (True, True)
        >>> answer_matches("4", 5)
        False
    """
    candidates = expected if isinstance(expected, list) else [expected]
    guess = _number(given)
    for candidate in candidates:
        target = _number(str(candidate))
        if guess is not None and target is not None:
            if math.isclose(guess, target, rel_tol=tolerance, abs_tol=tolerance):
                return True
        elif normalize_answer(given) == normalize_answer(str(candidate)):
            return True
    return False


def answer_reward(tolerance: float = DEFAULT_TOLERANCE) -> RewardFunction:
    """The default reward: 1.0 when the answer matches the task's ``answer`` (``answer_matches``), else 0.0.

    A task's own ``tolerance`` field overrides ``tolerance``.

    Example:
        >>> reward = answer_reward()
        >>> reward(task={"answer": "Lumen"}, answer="lumen", transcript=[])
        1.0
    """

    def reward(*, task: dict[str, Any], answer: str, transcript: list[dict[str, Any]]) -> float:
        limit = float(task.get("tolerance", tolerance))
        return 1.0 if answer_matches(answer, task.get("answer"), limit) else 0.0

    return reward


def reward_function(reward: str | Callable[..., Any] | None,
                    tolerance: float = DEFAULT_TOLERANCE) -> RewardFunction:
    """The env's reward function: ``answer_reward`` for ``None``, the callable itself, or the function
    ``"module:function"`` names (imported now, so a typo fails at construction).

    Raises:
        ConfigError: a string that is not ``module:function``, a module that does not import, or a
            name that is not a callable in it.

    Example:
        >>> reward_function("math:fsum")
        <built-in function fsum>
        >>> reward_function("math.fsum")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: reward must be a callable or 'module:function', got 'math.fsum'
    """
    if reward is None:
        return answer_reward(tolerance)
    if callable(reward):
        return reward  # type: ignore[return-value]
    module_name, _, attribute = str(reward).partition(":")
    if not isinstance(reward, str) or not module_name or not attribute:
        raise ConfigError(f"reward must be a callable or 'module:function', got {reward!r}")
    function = import_object(reward, what=f"reward {reward!r}")
    if not callable(function):
        raise ConfigError(f"reward {reward!r}: {module_name}.{attribute} is a {type(function).__name__}, "
                          "not a function")
    return function  # type: ignore[no-any-return]


def score(function: RewardFunction, task: Mapping[str, Any], answer: str,
          transcript: Sequence[Mapping[str, Any]]) -> float:
    """Call a reward function and check what it returned.

    Raises:
        ConfigError: it returned something that is not a finite number (naming the task).

    Example:
        >>> score(answer_reward(), {"id": "t", "answer": 2}, "2.0", [])
        1.0
    """
    value = function(task=dict(task), answer=answer, transcript=[dict(call) for call in transcript])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"the reward function returned {value!r} on task {task.get('id')!r}; it must "
                          "return a finite number")
    return float(value)
