"""Train and evaluate the agent you already have: a harness runs it, the rollout proxy serves its model
calls with the policy, and each run becomes a trajectory of the one engine.

- ``agentgym.harness.agent``: the harness contract (``module:function`` or a command line; what it returns).
- ``agentgym.harness.tasks``: the task rows (JSONL), split into training and held-out tasks.
- ``agentgym.harness.proxy``: ``RolloutProxy``, the OpenAI-compatible endpoint with one base URL per rollout.
- ``agentgym.harness.env``: ``HarnessEnv`` (``harness-v0``), which the collector plays like any env.

In a config::

    env:
      harness: my_agent:run        # or a command line: "python my_agent.py"
      tasks: tasks.jsonl
"""

from __future__ import annotations

import importlib
from typing import Any

from agentgym.harness.agent import AgentOutcome, Harness, HarnessError
from agentgym.harness.tasks import TaskSet, load_tasks

__all__ = ["AgentOutcome", "Harness", "HarnessEnv", "HarnessError", "RolloutProxy", "TaskSet", "load_tasks"]

#: Names imported on first use: the proxy needs the ``server`` extra (fastapi), which reading a task file
#: (``mcp-v0`` does, with only the ``mcp`` extra) must not.
_LAZY = {"HarnessEnv": "agentgym.harness.env", "RolloutProxy": "agentgym.harness.proxy"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
