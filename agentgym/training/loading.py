"""Loading a run's config: a YAML preset or the embedded quickstart, ``--set`` overrides, and every check.

``load_config`` and ``config_from_dict`` build the typed ``TrainConfig`` (field types and ranges) and
then ``check_config``: the checks that need the registries — the algorithm and its arguments, its
minimum group size, the policy loss, loss terms and rollout-hook options, the backend — so a config
that cannot work fails here, before anything is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentgym.backends.builder import list_backends, make_policy
from agentgym.errors import ConfigError
from agentgym.training.coercion import build
from agentgym.training.config import TrainConfig, apply_overrides
from agentgym.training.recipe import Recipe


def check_config(cfg: TrainConfig) -> TrainConfig:
    """The registry-level checks; raises ``RegistryError`` (with suggestions) or ``ConfigError`` naming the field."""
    if cfg.model.backend not in list_backends():
        make_policy(cfg.model)  # raises the registry's error, with suggestions
    Recipe.from_config(cfg)
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
    """The ``configs/`` folder of presets next to the package (a source checkout)."""
    return Path(__file__).resolve().parents[2] / "configs"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML preset (``None``: the embedded quickstart), apply ``key=value`` overrides, check it all.

    Raises:
        ConfigError: a missing or malformed file, or any field problem (naming the field).
        RegistryError: an unknown algorithm, policy loss, loss term or hook option (with suggestions).
    """
    if path is None:
        from agentgym.training.quickstart import QUICKSTART

        data: Any = QUICKSTART
    else:
        file = Path(path)
        if not file.is_file():
            presets = sorted(p.name for p in presets_dir().glob("*.yaml"))
            raise ConfigError(f"config file {str(file)!r} not found" + (
                f"; presets in configs/: {', '.join(presets)}" if presets else ""))
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file} is not valid YAML: {exc}") from None
    return config_from_dict(apply_overrides(data, overrides or []))
