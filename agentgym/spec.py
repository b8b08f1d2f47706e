"""``EnvSpec``: what the registry records about an env, as plain data (no loading, no building).

An ``EnvSpec`` names an env (``[namespace/]name-vN``), says where its class lives (a lazy
``"module:Class"`` string or a callable), and carries its defaults: description, turn budget,
constructor arguments and the action format a policy should answer in. Building an env from a
spec is the registry's job (``agentgym.make``); this module imports nothing that builds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from agentgym.errors import ConfigError, RegistryError

if TYPE_CHECKING:
    from agentgym.core import Env

_ID_RE = re.compile(r"^(?:(?P<namespace>[\w.-]+)/)?(?P<name>[\w.:-]+?)(?:-v(?P<version>\d+))?$")

#: How a policy's reply becomes the env's action (see ``EnvSpec.action_format``).
ActionFormat = Literal["plain", "tag", "raw"]
ACTION_FORMATS: tuple[str, ...] = get_args(ActionFormat)


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """Split ``[namespace/]name[-vN]`` into ``(namespace, name, version)``.

    Raises:
        RegistryError: ``env_id`` is not a string of that shape.

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
    """Everything needed to build an env: the registry's unit of record.

    The fields are validated on construction (a malformed id, a non-positive ``max_turns`` or an
    unknown ``action_format`` raise), so a spec that exists is a spec ``agentgym.make`` can use.

    Changed in v0.1: ``EnvSpec`` is plain data; ``agentgym.make(spec)`` builds it (the specs the
    registry hands out keep a ``make()`` that does the same), because a spec that built envs made
    the spec, the registry and ``EpisodeGuard`` import one another.

    Example:
        >>> spec = EnvSpec("acme/maze-v3", "acme.envs:Maze", max_turns=20, action_format="tag")
        >>> spec.namespace, spec.name, spec.version
        ('acme', 'maze', 3)
        >>> spec.to_json()["action_format"]
        'tag'
        >>> EnvSpec("acme/maze-v3", "acme.envs:Maze", action_format="xml")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: action_format of 'acme/maze-v3' must be one of 'plain', 'tag', ...
    """

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
    action_format: ActionFormat | None = None
    """How a policy's reply becomes the action: ``"plain"`` (the reply's first line), ``"tag"`` (the
    text inside ``<action>...</action>``) or ``"raw"`` (the whole reply; the env itself answers what
    it cannot use with ``info["invalid_action"]``, as tool envs that parse tags and tool calls do).
    ``None`` means ``"plain"``."""

    #: Gymnasium's ``EnvSpec`` field, read by its checker: the contract requires determinism
    #: (``check_env`` verifies it), so no agentgym env is nondeterministic.
    nondeterministic: ClassVar[bool] = False

    def __post_init__(self) -> None:
        parse_env_id(self.id)
        turns = self.max_turns
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
            raise ConfigError(f"max_turns of {self.id!r} must be a positive integer or None, got {turns!r}")
        if self.action_format is not None and self.action_format not in ACTION_FORMATS:
            choices = ", ".join(repr(f) for f in ACTION_FORMATS)
            raise ConfigError(
                f"action_format of {self.id!r} must be one of {choices} or None, got {self.action_format!r}"
            )

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

    def to_json(self) -> dict[str, Any]:
        """JSON-safe description (what ``GET /envs/{id}`` returns); kwargs that are not JSON are left out."""
        entry = self.entry_point
        return {
            "id": self.id,
            "description": self.description,
            "max_turns": self.max_turns,
            "action_format": self.action_format,
            "entry_point": entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}",
            "kwargs": {k: v for k, v in self.kwargs.items() if _json_scalar(v)},
        }


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, dict))
