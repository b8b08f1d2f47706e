"""The env registry: ``register``, ``make``, ``spec``, ``list_envs`` and loading entry points.

Ids are ``[namespace/]name-vN``. Entry points are lazy ``"module:Class"`` strings (or callables), so
registering an env imports nothing. Built-in envs live in ``agentgym.envs``; third-party packages
register through the entry-point group ``agentgym.envs`` (each entry point names a module to import
or a zero-argument function to call, which then calls ``register``).

``make`` does what Gymnasium's ``make`` does for a spec: it loads the entry point, instantiates it
with the spec's kwargs and the caller's, and wraps it in an ``EpisodeGuard`` (order checks, turn
budget, fork). ``EnvSpec`` (``agentgym.spec``) is the data; this module is the only one that builds.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.core import Env
from agentgym.errors import ConfigError, DuplicateEnv, RegistryError, UnknownEnv, VersionNotFound
from agentgym.guard import EpisodeGuard
from agentgym.plugins import import_object, load_plugins
from agentgym.spec import ActionFormat, EnvSpec, parse_env_id

__all__ = [
    "ENTRY_POINT_GROUP",
    "Registry",
    "RegistrySpec",
    "list_envs",
    "load_env_creator",
    "make",
    "register",
    "registry",
    "spec",
]

ENTRY_POINT_GROUP = "agentgym.envs"


def load_env_creator(spec: EnvSpec) -> Callable[..., Env]:
    """Import and return the env class (or factory) that ``spec.entry_point`` names.

    Raises:
        RegistryError: the entry point is not ``"module:attr"``, the module fails to import (it is looked
            for in the installed packages, then the working folder: ``agentgym.plugins.import_object``), or
            it has no such attribute.

    Example:
        >>> load_env_creator(EnvSpec("doc/echo-v0", "agentgym.examples:EchoEnv")).__name__
        'EchoEnv'
    """
    if callable(spec.entry_point):
        return spec.entry_point
    return import_object(spec.entry_point, what=f"env {spec.id!r} (entry point {spec.entry_point!r})",
                         error=RegistryError, install_hint="install the extra that provides it (the extras "
                         "are listed at the end of README.md)")


@dataclasses.dataclass(frozen=True)
class RegistrySpec(EnvSpec):
    """An ``EnvSpec`` as the registry hands it out: the same data, plus ``make()``.

    ``register``, ``spec`` and ``list_envs`` return these, and every env ``make`` builds carries one
    as ``env.spec``, so ``spec.make()`` works wherever Gymnasium expects it (its ``check_env`` builds
    fresh envs through ``env.spec.make(...)``). ``EnvSpec`` itself cannot offer ``make``: the guard
    it would have to import already imports it.

    Example:
        >>> import agentgym
        >>> spec = agentgym.spec("maze-v0")
        >>> isinstance(spec, agentgym.EnvSpec), spec.make().spec is spec
        (True, True)
    """

    def make(self, **kwargs: Any) -> EpisodeGuard:
        """Build this env: the same as ``agentgym.make(self, **kwargs)``."""
        return make(self, **kwargs)


def _as_registry_spec(spec: EnvSpec) -> RegistrySpec:
    if isinstance(spec, RegistrySpec):
        return spec
    return RegistrySpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(EnvSpec)})


def _instantiate(
    spec: RegistrySpec, creator: Callable[..., Env], kwargs: Mapping[str, Any], render_mode: str | None
) -> Env:
    try:
        signature = inspect.signature(creator)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            accepted = [p for p in signature.parameters if p not in ("self", "args", "kwargs")]
            raise ConfigError(
                f"env {spec.id!r} rejected its arguments {sorted(kwargs)}: {exc}. "
                f"It accepts: {', '.join(accepted) or 'no arguments'}."
            ) from None
    env = creator(**kwargs)
    if not isinstance(env, Env):
        raise RegistryError(
            f"entry point of {spec.id!r} returned {type(env).__name__}, not an agentgym.Env subclass"
        )
    if render_mode is not None:
        modes = list(env.metadata.get("render_modes", []))
        if render_mode not in modes:
            raise ConfigError(f"env {spec.id!r} renders in modes {modes}; got render_mode={render_mode!r}")
        # A text env renders the same text in every mode it declares; the attribute records the ask.
        env.render_mode = render_mode
    env.spec = spec  # type: ignore[assignment]  # our EnvSpec, not gymnasium's
    return env


def _build(
    spec: EnvSpec, *, max_turns: int | None, render_mode: str | None, kwargs: Mapping[str, Any]
) -> EpisodeGuard:
    """Load, instantiate and wrap ``spec``'s env; the guard keeps the recipe so ``fork`` can rebuild."""
    bound = _as_registry_spec(spec)
    merged = {**bound.kwargs, **kwargs}
    turns = bound.max_turns if max_turns is None else max_turns
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise ConfigError(f"max_turns must be a positive integer or None, got {turns!r}")
    creator = load_env_creator(bound)

    def factory() -> EpisodeGuard:
        env = _instantiate(bound, creator, merged, render_mode)
        return EpisodeGuard(env, max_turns=turns, spec=bound, factory=factory)

    return factory()


class Registry:
    """A table of specs by id. The module-level functions use one shared instance."""

    def __init__(self) -> None:
        self._specs: dict[str, RegistrySpec] = {}
        self._lock = threading.RLock()
        self._plugins_loaded = False

    def register(
        self,
        id: str,
        entry_point: str | Callable[..., Env],
        *,
        description: str = "",
        max_turns: int | None = None,
        kwargs: Mapping[str, Any] | None = None,
        action_format: ActionFormat | None = None,
        override: bool = False,
    ) -> RegistrySpec:
        """Add an env (see the module-level ``register``)."""
        _, _, version = parse_env_id(id)
        if version is None:
            raise RegistryError(f"env id {id!r} has no version; register it as '{id}-v0'")
        spec = RegistrySpec(id, entry_point, description, max_turns, dict(kwargs or {}), action_format)
        with self._lock:
            if id in self._specs and not override and self._specs[id] != spec:
                raise DuplicateEnv(f"env {id!r} is already registered; pass override=True to replace it")
            self._specs[id] = spec
        return spec

    def spec(self, env_id: str) -> RegistrySpec:
        """Look up a spec; unknown ids raise with the nearest registered ids as suggestions."""
        self._load_plugins()
        with self._lock:
            found = self._specs.get(env_id)
            if found is not None:
                return found
            namespace, name, version = parse_env_id(env_id)
            same_name = sorted(
                (s for s in self._specs.values() if (s.namespace, s.name) == (namespace, name)),
                key=lambda s: s.version or 0,
            )
            if same_name:
                versions = ", ".join(s.id for s in same_name)
                if version is None:
                    raise VersionNotFound(
                        f"env id {env_id!r} has no version; did you mean {same_name[-1].id!r}? "
                        f"Registered versions: {versions}"
                    )
                raise VersionNotFound(
                    f"env {env_id!r} is not registered in that version; registered: {versions}"
                )
            close = difflib.get_close_matches(env_id, list(self._specs), n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownEnv(
                f"no env registered as {env_id!r}.{hint} Run `agentgym envs` to list them all."
            )

    def make(
        self, env: str | EnvSpec, /, *, max_turns: int | None = None, render_mode: str | None = None,
        **kwargs: Any,
    ) -> EpisodeGuard:
        """Build a registered id, or any spec (see the module-level ``make``)."""
        if isinstance(env, str):
            env = self.spec(env)
        elif not isinstance(env, EnvSpec):
            raise ConfigError(f"make() takes an env id or an EnvSpec, got {type(env).__name__}")
        return _build(env, max_turns=max_turns, render_mode=render_mode, kwargs=kwargs)

    def list_envs(self) -> list[RegistrySpec]:
        """All registered specs, sorted by id."""
        self._load_plugins()
        with self._lock:
            return sorted(self._specs.values(), key=lambda s: s.id)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
            load_plugins("agentgym.envs", ENTRY_POINT_GROUP)


registry = Registry()


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    description: str = "",
    max_turns: int | None = None,
    kwargs: Mapping[str, Any] | None = None,
    action_format: ActionFormat | None = None,
    override: bool = False,
) -> RegistrySpec:
    """Register an env under a versioned id.

    Args:
        id: ``[namespace/]name-vN``; the version is required.
        entry_point: ``"module:Class"`` (imported on the first ``make``) or a callable returning an ``Env``.
        description: one line for ``agentgym envs``.
        max_turns: turn budget (``None``: no limit).
        kwargs: default constructor arguments.
        action_format: how a policy's reply becomes the action (see ``EnvSpec.action_format``).
        override: replace an existing, different registration instead of raising ``DuplicateEnv``.

    Returns:
        The registered spec.

    Raises:
        RegistryError: a malformed or unversioned id.
        DuplicateEnv: the id is taken by a different spec and ``override`` is false.
        ConfigError: ``max_turns`` or ``action_format`` is invalid.

    Example:
        >>> import agentgym
        >>> spec = agentgym.register("doc/echo-v0", "agentgym.examples:EchoEnv", max_turns=3)
        >>> env = agentgym.make("doc/echo-v0")
        >>> env.reset(seed=0)[0]
        'Say something.'
    """
    return registry.register(
        id, entry_point, description=description, max_turns=max_turns, kwargs=kwargs,
        action_format=action_format, override=override,
    )


def make(
    env: str | EnvSpec, /, *, max_turns: int | None = None, render_mode: str | None = None, **kwargs: Any
) -> EpisodeGuard:
    """Build an env wrapped in an ``EpisodeGuard`` (order checks, turn budget, fork).

    Args:
        env: a registered id, or an ``EnvSpec`` (registered or not); positional, so an env whose
            constructor takes an ``env`` argument still gets it from ``kwargs``.
        max_turns: overrides the spec's turn budget.
        render_mode: one of the env's ``metadata["render_modes"]`` (``"ansi"`` for text envs), or ``None``.
        **kwargs: constructor arguments; they override the spec's ``kwargs``.

    Returns:
        The guarded env; ``env.spec`` is the spec it was made from.

    Raises:
        UnknownEnv, VersionNotFound: the id is not registered (the message suggests the nearest).
        RegistryError: the entry point cannot be imported or does not return an ``agentgym.Env``.
        ConfigError: the env rejects the kwargs, or ``max_turns``/``render_mode`` is invalid.

    Example:
        >>> import agentgym
        >>> env = agentgym.make(agentgym.EnvSpec("doc/echo-v1", "agentgym.examples:EchoEnv"), target="yo")
        >>> env.reset(seed=0)[0], env.step("yo")[1]
        ('Say something.', 1.0)
        >>> env.spec.make().spec.id  # specs attached to made envs can make siblings, as in Gymnasium
        'doc/echo-v1'
    """
    return registry.make(env, max_turns=max_turns, render_mode=render_mode, **kwargs)


def spec(env_id: str) -> RegistrySpec:
    """The spec of a registered id (unknown ids raise with suggestions)."""
    return registry.spec(env_id)


def list_envs() -> list[RegistrySpec]:
    """Every registered spec, sorted by id."""
    return registry.list_envs()
