"""Loading a run's config: a YAML preset or the embedded quickstart, ``--set`` overrides, and every check.

``load_config`` and ``config_from_dict`` build the typed ``TrainConfig`` (field types and ranges) and
then ``check_config``: the checks that need the registries — the algorithm and its arguments, its
minimum group size, the policy loss, loss terms and rollout-hook options, the backend — so a config
that cannot work fails here, before anything is built. An override that swaps the algorithm or the
env (``--set algorithm.name=grpo``) drops the settings written for the old one (``retarget``). A relative
path written in a config file is read from that file's folder, one given with ``--set`` from the working
folder (``resolve_paths``); the presets ship inside the package (``presets_dir``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agentgym.backends.builder import list_backends, make_policy
from agentgym.errors import ConfigError, RegistryError
from agentgym.rollout.constraints import make_constraint
from agentgym.training.config.coercion import build, yaml_problem
from agentgym.training.config.plugin_settings import plugin_path_fields
from agentgym.training.config.quickstart import QUICKSTART
from agentgym.training.config.schema import AlgorithmConfig, EnvConfig, TrainConfig, apply_overrides

#: Settings that describe one env rather than the run: dropped when an override changes ``env.id``.
ENV_SETTINGS = ("env.kwargs", "env.max_turns", "rollout.action_format")
#: The schema's fields that name a file or folder (``resolve_paths``), besides the plug-ins' settings that do
#: (``plugin_path_fields``); ``model.path`` too, when it is written as a path.
PATH_FIELDS = ("sft.from_run",)
#: Env arguments (``env.kwargs``) read as paths: those whose names end so (``data_dir``, ``game_cache_dir``).
PATH_ARGUMENT_SUFFIXES = ("_dir", "_file", "_path")


#: The checks of the plug-in registries built on the config (the algorithm API's plug-in set, the run's task
#: samplers), which add themselves when imported (``register_config_check``); importing any of
#: ``agentgym.training`` imports them all first, so ``check_config`` always runs every one.
CONFIG_CHECKS: list[Callable[[TrainConfig], object]] = []
#: Per config section holding a plug-in's settings (``algorithm.args``), the settings type a plug-in name
#: declares there (its registry adds the lookup, as ``CONFIG_CHECKS``); ``retarget`` states its defaults.
SETTINGS_TYPES: dict[str, Callable[[str], type]] = {}


def register_config_check(check: Callable[[TrainConfig], object]) -> Callable[[TrainConfig], object]:
    """Run ``check(cfg)`` in every ``check_config`` (a plug-in registry's names and settings); it raises
    ``RegistryError`` or ``ConfigError`` naming the field. Registering the same check again is a no-op."""
    if check not in CONFIG_CHECKS:
        CONFIG_CHECKS.append(check)
    return check


def check_config(cfg: TrainConfig) -> TrainConfig:
    """The registry-level checks; raises ``RegistryError`` (with suggestions) or ``ConfigError`` naming the
    field."""
    if cfg.rollout.constraint is not None:
        try:
            make_constraint(cfg.rollout.constraint)
        except ConfigError as exc:  # an unknown name stays an UnknownPlugin (a RegistryError too)
            raise type(exc)(f"rollout.constraint: {exc}") from None
    if cfg.model.backend not in list_backends():
        make_policy(cfg.model)  # raises the registry's error, with suggestions
    for check in CONFIG_CHECKS:
        check(cfg)
    return cfg


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build and check a ``TrainConfig`` from nested plain data (e.g. parsed YAML).

    Example:
        >>> cfg = config_from_dict({"iterations": 3, "rollout": {"group_size": 4}})
        >>> cfg.iterations, cfg.rollout.group_size, cfg.algorithm.name
        (3, 4, 'gigpo')
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping at the top level, got {type(data).__name__}")
    return check_config(build(TrainConfig, data).validate())


def presets_dir() -> Path:
    """The folder of the shipped presets: the ``agentgym.configs`` package, which pyproject.toml maps to the
    checkout's ``configs/`` and a wheel installs inside ``agentgym``."""
    spec = importlib.util.find_spec("agentgym.configs")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    # An editable install made before configs/ was mapped keeps the old mapping until it is reinstalled
    # (make setup); its checkout's folder is the same one.
    return Path(__file__).resolve().parents[3] / "configs"


def list_presets() -> list[str]:
    """Names of the shipped presets (``configs/*.yaml`` without the suffix), sorted."""
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


def _config_file(path: str | Path) -> Path:
    """``path``, or the shipped preset it names (``quickstart_maze_grpo``, with or without ``.yaml``)."""
    file = Path(path)
    if file.is_file():
        return file
    preset = presets_dir() / (file.name if file.suffix == ".yaml" else f"{file.name}.yaml")
    if str(path) == file.name and preset.is_file():
        return preset
    presets = list_presets()
    close = difflib.get_close_matches(file.stem, presets, n=1) if str(path) == file.name else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"config file {str(file)!r} not found{hint}" + (
        f"; shipped presets (give the name): {', '.join(presets)}" if presets else ""))


def resolve_paths(data: dict[str, Any], folder: Path, *, unless_as_in: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """``data`` with each relative path it holds made absolute against ``folder``.

    The paths are the ``PATH_FIELDS``, the plug-in settings that name files (``plugin_path_fields``), the
    env arguments named like paths (``PATH_ARGUMENT_SUFFIXES``, and a harness's ``eval_tasks`` file) and
    ``model.path`` when it is written as one: ``./`` or ``../`` in front,
    or something that exists in ``folder``; otherwise it names a packaged model or a Hub model and stays as
    written. Absolute paths (``~/`` too) and URLs stay as written.

    Args:
        data: the config as plain data (not changed).
        folder: what the paths are relative to: the config file's folder, or the working folder for the
            values ``--set`` gave.
        unless_as_in: leave each path that has the same value here (the file's, resolved already).

    Example:
        >>> data = {"env": {"harness": "agent:run", "tasks": "tasks.jsonl"}, "model": {"path": "smollm2"}}
        >>> resolved = resolve_paths(data, Path("/srv/runs"))
        >>> resolved["env"]["tasks"], resolved["model"]["path"]
        ('/srv/runs/tasks.jsonl', 'smollm2')
    """
    kwargs = _get(data, "env.kwargs")
    harness = bool(_get(data, "env.harness")) or _get(data, "env.id") == "harness-v0"
    fields = [*PATH_FIELDS, *plugin_path_fields(), "model.path"] + [
        f"env.kwargs.{key}" for key in (kwargs if isinstance(kwargs, dict) else {})
        if isinstance(key, str) and (key.endswith(PATH_ARGUMENT_SUFFIXES) or harness and key == "eval_tasks")]
    resolved = copy.deepcopy(data)
    for name in fields:
        value = _get(data, name)
        if not isinstance(value, str) or not value or "://" in value:
            continue
        if Path(value).expanduser().is_absolute():
            continue
        if unless_as_in is not None and _get(unless_as_in, name) == value:
            continue
        path = folder / value
        if name == "model.path" and not (value.startswith(("./", "../")) or path.exists()):
            continue  # a packaged model's name or a Hub id
        _set(resolved, name, os.path.normpath(path))
    return resolved


def yaml_file(file: Path) -> Any:
    """The parsed content of a YAML (or JSON) config file (an empty file: ``{}``).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 text (a binary file) or is not valid YAML, in
            one line naming the file and the place.
    """
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file} is not a text config (byte {exc.start} is not UTF-8; a binary file?): "
                          f"give a YAML config file or a preset name") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the config {file}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file} is not valid YAML ({yaml_problem(exc)}); "
                          "fix the file or give a preset name") from None


def _get(data: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[part]
    node[last] = value


def _pop(data: dict[str, Any], path: str) -> Any:
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return node.pop(last, None) if isinstance(node, dict) else None


def retarget(base: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Apply ``overrides`` to ``base``, dropping what only made sense for an algorithm or env they replace.

    When the overrides change ``algorithm.name``, the base's ``algorithm.args`` (written for the old
    algorithm) are dropped, so the new one starts from its defaults plus the arguments the overrides
    give; when they change ``env.id`` (or ``env.harness``), so are ``env.kwargs``, ``env.max_turns`` and
    ``rollout.action_format`` (``ENV_SETTINGS``).

    Args:
        base: the config as read (preset file or quickstart).
        overrides: the ``key=value`` strings to apply (``apply_overrides``).

    Returns:
        The config data to build, and one note per section that lost settings (for the user).

    Example:
        >>> base = {"algorithm": {"name": "gigpo", "args": {"gamma": 0.9, "mode": "mean_norm"}}}
        >>> data, notes = retarget(base, ["algorithm.name=rloo", "algorithm.args.epsilon=0.1"])
        >>> data["algorithm"]
        {'name': 'rloo', 'args': {'epsilon': 0.1}}
        >>> notes[0].split(";")[0]
        "algorithm.name=rloo: dropped gigpo's algorithm.args (gamma, mode)"
    """
    data = apply_overrides(base, overrides)
    stale = []
    if (_get(base, "algorithm.name", AlgorithmConfig.name)
            != _get(data, "algorithm.name", AlgorithmConfig.name)):
        stale.append("algorithm.args")
    if _env_name(base) != _env_name(data):
        stale += ENV_SETTINGS
    stripped = copy.deepcopy(base)
    if not any([_pop(stripped, path) not in (None, {}) for path in stale]):
        return data, []
    data = apply_overrides(stripped, overrides)
    dropped = {}
    for path in stale:
        old, now = _get(base, path), _get(data, path)
        if isinstance(old, dict):
            lost = [str(key) for key in old if key not in (now or {})]
            if lost:
                dropped[path] = ", ".join(lost)
        elif old is not None and now is None:
            dropped[path] = repr(old)
    notes = []
    if "algorithm.args" in dropped:
        old, new = _get(base, "algorithm.name", AlgorithmConfig.name), _get(data, "algorithm.name")
        notes.append(f"algorithm.name={new}: dropped {old}'s algorithm.args "
                     f"({dropped.pop('algorithm.args')}); {new} uses its defaults{_defaults(new)} unless set "
                     "with --set algorithm.args.NAME=VALUE")
    if dropped:
        old, new = _env_name(base), _env_name(data)
        described = "; ".join(f"{path}: {what}" for path, what in dropped.items())
        notes.append(f"env.id={new}: dropped the settings made for {old} ({described}); {new} uses its "
                     f"spec's defaults unless set with --set")
    return data, notes


def _env_name(data: dict[str, Any]) -> str:
    """The env a config's data describes: ``env.id``, or ``harness-v0`` with its harness."""
    harness = _get(data, "env.harness")
    return f"harness-v0 ({harness})" if harness else str(_get(data, "env.id", EnvConfig.id))


def _defaults(name: str) -> str:
    lookup = SETTINGS_TYPES.get("algorithm.args")
    try:
        args_type = lookup(name) if lookup is not None else None
    except RegistryError:  # the unknown name is reported by check_config, with suggestions
        return ""
    if args_type is None:
        return ""
    fields = [f"{f.name}={getattr(args_type, f.name, None)!r}" for f in dataclasses.fields(args_type)]
    return f" {', '.join(fields)}" if fields else ""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                on_note: Callable[[str], None] | None = None) -> TrainConfig:
    """Read a YAML config (``None``: the embedded quickstart), apply ``key=value`` overrides, check it all.

    Args:
        path: a YAML file, the name of a shipped preset (``quickstart_maze_grpo``), or None. Relative paths
            written in it are read from its folder (``resolve_paths``).
        overrides: ``key.sub=value`` strings (``--set``); relative paths in them are read from the working
            folder.
        on_note: told what an override of ``algorithm.name`` or ``env.id`` dropped (``retarget``).

    Raises:
        ConfigError: a missing or malformed file, or any field problem (naming the field).
        RegistryError: an unknown algorithm, policy loss, loss term or hook option (with suggestions).
    """
    if path is None:
        base: Any = QUICKSTART
    else:
        file = _config_file(path)
        base = yaml_file(file)
        if not isinstance(base, dict):
            raise ConfigError(f"{file}: a config must be a mapping at the top level, "
                              f"got {type(base).__name__}")
        base = resolve_paths(base, file.absolute().parent)
    data, notes = retarget(base, overrides or [])
    # What the overrides gave (any path left relative) is the working folder's; absolute from here on, so
    # the run folder's config.json means the same from any folder (--resume, eval).
    data = resolve_paths(data, Path.cwd(), unless_as_in=base)
    cfg = config_from_dict(data)
    for note in notes:
        if on_note is not None:
            on_note(note)
    return cfg
