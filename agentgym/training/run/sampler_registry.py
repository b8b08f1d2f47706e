"""The task samplers ``rollout.task_sampler`` names: ``register_task_sampler`` and ``TASK_SAMPLERS``; a
sampler's entry carries its settings type (``rollout.<name>``).

The built-in ones (``uniform``, ``curriculum``) are registered by ``agentgym.training.run.task_sampling``,
which the registry imports before its first lookup; the ``TaskSampler`` contract is documented there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentgym.errors import UnknownPlugin
from agentgym.plugins import PluginRegistry
from agentgym.training.config.loading import register_config_check
from agentgym.training.config.plugin_settings import register_plugin_settings


@dataclass(frozen=True)
class SamplerSpec:
    """A registered task sampler: how to build it and which settings it refuses."""

    build: Callable[[Any, int], Any]
    """``build(cfg, train_tasks)``: the ``TaskSampler`` of the run ``cfg`` (a ``TrainConfig``), drawing
    below ``train_tasks`` (the training split's size, or ``eval.seed_offset``)."""
    check: Callable[[Any], None] | None = None
    """``check(cfg)`` raises a ``ConfigError`` naming the setting when ``cfg`` cannot use the sampler
    (run when the config is loaded)."""
    settings: type | None = None
    """The sampler's own settings: a dataclass written under ``rollout.<name>`` (``rollout.curriculum``),
    checked by it and read as ``cfg.rollout.<name>``; None: it has none."""


#: The samplers ``rollout.task_sampler`` names.
TASK_SAMPLERS: PluginRegistry[SamplerSpec] = PluginRegistry(
    "task sampler", "agentgym.training.run.task_sampling", field="rollout.task_sampler",
    unknown_error=UnknownPlugin)


def register_task_sampler(name: str, build: Callable[[Any, int], Any], *,
                          check: Callable[[Any], None] | None = None, settings: type | None = None,
                          override: bool = False) -> SamplerSpec:
    """Make ``rollout.task_sampler: name`` build its sampler with ``build(cfg, train_tasks)`` (see
    ``SamplerSpec``; the sampler keeps the ``TaskSampler`` contract of
    ``agentgym.training.run.task_sampling``), with its ``settings`` type under ``rollout.<name>``.

    Example:
        >>> from agentgym.training.run.task_sampling import UniformSampler
        >>> class Fixed(UniformSampler):   # the same tasks every iteration
        ...     def sample(self, iteration, round_, count):
        ...         return super().sample(0, 0, count)
        >>> spec = register_task_sampler("doc-fixed", lambda cfg, limit: Fixed(cfg.seed, limit))
        >>> from agentgym.training.config.loading import load_config
        >>> cfg = load_config(None, ["rollout.task_sampler=doc-fixed"])
        >>> sampler = TASK_SAMPLERS.get("doc-fixed").build(cfg, 100)
        >>> sampler.sample(1, 0, 3) == sampler.sample(2, 0, 3)
        True
        >>> TASK_SAMPLERS.unregister("doc-fixed")
    """
    spec = TASK_SAMPLERS.register(name, SamplerSpec(build, check, settings), override=override)
    if settings is not None:
        register_plugin_settings("rollout", settings, key=name, owner=f"task sampler {name!r}")
    return spec


def check_task_sampler(cfg: Any) -> None:
    """The config check of ``rollout.task_sampler`` (``register_config_check``): a registered name, and
    settings the sampler accepts.

    Raises:
        UnknownPlugin: an unknown sampler name (with suggestions).
        ConfigError: the sampler's own check, naming the setting.
    """
    sampler = TASK_SAMPLERS.get(cfg.rollout.task_sampler)
    if sampler.check is not None:
        sampler.check(cfg)


register_config_check(check_task_sampler)
