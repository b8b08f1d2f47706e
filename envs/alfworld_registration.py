"""``register_alfworld_envs``: registers ``alfworld-v0`` (ALFWorld text games; needs the ``alfworld`` extra)."""

from __future__ import annotations

from agentgym.registry import register


def register_alfworld_envs() -> None:
    """Register ``alfworld-v0``.

    Idempotent: the id is registered with ``override=True``. Registering does not import
    ``alfworld``; making the env does (and raises ``ConfigError`` naming the extra when it is
    missing). The official games are served when ``ALFWORLD_DATA`` (or ``data_dir=``) points at
    them, generated ones otherwise: ``make("alfworld-v0", split="valid_unseen",
    task_types=["pick_heat_then_place_in_recep"])``.

    Example:
        >>> import agentgym
        >>> register_alfworld_envs()
        >>> agentgym.spec("alfworld-v0").max_turns
        50
    """
    register(
        "alfworld-v0",
        "agentgym.envs.alfworld_env:AlfWorldEnv",
        description=(
            "ALFWorld household tasks (6 types) in text: official games from ALFWORLD_DATA, else games "
            "generated from ALFWorld's PDDL domain and cached; admissible commands. Expert: handcoded."
        ),
        # ALFWorld's budget in verl-agent (env.max_steps).
        max_turns=50,
        override=True,
    )
