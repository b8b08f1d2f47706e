"""Plug-in loading and named registries: ``load_plugins`` and ``PluginRegistry``.

Built-in plug-ins register on import of their package (``agentgym.envs``, ``agentgym.trainers``);
third-party packages register through entry-point groups of the same names. Every registry of
named plug-ins (algorithms, policy losses, loss terms, rollout-hook options, generation backends,
decoding constraints) is a ``PluginRegistry``: one duplicate rule, one error shape with suggestions.
Env ids have their own spec registry (``agentgym.registry``), raising the same ``RegistryError`` family.

``import_object`` is the one resolver of ``"module:attr"`` names (env entry points, harnesses, reward
and expert functions): it finds a user's own modules in the working folder, as ``python -m`` does,
while agentgym and its dependencies always come from the installed packages (``use_working_folder``).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import threading
import warnings
from importlib import metadata
from typing import Any, Generic, TypeVar

from agentgym.errors import AgentGymError, ConfigError, RegistryError

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


def use_working_folder() -> bool:
    """Put the working folder on ``sys.path``, *after* the installed packages; True when it was added.

    A user names their own code as ``module:attr`` (``--harness my_agent:run``, an env registered as
    ``"my_env:MyEnv"``) and expects it found in the folder they run from, as ``python -m``, uvicorn and
    pytest find it. The ``agentgym`` command's ``sys.path`` starts at its script's folder instead, and
    children started with ``python_command`` drop the working folder on purpose. Appending (rather than
    inserting first, as ``python -m`` does) keeps the rule that agentgym and its dependencies come from the
    installed packages whatever the folder holds: an ``agentgym/`` source tree or a ``tokenizers.py`` there
    shadows nothing. A user module named like an installed one loses; ``import_object`` then says so.

    Example:
        >>> use_working_folder() in (True, False) and _working_folder_listed()
        True
    """
    if _working_folder_listed():
        return False
    sys.path.append(os.getcwd())
    importlib.invalidate_caches()  # a folder searched before (and found empty of the module) is read again
    return True


def _working_folder_listed() -> bool:
    here = os.path.realpath(os.getcwd())
    return any(os.path.realpath(entry or os.curdir) == here for entry in sys.path if isinstance(entry, str))


def import_object(path: str, *, what: str, error: type[AgentGymError] = ConfigError,
                  install_hint: str | None = None) -> Any:
    """The object that ``"module:attr"`` names (``attr`` may be dotted: ``"pkg.mod:Class.method"``).

    Every ``module:attr`` setting of agentgym is resolved here. The module is looked up in the installed
    packages, then in the working folder (``use_working_folder``), so a user's ``my_agent.py`` is found
    from the folder they run in, in this process and in the service workers it starts.

    Args:
        path: the ``"module:attr"`` text.
        what: what the name is, for messages (``"harness 'my_agent:run'"``, ``"env 'acme/coin-v0'"``).
        error: the class raised (a ``ConfigError`` by default; the registry raises ``RegistryError``).
        install_hint: the fix when the module is there but needs a package that is not installed
            (default: install that package).

    Raises:
        AgentGymError: of class ``error``: ``path`` is not ``module:attr``; no such module (the message
            names the folder searched and how to make the module importable); importing it raised; or it
            has no such attribute.

    Example:
        >>> import_object("json:dumps", what="reward").__name__
        'dumps'
        >>> import_object("no_such_module_here:run", what="harness")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: harness: module 'no_such_module_here' cannot be imported: there is no ...
    """
    module_name, colon, attribute = str(path).partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise error(f"{what}: {path!r} is not 'module:attr' (e.g. 'my_agent:run', for the module my_agent.py "
                    "in the working folder or an installed package)")
    module_name, attribute = module_name.strip(), attribute.strip()
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _is_or_contains(exc.name, module_name):  # the module is there; something it imports is not
            hint = install_hint or f"install the package that provides {exc.name!r} (pip install ...)"
            raise error(f"{what}: module {module_name!r} cannot be imported: it needs {exc.name!r}, which is "
                        f"not installed; {hint}") from exc
        top = module_name.split(".")[0]
        raise error(f"{what}: module {module_name!r} cannot be imported: there is no {top}.py or {top}/ in "
                    f"the working folder {os.getcwd()} and no installed package of that name; run agentgym "
                    "from the folder that holds it, add that folder to PYTHONPATH, or pip install the "
                    "package that provides it") from None
    except Exception as exc:  # the user's module itself raised: say where, keep the traceback chained
        text = " ".join(str(exc).split())[:300]
        raise error(f"{what}: module {module_name!r} cannot be imported: importing it raised "
                    f"{type(exc).__name__}{': ' + text if text else ''}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            where = getattr(module, "__file__", None)
            found = f" (found at {where})" if where else ""
            shadowed = _shadowed_note(module_name, where) if where else ""
            raise error(f"{what}: module {module_name!r} has no attribute {attribute!r}{found}{shadowed}"
                        ) from None
    return target


def _import_module(name: str) -> Any:
    """``importlib.import_module``, retried with the working folder on ``sys.path`` when it was missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not _is_or_contains(exc.name, name) or not use_working_folder():
            raise
    return importlib.import_module(name)


def _is_or_contains(missing: str | None, name: str) -> bool:
    """Whether the module ``missing`` (a ``ModuleNotFoundError``'s name) is ``name`` or a package above it."""
    return missing is not None and (name == missing or name.startswith(missing + "."))


def _shadowed_note(module_name: str, where: str) -> str:
    """A note when the working folder holds a module of that name that an installed one hides."""
    top = module_name.split(".")[0]
    here = os.getcwd()
    local = next((os.path.join(here, c) for c in (f"{top}.py", top) if os.path.exists(os.path.join(here, c))),
                 None)
    if local is None or os.path.realpath(where).startswith(os.path.realpath(here) + os.sep):
        return ""
    return (f"; the working folder's {os.path.basename(local)} is hidden by that installed module of the "
            "same name (installed packages come first): rename yours")


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
