"""Rollout-hook options: hooks usable with any algorithm, switched on by name under ``algorithm.hooks``.

An option is registered with a factory and an arguments dataclass, like a loss term; the run adds
the built hooks after the algorithm's own (``HookChain``). DAPO's dynamic sampling is one such option.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.plugins import PluginRegistry
from agentgym.rollout.hooks import RolloutHooks
from agentgym.training.config.coercion import build


@dataclass(frozen=True)
class HookOption:
    """A registered rollout-hook option."""

    name: str
    """Registry key, the name under ``algorithm.hooks``."""
    factory: Callable[[Any], RolloutHooks]
    """Builds the hooks from the arguments."""
    args_type: type
    """Dataclass of its arguments (a docstring per field)."""
    description: str = ""
    """One line for listings."""

    def build(self, values: Mapping[str, Any] | None = None) -> RolloutHooks:
        """The hooks built from validated arguments; errors name ``algorithm.hooks.<name>.<field>``."""
        return self.factory(build(self.args_type, dict(values or {}), f"algorithm.hooks.{self.name}"))


HOOK_OPTIONS: PluginRegistry[HookOption] = PluginRegistry("rollout-hook option", "agentgym.trainers",
                                                          "agentgym.trainers")


def register_hook_option(name: str, factory: Callable[[Any], RolloutHooks], args_type: type, *,
                         description: str = "", override: bool = False) -> HookOption:
    """Make ``algorithm.hooks: {NAME: {...}}`` add the hooks ``factory(args)`` to any algorithm.

    Raises:
        RegistryError: ``name`` is taken and ``override`` is False.

    Example:
        >>> @dataclass(frozen=True)
        ... class NoArgs:
        ...     pass
        >>> option = register_hook_option("doc_noop", lambda args: RolloutHooks(), NoArgs)
        >>> type(get_hook_option("doc_noop").build({})).__name__
        'RolloutHooks'
        >>> HOOK_OPTIONS.unregister("doc_noop")
    """
    return HOOK_OPTIONS.register(name, HookOption(name, factory, args_type, description), override=override)


def get_hook_option(name: str) -> HookOption:
    """The registered option ``name``; unknown names raise with suggestions."""
    return HOOK_OPTIONS.get(name)


def list_hook_options() -> list[str]:
    """Registered option names, sorted."""
    return HOOK_OPTIONS.names()
