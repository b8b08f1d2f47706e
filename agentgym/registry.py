"""The env registry: ``EnvSpec``, ``register``, ``make``, ``spec``, ``list_envs``.

Ids are ``[namespace/]name-vN``. Entry points are lazy ``"module:Class"`` strings (or callables), so
registering an env imports nothing. Built-in envs live in ``agentgym.envs``; third-party packages
register through the entry-point group ``agentgym.envs`` (each entry point names a module to import
or a zero-argument function to call, which then calls ``register``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError, DuplicateEnv, RegistryError, UnknownEnv, VersionNotFound
from agentgym.plugins import load_plugins

if TYPE_CHECKING:
    from agentgym.core import Env
    from agentgym.guard import EpisodeGuard

ENTRY_POINT_GROUP = "agentgym.envs"
_ID_RE = re.compile(r"^(?:(?P<namespace>[\w.-]+)/)?(?P<name>[\w.:-]+?)(?:-v(?P<version>\d+))?$")


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """Split ``[namespace/]name[-vN]`` into ``(namespace, name, version)``.

    Example:
        >>> parse_env_id("acme/maze-v3")
        ('acme', 'maze', 3)
        >>> parse_env_id("maze")
        (None, 'maze', None)
    """
    match = _ID_RE.fullmatch(env_id) if isinstance(env_id, str) else None
    if match is None:
        raise RegistryError(
            f"malformed env id {env_id!r}: expected '[namespace/]name-vN', e.g. 'maze-v0'"
        )
    version = match.group("version")
    return match.group("namespace"), match.group("name"), None if version is None else int(version)


@dataclass(frozen=True)
class EnvSpec:
    """Everything needed to build an env: the registry's unit of record."""

    id: str
    """Versioned id, ``[namespace/]name-vN``."""
    entry_point: str | Callable[..., Env]
    """``"module:Class"`` (imported only when the env is made) or a callable returning an ``Env``."""
    description: str = ""
    """One line shown by ``agentgym envs``."""
    max_turns: int | None = None
    """Turn budget: the episode is truncated after this many steps (``None``: no limit)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Default constructor arguments; ``make(id, **kwargs)`` overrides them."""

    @property
    def namespace(self) -> str | None:
        """The part before ``/``, if any."""
        return parse_env_id(self.id)[0]

    @property
    def name(self) -> str:
        """The id without namespace and version."""
        return parse_env_id(self.id)[1]

    @property
    def version(self) -> int | None:
        """The ``N`` of ``-vN``."""
        return parse_env_id(self.id)[2]

    def load_creator(self) -> Callable[..., Env]:
        """Import and return the env class (or factory) named by ``entry_point``."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not module_name or not attr:
            raise RegistryError(
                f"env {self.id!r} has entry point {self.entry_point!r}; expected 'module:Class'"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RegistryError(
                f"env {self.id!r} needs module {module_name!r}, which failed to import: {exc}. "
                "Install the extra that provides it (see README, 'Install')."
            ) from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise RegistryError(
                f"env {self.id!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None

    def make(self, *, max_turns: int | None = None, **kwargs: Any) -> EpisodeGuard:
        """Build the env wrapped in an ``EpisodeGuard`` (order checks, turn budget, fork)."""
        from agentgym.guard import EpisodeGuard

        merged = {**self.kwargs, **kwargs}
        turns = self.max_turns if max_turns is None else max_turns
        if turns is not None and (not isinstance(turns, int) or turns < 1):
            raise ConfigError(f"max_turns must be a positive integer or None, got {turns!r}")
        creator = self.load_creator()

        def factory() -> EpisodeGuard:
            return EpisodeGuard(
                _instantiate(self, creator, merged), max_turns=turns, spec=self, factory=factory
            )

        return factory()

    def to_json(self) -> dict[str, Any]:
        """JSON-safe description (what ``GET /envs/{id}`` returns)."""
        entry = self.entry_point
        return {
            "id": self.id,
            "description": self.description,
            "max_turns": self.max_turns,
            "entry_point": entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}",
            "kwargs": {k: v for k, v in self.kwargs.items() if _json_scalar(v)},
        }


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, dict))


def _instantiate(spec: EnvSpec, creator: Callable[..., Env], kwargs: Mapping[str, Any]) -> Env:
    from agentgym.core import Env

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
    env.spec = spec  # type: ignore[assignment]  # our EnvSpec, not gymnasium's
    return env


class Registry:
    """A table of ``EnvSpec`` by id. The module-level functions use one shared instance."""

    def __init__(self) -> None:
        self._specs: dict[str, EnvSpec] = {}
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
        override: bool = False,
    ) -> EnvSpec:
        """Add an env. Raises ``DuplicateEnv`` if the id exists and ``override`` is false."""
        _, _, version = parse_env_id(id)
        if version is None:
            raise RegistryError(f"env id {id!r} has no version; register it as '{id}-v0'")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ConfigError(f"max_turns of {id!r} must be a positive integer, got {max_turns!r}")
        spec = EnvSpec(id, entry_point, description, max_turns, dict(kwargs or {}))
        with self._lock:
            if id in self._specs and not override and self._specs[id] != spec:
                raise DuplicateEnv(f"env {id!r} is already registered; pass override=True to replace it")
            self._specs[id] = spec
        return spec

    def spec(self, env_id: str) -> EnvSpec:
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

    def make(self, env_id: str, *, max_turns: int | None = None, **kwargs: Any) -> EpisodeGuard:
        """Build a registered env (see ``EnvSpec.make``)."""
        return self.spec(env_id).make(max_turns=max_turns, **kwargs)

    def list_envs(self) -> list[EnvSpec]:
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
    override: bool = False,
) -> EnvSpec:
    """Register an env under a versioned id.

    Example:
        >>> import agentgym
        >>> spec = agentgym.register("doc/echo-v0", "agentgym.examples:EchoEnv", max_turns=3)
        >>> env = agentgym.make("doc/echo-v0")
        >>> env.reset(seed=0)[0]
        'Say something.'
    """
    return registry.register(
        id, entry_point, description=description, max_turns=max_turns, kwargs=kwargs, override=override
    )


def make(env_id: str, *, max_turns: int | None = None, **kwargs: Any) -> EpisodeGuard:
    """Build a registered env, wrapped in an ``EpisodeGuard``; ``kwargs`` override the spec's."""
    return registry.make(env_id, max_turns=max_turns, **kwargs)


def spec(env_id: str) -> EnvSpec:
    """The ``EnvSpec`` of a registered id."""
    return registry.spec(env_id)


def list_envs() -> list[EnvSpec]:
    """Every registered ``EnvSpec``, sorted by id."""
    return registry.list_envs()
