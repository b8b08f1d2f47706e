"""``register_games``: registers the game envs (frozen lake, blackjack, Wordle, tic-tac-toe, Countdown)."""

from __future__ import annotations

from agentgym.registry import register


def register_games() -> None:
    """Register ``frozenlake-v0``, ``blackjack-v0``, ``wordle-v0``, ``tictactoe-v0`` and ``countdown-v0``.

    Idempotent: every id is registered with ``override=True``, so calling it twice is harmless.

    Example:
        >>> import agentgym
        >>> register_games()
        >>> agentgym.spec("wordle-v0").max_turns
        12
    """
    register(
        "frozenlake-v0",
        "agentgym.envs.frozenlake:FrozenLakeEnv",
        description="Frozen lake generated from the seed (Gymnasium toy text); reach G. Expert: planner.",
        max_turns=30,
        override=True,
    )
    register(
        "blackjack-v0",
        "agentgym.envs.blackjack:BlackjackEnv",
        description="Blackjack against a dealer standing on 17 (Gymnasium toy text). Expert: basic strategy.",
        max_turns=10,
        override=True,
    )
    register(
        "wordle-v0",
        "agentgym.envs.wordle:WordleEnv",
        description="Wordle: guess the seeded 5-letter word in 6 guesses. Expert: consistent-word solver.",
        # 6 guesses plus up to 6 invalid retries (invalid guesses do not use up a guess).
        max_turns=12,
        override=True,
    )
    register(
        "tictactoe-v0",
        "agentgym.envs.tictactoe:TicTacToeEnv",
        description="Tic-tac-toe as X against a minimax opponent of tunable strength. Expert: minimax.",
        # The agent moves at most 5 times; the rest of the budget allows invalid retries.
        max_turns=9,
        override=True,
    )
    register(
        "countdown-v0",
        "agentgym.envs.countdown:CountdownEnv",
        description="Countdown numbers game: reach the target with + - * /. Single turn. Expert: solver.",
        # Single turn: one answer ends the episode (an invalid one by truncation). For retries,
        # make("countdown-v0", max_attempts=3, max_turns=6).
        max_turns=1,
        override=True,
    )
