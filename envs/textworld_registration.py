"""``register_textworld_envs``: registers ``textworld-v0`` (TextWorld games; needs the ``textworld`` extra)."""

from __future__ import annotations

from agentgym.registry import register


def register_textworld_envs() -> None:
    """Register ``textworld-v0``.

    Idempotent: the id is registered with ``override=True``. Registering does not import
    ``textworld``; making the env does (and raises ``ConfigError`` naming the extra when it is
    missing). Pick the game family with ``make("textworld-v0", challenge="tw-cooking",
    settings={...})``.

    Example:
        >>> import agentgym
        >>> register_textworld_envs()
        >>> agentgym.spec("textworld-v0").max_turns
        50
    """
    register(
        "textworld-v0",
        "agentgym.envs.textworld_games:TextWorldEnv",
        description=(
            "TextWorld games (tw-simple, tw-coin_collector, tw-treasure_hunter, tw-cooking) generated "
            "from the seed and cached on disk; act with admissible commands. Expert: winning policy."
        ),
        # ALFWorld's budget in verl-agent; the default games need 5-20 commands.
        max_turns=50,
        override=True,
    )
