"""Plug-in loading and named registries: ``load_plugins`` and ``PluginRegistry``.

Built-in plug-ins register on import of their package (``agentgym.envs``, ``agentgym.trainers``);
third-party packages register through entry-point groups of the same names. Every registry of
named plug-ins (algorithms, policy losses, loss terms, rollout-hook options, generation backends,
decoding constraints) is a ``PluginRegistry``: one duplicate rule, one error shape with suggestions.
Env ids have their own spec registry (``agentgym.registry``), raising the same ``RegistryError`` family.
"""

from __future__ import annotations

import difflib
import importlib
import threading
import warnings
from importlib import metadata
from typing import Generic, TypeVar

from agentgym.errors import RegistryError

T = TypeVar("T")


def load_plugins(builtin_module: str, group: str) -> None:
    """Import ``builtin_module`` (its import registers the built-ins), then load ``group``'s entry points.

    Each entry point names a module to import or a zero-argument function to call (which then
    registers). A plug-in that fails to load is reported as a warning: one broken third-party
    package must not take the built-ins down.
    """
    importlib.import_module(builtin_module)
    for entry in metadata.entry_points(group=group):
        try:
            loaded = entry.load()
            if callable(loaded):
                loaded()
        except Exception as exc:
            warnings.warn(f"agentgym plug-in {entry.name!r} ({entry.value}) of {group!r} failed to load: "
                          f"{exc}", RuntimeWarning, stacklevel=3)


class PluginRegistry(Generic[T]):
    """Named plug-ins of one kind, with lazy loading of the built-ins and entry points.

    A name can be registered once; registering it again with a different object needs
    ``override=True`` (registering the same object, or an equal one, again is a no-op).

    Args:
        kind: what the registry holds, for messages (``"algorithm"``, ``"loss term"``...).
        builtin_module: imported before the first lookup (its import registers the built-ins).
        group: entry-point group loaded before the first lookup.
        field: the setting whose value names a plug-in (``"model.backend"``): an unknown name's
            message then leads with it ("model.backend 'x' is not a registered backend").
        unknown_error: the class an unknown name raises; ``UnknownPlugin`` (a ``RegistryError``
            that is also a ``ConfigError``) for registries whose names arrive as settings that
            callers report as bad configuration.

    Example:
        >>> colours = PluginRegistry("colour")
        >>> colours.register("red", "#f00")
        '#f00'
        >>> colours.get("rde")
        Traceback (most recent call last):
        ...
        agentgym.errors.RegistryError: no colour named 'rde'. Did you mean 'red'? Registered: red
        >>> colours.register("red", "#ff0000")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.RegistryError: colour 'red' is already registered ('#f00'); pass override=True...
    """

    def __init__(self, kind: str, builtin_module: str | None = None, group: str | None = None, *,
                 field: str | None = None, unknown_error: type[RegistryError] = RegistryError) -> None:
        self.kind = kind
        self.field = field
        self.unknown_error = unknown_error
        self._builtin_module = builtin_module
        self._group = group
        self._items: dict[str, T] = {}
        self._lock = threading.RLock()
        self._loaded = builtin_module is None and group is None

    def register(self, name: str, item: T, *, override: bool = False) -> T:
        """Add ``item`` under ``name``.

        Raises:
            RegistryError: an empty name, or ``name`` taken by another object without ``override``.
        """
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        with self._lock:
            existing = self._items.get(name)
            if existing is not None and existing != item and not override:
                raise RegistryError(f"{self.kind} {name!r} is already registered ({_describe(existing)}); "
                                    f"pass override=True to replace it")
            if existing is not None and existing == item and not override:
                return existing
            self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a no-op when it is not registered)."""
        with self._lock:
            self._items.pop(name, None)

    def get(self, name: str) -> T:
        """The plug-in registered as ``name``.

        Raises:
            RegistryError: unknown name (of class ``unknown_error``); suggests close names and lists the
                registered ones.
        """
        self._load()
        found = self._items.get(name)
        if found is None:
            close = difflib.get_close_matches(str(name), list(self._items), n=3, cutoff=0.4)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            unknown = (f"{self.field} {name!r} is not a registered {self.kind}." if self.field
                       else f"no {self.kind} named {name!r}.")
            raise self.unknown_error(f"{unknown}{hint} Registered: {', '.join(self.names())}")
        return found

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._load()
        return sorted(self._items)

    def __delitem__(self, name: str) -> None:
        """``del registry[name]``: remove a registered name.

        Raises:
            KeyError: ``name`` is not registered.
        """
        with self._lock:
            del self._items[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            if self._builtin_module is not None:
                importlib.import_module(self._builtin_module)
            if self._group is not None:
                load_plugins(self._builtin_module or self._group, self._group)


def _describe(item: object) -> str:
    """Where a registered object comes from: its function (or its estimator/factory function)."""
    item = getattr(item, "estimator", None) or getattr(item, "factory", None) or item
    name = getattr(item, "__qualname__", None) or getattr(item, "name", None)
    if not isinstance(name, str):  # a plain value (a string, a number): show it
        return repr(item)[:80]
    module = getattr(item, "__module__", None) or type(item).__module__
    return f"{module}.{name}"
