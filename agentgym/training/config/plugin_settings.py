"""Settings that plug-ins add to the config's sections: ``register_plugin_settings``, ``PluginSection``.

A plug-in kind (a policy loss, a task sampler, the reward judge) declares its settings type, a dataclass
with a default and a docstring per field and its checks in ``__post_init__``, and where a config writes
them: under a key of a section (``rollout.curriculum: {pool_size: 128}``, ``env.judge: {...}``), or as keys
of the section itself (``loss.cispo_clip_high: 0.3``). The schema's sections hold those values in
``plugins`` and know no plug-in: the registered settings type checks them, with the errors of the
schema's own fields (``rollout.curriculum.epsilon must be in [0, 1], got 1.5``; an unknown key is told
the nearest one). Read back, a plug-in's settings are attributes of the section
(``cfg.rollout.curriculum.pool_size``, ``cfg.loss.cispo_clip_high``), and a written config
(``config_to_dict``) has every registered setting with its value, as if the schema declared it.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Doc:
    ...     doc_width: int = 3
    >>> entry = register_plugin_settings("loss", Doc, owner="a doc loss")
    >>> from agentgym.training.config.schema import LossConfig
    >>> LossConfig().doc_width, LossConfig(plugins={"doc_width": 5}).doc_width
    (3, 5)
    >>> unregister_plugin_settings(entry)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from agentgym.errors import ConfigError, RegistryError
from agentgym.training.config.coercion import build


@dataclass(frozen=True)
class PluginSettings:
    """One plug-in's settings in one config section."""

    section: str
    """The section they are written in: ``loss``, ``rollout``, ``env``."""
    settings: type
    """The settings type: a dataclass whose fields (defaults, docstrings, ``__post_init__`` checks) are the
    settings."""
    key: str | None = None
    """Written as a mapping under this key of the section (``rollout.curriculum``); None: each field is a
    key of the section itself (``loss.cispo_clip_low``)."""
    optional: bool = False
    """With ``key``: None unless a config sets it (``env.judge``); otherwise the settings' defaults."""
    owner: str = ""
    """Who declares them, for messages (``policy loss 'cispo'``)."""
    paths: tuple[str, ...] = ()
    """Its fields that name a file or folder: a relative one is read from the config file's folder
    (``agentgym.training.config.loading.resolve_paths``)."""
    check: Callable[[Any], dict[str, Any] | None] | None = None
    """``check(section)``, run whenever the section is built: raises a ``ConfigError`` when the settings
    cannot go with the rest of the section, and returns the section's fields the settings decide (the
    ``env.id`` of the env a harness runs on), or None."""

    @property
    def keys(self) -> list[str]:
        """The keys these settings take in their section."""
        return [self.key] if self.key else [f.name for f in dataclasses.fields(self.settings)]


#: section -> key -> the plug-in settings that own it.
_KEYS: dict[str, dict[str, PluginSettings]] = {}


def register_plugin_settings(section: str, settings: type, *, key: str | None = None, optional: bool = False,
                             owner: str = "", paths: tuple[str, ...] = (),
                             check: Callable[[Any], dict[str, Any] | None] | None = None) -> PluginSettings:
    """Declare a plug-in's settings type and where configs write it (see ``PluginSettings``).

    Raises:
        RegistryError: ``settings`` is not a dataclass, or a key is taken by another plug-in's settings.
    """
    if not (dataclasses.is_dataclass(settings) and isinstance(settings, type)):
        raise RegistryError(f"{owner or 'a plug-in'}: settings must be a dataclass type, got {settings!r}")
    entry = PluginSettings(section, settings, key, optional, owner, tuple(paths), check)
    table = _KEYS.setdefault(section, {})
    for name in entry.keys:
        existing = table.get(name)
        if existing is not None and existing != entry:
            raise RegistryError(f"config key {section}.{name} is already declared by "
                                f"{existing.owner or 'a plug-in'}; {owner or 'this plug-in'} must name its "
                                f"settings otherwise")
    for name in entry.keys:
        table[name] = entry
    return entry


def unregister_plugin_settings(entry: PluginSettings) -> None:
    """Withdraw settings registered with ``register_plugin_settings`` (tests, docs)."""
    table = _KEYS.get(entry.section, {})
    for name in entry.keys:
        if table.get(name) == entry:
            del table[name]


def plugin_keys(section: str) -> list[str]:
    """The keys plug-ins declare in ``section``."""
    return list(_KEYS.get(section, {}))


def plugin_path_fields() -> list[str]:
    """The config paths of every plug-in setting that names a file (``env.tasks``...)."""
    return [f"{entry.section}.{entry.key}.{name}" if entry.key else f"{entry.section}.{name}"
            for section in _KEYS for entry in _entries(section) for name in entry.paths]


def _entries(section: str) -> list[PluginSettings]:
    return list(dict.fromkeys(_KEYS.get(section, {}).values()))


def _checked(entry: PluginSettings, values: Any, owner: str) -> Any:
    """``values`` built into ``entry.settings``; errors name ``owner.<key>.<field>`` (the section's class,
    which ``build`` re-words to the config path)."""
    where = f"{owner}.{entry.key}" if entry.key else owner
    if isinstance(values, entry.settings):
        return values
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping of its fields, got {values!r}")
    try:
        return build(entry.settings, values, where)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith(f"{entry.settings.__name__}."):  # a check the build did not re-word
            message = f"{where}." + message[len(entry.settings.__name__) + 1:]
        raise ConfigError(message) from None


class PluginSection:
    """A schema section that plug-ins add settings to. A subclass names its ``SECTION`` and declares the
    field ``plugins: dict[str, Any] = field(default_factory=dict)`` last, and calls ``check_plugins()`` in its
    ``__post_init__``; its plug-ins' settings then read as its attributes."""

    SECTION: ClassVar[str] = ""
    plugins: dict[str, Any]

    @classmethod
    def plugin_setting_keys(cls) -> list[str]:
        """The keys plug-ins declare in this section (``build`` takes them into ``plugins``)."""
        return plugin_keys(cls.SECTION)

    def check_plugins(self) -> None:
        """Check ``plugins`` against the registered settings types and fill in every default."""
        own = type(self).__name__
        table = _KEYS.get(self.SECTION, {})
        given = dict(self.plugins)
        for name in given:
            if name not in table:
                valid = [f.name for f in dataclasses.fields(self) if f.name != "plugins"] + list(table)
                close = difflib.get_close_matches(str(name), valid, n=1)
                hint = f" Did you mean {own}.{close[0]}?" if close else ""
                raise ConfigError(f"{own}.{name} is not a setting.{hint} Valid here: {', '.join(valid)}")
        full: dict[str, Any] = {}
        for entry in _entries(self.SECTION):
            if entry.key:
                value = given.get(entry.key, None if entry.optional else {})
                full[entry.key] = None if value is None and entry.optional else _checked(entry, value, own)
            else:
                values = _checked(entry, {k: given[k] for k in entry.keys if k in given}, own)
                full.update({k: getattr(values, k) for k in entry.keys})
        object.__setattr__(self, "plugins", full)
        for entry in _entries(self.SECTION):
            decided = entry.check(self) if entry.check is not None else None
            for name, value in (decided or {}).items():
                object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name != "plugins" and not name.startswith("__"):
            plugins = self.__dict__.get("plugins")
            if plugins is not None and name in plugins:
                return plugins[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
