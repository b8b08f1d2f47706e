"""The env-side plug-ins a run's config sets, with their settings types: the reward judge (``env.judge``:
``agentgym.judge.JudgeSettings``), which wraps envs made in the trainer's process, and your own agent as
the env (``env.harness``/``env.tasks``: ``HarnessSettings``), which runs on ``harness-v0``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError
from agentgym.judge import JudgeSettings
from agentgym.training.config.plugin_settings import register_plugin_settings

#: The env a harness runs on (``agentgym.harness.env.HarnessEnv``).
HARNESS_ENV = "harness-v0"


def check_judged_envs(env: Any) -> None:
    """``env.judge`` wraps in-process envs: not env services (``env.url``/``env.urls``) nor Ray actors.

    Raises:
        ConfigError: naming the settings that cannot go together.
    """
    if env.judge is not None and (env.url or env.urls or env.backend == "ray"):
        raise ConfigError("env.judge wraps envs made in the trainer's process; it cannot be combined "
                          "with env.url/env.urls or env.backend: ray: drop env.judge or run the envs "
                          "locally")


@dataclass(frozen=True)
class HarnessSettings:
    """Your own agent trained as the env (keys of ``env``)."""

    harness: str | None = None
    """Train your own agent: ``module:function`` or a command line run once per episode against the
    rollout proxy (``agentgym.harness``); sets ``env.id`` to ``harness-v0``. Its options (``eval_tasks``,
    ``reward``, ``timeout_s``, ``on_failure``) go in ``kwargs``."""
    tasks: str | None = None
    """With ``harness``: the JSONL file of tasks the agent runs on."""


def check_harness(env: Any) -> dict[str, Any] | None:
    """``env.harness`` and ``env.tasks`` go together and run on ``harness-v0``: the env's id is set to it.

    Raises:
        ConfigError: one of the two without the other, or another ``env.id`` set beside them.
    """
    if env.harness is None and env.tasks is None:
        return None
    if not env.harness or not env.tasks:
        raise ConfigError("env.harness and env.tasks go together: set both (the agent to run, "
                          "module:function or a command, and its JSONL tasks)")
    default = {f.name: f.default for f in dataclasses.fields(env)}["id"]
    if env.id not in (default, HARNESS_ENV):
        raise ConfigError(f"env.harness runs on {HARNESS_ENV}, but env.id is {env.id!r}: drop env.id")
    return {"id": HARNESS_ENV}


JUDGE_SETTINGS = register_plugin_settings("env", JudgeSettings, key="judge", optional=True, owner="the judge",
                                          paths=("cache_file",), check=check_judged_envs)
HARNESS_SETTINGS = register_plugin_settings("env", HarnessSettings, owner="the harness", paths=("tasks",),
                                            check=check_harness)
