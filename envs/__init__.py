"""Built-in environments, one package per env family, registered by id on import (``agentgym.envs``).

``games`` (maze, Sokoban, toy text, Wordle, tic-tac-toe, Countdown), ``textworld``, ``alfworld`` and
``tools`` (search QA, code and math with a sandbox, function calling) hold the envs; every id is
registered in ``registration``. ``arguments`` is shared by several families; generated games are cached
through ``agentgym.cache``.
"""

from __future__ import annotations

from agentgym.envs.registration import register_builtin_envs

register_builtin_envs()
