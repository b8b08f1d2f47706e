"""Envs whose reset seed names a task of a split: ``RoutedTaskEnv`` (the seed's range picks the split:
training, held-out and demonstration tasks of one run) and ``TaskSplitEnv``, its one-route case (every seed
indexes one split, as an evaluation plays it).

Evaluations and training runs (whose collector resets envs by task seed) play the tasks of a split through
them: task index ``i`` travels as the reset seed and reaches the env as ``options={"split": s, "index":
i}``, which the env (or its env service) turns into the task (``agentgym.core.Env.task``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium

from agentgym.core import Env
from agentgym.errors import ConfigError


@dataclass(frozen=True)
class TaskRoute:
    """Seeds from ``start`` (up to the next route's start) name tasks of ``split``: seed ``s`` is task
    ``s - start``; ``split`` None passes the seed through unchanged (the env's own seeded tasks)."""

    start: int
    """The first seed of the range."""
    split: str | None
    """The split its seeds index; None: seeds stay seeds."""
    wrap: bool = False
    """Wrap indices past a finite split's size round to its start (demonstrations that outnumber the
    split's tasks); False: such an index fails as out of range."""


def _check_split(split: Any) -> None:
    if not isinstance(split, str) or not split:
        raise ConfigError(f"a task split is a non-empty name such as 'test', got {split!r}")


class RoutedTaskEnv(gymnasium.Wrapper[str, str, str, str], Env):
    """Wraps any agentgym env: ``reset(seed=s, options=o)`` starts task ``s - start`` of the split of the
    route whose range holds ``s`` (the route with the largest ``start`` at or below ``s``), as
    ``env.reset(options={**o, "split": split, "index": s - start})``; everything else is the wrapped env's.

    The seed the caller gives names the task, so a group's members (same seed) play the same task and
    every policy of an evaluation plays the same tasks. ``info["task_ref"]`` (set by the env) says which.
    A training run routes its three seed ranges this way (``env.train_split``, ``eval.split``): sampled
    task seeds below ``eval.seed_offset``, held-out seeds from it, demonstration seeds from
    ``sft.seed_offset``. ``fork`` forks the wrapped env.

    Args:
        env: the env to wrap (e.g. from ``agentgym.make``, or a ``RemoteEnv`` session).
        routes: at least one route; the first must start at 0 (every seed has a route). An unknown split
            fails on the first reset that uses it, naming the valid splits.

    Raises:
        ConfigError: no routes, the first not at 0, two at one start, or a route's split is not a
            non-empty name or None; ``reset`` without a seed.

    Example:
        >>> import agentgym
        >>> routes = [TaskRoute(0, "problems"), TaskRoute(100, None), TaskRoute(200, "problems", wrap=True)]
        >>> env = RoutedTaskEnv(agentgym.make("code-tests-v0"), routes)
        >>> [env.reset(seed=s)[1].get("task_ref") for s in (3, 100, 236)]
        [{'split': 'problems', 'index': 3}, None, {'split': 'problems', 'index': 0}]
    """

    # The options reach the wrapped env as they are: it (or its service) resolves split and index.
    resolves_tasks: ClassVar[bool] = False

    def __init__(self, env: Env, routes: Sequence[TaskRoute]) -> None:
        if not isinstance(env, Env):
            raise ConfigError(f"{type(self).__name__} wraps agentgym.Env instances, got {type(env).__name__}")
        ordered = sorted(routes, key=lambda route: route.start)
        if not ordered or ordered[0].start != 0:
            raise ConfigError(f"task routes must cover every seed from 0, got starts "
                              f"{[route.start for route in ordered]}")
        if len({route.start for route in ordered}) != len(ordered):
            raise ConfigError(f"two task routes start at the same seed: {[route.start for route in ordered]}")
        for route in ordered:
            if route.split is not None:
                _check_split(route.split)
        gymnasium.Wrapper.__init__(self, env)
        self.routes = tuple(ordered)
        self._sizes: dict[str, int | None] | None = None
        self.supports_snapshot = False  # type: ignore[misc]  # forks go through the wrapped env
        self.has_expert = env.has_expert  # type: ignore[misc]
        self.forkable = getattr(env, "forkable", True)  # type: ignore[misc]
        self.steps_wait = getattr(env, "steps_wait", False)  # type: ignore[misc]

    @property
    def spec(self) -> Any:  # type: ignore[override]
        """The wrapped env's spec (an agentgym ``EnvSpec``, which Gymnasium's wrapper spec cannot copy)."""
        return self.env.spec

    def route(self, seed: int) -> tuple[str | None, int]:
        """The split and index seed ``seed`` names (``(None, seed)`` on a pass-through route)."""
        route = next(r for r in reversed(self.routes) if r.start <= seed)
        if route.split is None:
            return None, seed
        index = seed - route.start
        if route.wrap:
            if self._sizes is None:
                self._sizes = {split.name: split.size for split in self.env.task_splits()}
            size = self._sizes.get(route.split)
            if size:
                index %= size
        return route.split, index

    def _needs_seed(self) -> str:
        return "reset of a RoutedTaskEnv needs a seed: its range names the split, its offset the task"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        if seed is None:
            raise ConfigError(self._needs_seed())
        split, index = self.route(int(seed))
        if split is None:
            return self.env.reset(seed=index, options=options)
        return self.env.reset(options={**(options or {}), "split": split, "index": index})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def expert_action(self) -> str | None:
        return self.env.expert_action()

    def _forked_env(self) -> Env:
        fork = getattr(self.env, "fork", None)
        if fork is None:
            raise ConfigError(f"{type(self.env).__name__} cannot fork; make envs with agentgym.make()")
        return fork()

    def fork(self) -> RoutedTaskEnv:
        """A new env in the same state (the wrapped env must have ``fork``)."""
        return RoutedTaskEnv(self._forked_env(), self.routes)


class TaskSplitEnv(RoutedTaskEnv):
    """One split: ``reset(seed=i)`` plays task ``i`` of ``split`` (a ``RoutedTaskEnv`` with the one route
    ``TaskRoute(0, split)``), the way evaluations play a named split.

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

    def __init__(self, env: Env, split: str) -> None:
        _check_split(split)  # None would be a pass-through route
        super().__init__(env, [TaskRoute(0, split)])
        self.split = split

    def _needs_seed(self) -> str:
        return (f"reset of a TaskSplitEnv needs seed=INDEX: the index of the task of split {self.split!r} "
                f"to play")

    def fork(self) -> TaskSplitEnv:
        """A new env in the same state (the wrapped env must have ``fork``)."""
        return TaskSplitEnv(self._forked_env(), self.split)
