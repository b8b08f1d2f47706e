"""Plain data (YAML, JSON, ``--set`` values) into typed dataclasses, with errors that name the field.

``build(cls, data, where)`` builds a dataclass from a mapping: unknown keys get a "did you mean"
hint, values are checked against the field types (``Literal`` choices, unions, tuples, nested
dataclasses), and numbers written as strings (YAML 1.1 reads ``1e-4`` as a string) are accepted for
numeric fields. A ``ConfigError`` raised by a dataclass's own ``__post_init__`` is re-worded to name
the config path (``loss.clip_ratio_low``) instead of the class.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from agentgym.errors import ConfigError

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _number_from_text(value: Any, integer: bool) -> Any:
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        number = float(value)
        if not integer:
            return number
        if number.is_integer():
            return int(number)
    return value


def coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked (and converted where lossless) against the type ``tp``; ``where`` names it.

    Example:
        >>> coerce("1e-4", float, "optim.lr")
        0.0001
        >>> coerce(["</search>"], tuple[str, ...], "rollout.stop_strings")
        ('</search>',)
        >>> coerce("bogus", Literal["mean_norm", "mean_std_norm"],
        ...        "algorithm.args.mode")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: algorithm.args.mode must be one of 'mean_norm', 'mean_std_norm';
        got 'bogus'
        >>> coerce(["</search>", "</answer>"], tuple[str, ...], "rollout.stop_strings")
        ('</search>', '</answer>')
    """
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of its fields, got {value!r}")
        return build(tp, value, where)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of "
                          f"{', '.join(_type_name(o) for o in options)}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if origin is tuple and len(get_args(tp)) == 2 and get_args(tp)[1] is Ellipsis:  # tuple[str, ...]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(coerce(v, get_args(tp)[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(get_args(tp)):
            raise ConfigError(f"{where} must be a list of {len(get_args(tp))} values, got {value!r}")
        return tuple(coerce(v, t, f"{where}[{i}]")
                     for i, (v, t) in enumerate(zip(value, get_args(tp), strict=True)))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if tp is float:
        value = _number_from_text(value, integer=False)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is int:
        value = _number_from_text(value, integer=True)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if tp is typing.Any:
        return value
    raise ConfigError(f"{where}: unsupported field type {tp!r}")  # pragma: no cover


def build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """An instance of the dataclass ``cls`` from ``data``; every problem names ``where.field``.

    A dataclass may list fields it no longer has in a ``RETIRED_FIELDS`` class variable (name → what to
    write instead); a config that still sets one is told the new spelling.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Args:
        ...     gamma: float = 0.95
        >>> build(Args, {"gama": 0.9}, "algorithm.args")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: unknown config field 'algorithm.args.gama'.
        Did you mean algorithm.args.gamma? Valid here: gamma
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping of its fields, got {data!r}")
    hints = get_type_hints(cls)
    # A section that plug-ins add settings to (``PluginSection``) takes their keys into ``plugins``.
    extra = cls.plugin_setting_keys() if hasattr(cls, "plugin_setting_keys") else None
    names = [f.name for f in dataclasses.fields(cls) if extra is None or f.name != "plugins"]
    valid = names + [k for k in extra or () if k not in names]
    values = {}
    plugins: dict[str, Any] = {}
    prefix = f"{where}." if where else ""
    retired: dict[str, str] = getattr(cls, "RETIRED_FIELDS", {})
    for key, value in data.items():
        if key in retired:  # a field that had another spelling once: say what replaced it
            raise ConfigError(f"config field '{prefix}{key}' no longer exists: {retired[key]}")
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean {prefix}{close[0]}?" if close else ""
            raise ConfigError(f"unknown config field '{prefix}{key}'.{hint} Valid here: {', '.join(valid)}")
        if key in names:
            values[key] = coerce(value, hints[key], f"{prefix}{key}")
        else:  # checked by the plug-in's settings type
            plugins[key] = value
    if plugins:
        values["plugins"] = plugins
    try:
        return cls(**values)
    except ConfigError as exc:
        # A dataclass's own checks say "ClassName.field ..."; the user wrote "where.field".
        message = str(exc)
        if where:
            message = message.replace(f"{cls.__name__}.", f"{where}.")
        raise ConfigError(message) from None


def to_plain(value: Any) -> Any:
    """Nested plain data (dicts, lists, scalars) of a dataclass instance: the inverse of ``build``.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Pair:
        ...     betas: tuple = (0.9, 0.999)
        >>> to_plain(Pair())
        {'betas': [0.9, 0.999]}
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "plugin_setting_keys"):  # plug-ins' settings are written as the section's keys
            plain = {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                     if f.name != "plugins"}
            return {**plain, **{k: to_plain(v) for k, v in value.plugins.items()}}
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def yaml_problem(exc: Exception) -> str:
    """What the YAML parser objected to (a ``yaml.YAMLError``), and where, on one line."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
