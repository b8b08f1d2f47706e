"""``TaskSplitEnv``: an env whose ``reset(seed=i)`` starts task ``i`` of one task split.

Evaluations (and any collector, which resets envs by task seed) play the tasks of a split through it:
task index ``i`` travels as the reset seed and reaches the env as ``options={"split": s, "index": i}``,
which the env (or its env service) turns into the task (``agentgym.core.Env.task``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium

from agentgym.core import Env
from agentgym.errors import ConfigError


class TaskSplitEnv(gymnasium.Wrapper[str, str, str, str], Env):
    """Wraps any agentgym env: ``reset(seed=i, options=o)`` is ``env.reset(options={**o, "split": split,
    "index": i})``; everything else is the wrapped env's.

    The seed the caller gives is the task index, so a group's members (same seed) play the same task
    and every policy of an evaluation plays task ``i`` of the split. ``info["task_ref"]`` (set by the
    env) says which. ``fork`` forks the wrapped env.

    Args:
        env: the env to wrap (e.g. from ``agentgym.make``, or a ``RemoteEnv`` session).
        split: one of ``env.task_splits()`` (an unknown one fails on the first reset, naming the valid
            splits).

    Raises:
        ConfigError: ``split`` is not a non-empty string; ``reset`` without a seed (no task index).

    Example:
        >>> import agentgym
        >>> env = TaskSplitEnv(agentgym.make("code-tests-v0"), "problems")
        >>> obs, info = env.reset(seed=1)
        >>> info["task_id"], info["task_ref"]
        ('fizzbuzz', {'split': 'problems', 'index': 1})
    """

    # The options reach the wrapped env as they are: it (or its service) resolves split and index.
    resolves_tasks: ClassVar[bool] = False

    def __init__(self, env: Env, split: str) -> None:
        if not isinstance(env, Env):
            raise ConfigError(f"TaskSplitEnv wraps agentgym.Env instances, got {type(env).__name__}")
        if not isinstance(split, str) or not split:
            raise ConfigError(f"a task split is a non-empty name such as 'test', got {split!r}")
        gymnasium.Wrapper.__init__(self, env)
        self.split = split
        self.supports_snapshot = False  # type: ignore[misc]  # forks go through the wrapped env
        self.has_expert = env.has_expert  # type: ignore[misc]
        self.forkable = getattr(env, "forkable", True)  # type: ignore[misc]
        self.steps_wait = getattr(env, "steps_wait", False)  # type: ignore[misc]

    @property
    def spec(self) -> Any:  # type: ignore[override]
        """The wrapped env's spec (an agentgym ``EnvSpec``, which Gymnasium's wrapper spec cannot copy)."""
        return self.env.spec

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        if seed is None:
            raise ConfigError(f"reset of a TaskSplitEnv needs seed=INDEX: the index of the task of split "
                              f"{self.split!r} to play")
        return self.env.reset(options={**(options or {}), "split": self.split, "index": int(seed)})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def expert_action(self) -> str | None:
        return self.env.expert_action()

    def fork(self) -> TaskSplitEnv:
        """A new env in the same state (the wrapped env must have ``fork``)."""
        fork = getattr(self.env, "fork", None)
        if fork is None:
            raise ConfigError(f"{type(self.env).__name__} cannot fork; make envs with agentgym.make()")
        return TaskSplitEnv(fork(), self.split)
