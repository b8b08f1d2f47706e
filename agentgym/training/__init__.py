"""Training: turn table and statistics, algorithms and their plug-in points, packing, losses and loss
terms, update plans, config, checkpoints, metrics, and the loop.

Importing this package imports no ML framework, and neither does checking a config (``load_config``):
the loss terms import torch only where they compute, and the policy losses are looked up by name in
``loss_registry``. The modules that compute (losses, packing, update, loop) import torch when imported.

Example:
    >>> from agentgym.training import get_algorithm, load_config
    >>> cfg = load_config(None, ["algorithm.name=grpo", "algorithm.args={}"])
    >>> get_algorithm(cfg.algorithm.name).description.split(" ")[0]
    'GRPO'
"""

from __future__ import annotations

from agentgym.training.api.algorithm import (
    AdvantageEstimator,
    Algorithm,
    AlgorithmNeeds,
    get_algorithm,
    list_algorithms,
    register_algorithm,
)
from agentgym.training.api.options import HookOption, get_hook_option, list_hook_options, register_hook_option
from agentgym.training.api.plan import Phase, UpdatePlan
from agentgym.training.api.turn_table import (
    TurnTable,
    discounted_returns,
    episode_advantages,
    group_mean_std,
    normalize,
)
from agentgym.training.config.loading import check_config, config_from_dict, load_config
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

# The run's task samplers check rollout.task_sampler in every config check and declare their settings
# (rollout.curriculum); importing them here, as the algorithm API above, registers both whatever module of
# the package is imported first.
from agentgym.training.run import task_sampling  # noqa: F401, E402  (registers the built-in samplers)

__all__ = [
    "AdvantageEstimator", "Algorithm", "AlgorithmConfig", "AlgorithmNeeds", "EnvConfig", "EvalConfig",
    "HookOption", "LossConfig", "OptimConfig", "Phase", "RolloutConfig", "SFTConfig", "TrainConfig",
    "TurnTable", "UpdatePlan", "check_config", "config_from_dict", "config_to_dict", "discounted_returns",
    "episode_advantages", "get_algorithm", "get_hook_option", "group_mean_std", "list_algorithms",
    "list_hook_options", "load_config", "normalize", "register_algorithm", "register_hook_option",
]
