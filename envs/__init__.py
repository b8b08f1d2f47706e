"""Built-in environments, registered by id on import (``agentgym.envs``)."""

from __future__ import annotations

from agentgym.registry import register

register(
    "maze-v0",
    "agentgym.envs.maze:MazeEnv",
    description="Text gridworld maze generated from the seed; reach the goal. Expert: shortest path.",
    max_turns=50,
)
register(
    "sokoban-v0",
    "agentgym.envs.sokoban:SokobanEnv",
    description="Text Sokoban with generated solvable levels; push every box onto a goal. Expert: solver.",
    max_turns=60,
)

from agentgym.envs.games import register_games  # noqa: E402  (after the built-ins above)

register_games()

from agentgym.envs.textworld_registration import register_textworld_envs  # noqa: E402

register_textworld_envs()

from agentgym.envs.tools_registration import register_tool_envs  # noqa: E402

register_tool_envs()

from agentgym.envs.alfworld_registration import register_alfworld_envs  # noqa: E402

register_alfworld_envs()
