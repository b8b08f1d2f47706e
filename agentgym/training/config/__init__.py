"""A run's config: its schema (``schema``: one dataclass per section, a docstring per field), plain
data to and from dataclasses (``coercion``), and loading a preset with overrides, checked at start-up
without torch (``loading``).

The schema's sections are importable from here:

    >>> from agentgym.training.config import TrainConfig
    >>> TrainConfig().rollout.group_size > 1
    True
"""

from __future__ import annotations

from agentgym.training.config.schema import (
    AlgorithmConfig,
    EnvConfig,
    EvalConfig,
    LossConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
    TrainConfig,
    config_to_dict,
)

__all__ = ["AlgorithmConfig", "EnvConfig", "EvalConfig", "LossConfig", "OptimConfig", "RolloutConfig",
           "SFTConfig", "TrainConfig", "config_to_dict"]
