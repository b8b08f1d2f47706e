"""The algorithm API: the one import point for plug-in authors.

An algorithm is an advantage estimator over a batch's ``TurnTable`` plus what it needs from rollouts,
its rollout hooks and its update plan (``register_algorithm``); a loss term adds to the policy loss
(``register_loss_term``, told the run's length through ``RunContext``); a hook option wraps collection
(``register_hook_option``); a policy loss replaces the clipped surrogate (``register_policy_loss``).
``PluginSet`` is what one run builds from its config out of all of them, and checks at start-up.

Importing this package imports no ML framework: ``Aggregation`` (how a loss reduces its tokens) and
``TokenBatch`` (the packed rows), which policy losses and terms are handed and which compute with torch,
are loaded from this package's ``aggregation`` and ``batch`` modules when first asked for. Nothing here
imports the update engine or the run, which build on it.

Example:
    >>> from agentgym.training.api import TurnTable, episode_advantages, register_policy_loss
    >>> register_policy_loss.__module__
    'agentgym.training.api.loss_registry'
"""

from __future__ import annotations

from typing import Any

from agentgym.training.api import env_settings  # noqa: F401  (declares env.judge, env.harness to the config)
from agentgym.training.api.algorithm import (
    AdvantageEstimator,
    Algorithm,
    AlgorithmNeeds,
    get_algorithm,
    list_algorithms,
    register_algorithm,
)
from agentgym.training.api.loss_registry import (
    PolicyLoss,
    get_policy_loss,
    list_policy_losses,
    register_policy_loss,
)
from agentgym.training.api.options import HookOption, get_hook_option, list_hook_options, register_hook_option
from agentgym.training.api.plan import Phase, UpdatePlan
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.api.terms import (
    ForwardOutputs,
    LossTerm,
    RunContext,
    get_loss_term,
    list_loss_terms,
    register_loss_term,
)
from agentgym.training.api.turn_table import (
    Batch,
    NormMode,
    TurnTable,
    discounted_returns,
    episode_advantages,
    group_mean_std,
    last_turns,
    normalize,
)

#: What computes with torch, imported when first asked for: name -> module of this package.
_WITH_TORCH = {"Aggregation": "aggregation", "TokenBatch": "batch"}

__all__ = [
    "AdvantageEstimator", "Aggregation", "Algorithm", "AlgorithmNeeds", "Batch", "ForwardOutputs",
    "HookOption", "LossTerm", "NormMode", "Phase", "PluginSet", "PolicyLoss", "RunContext", "TokenBatch",
    "TurnTable", "UpdatePlan", "discounted_returns", "episode_advantages", "get_algorithm", "get_hook_option",
    "get_loss_term", "get_policy_loss", "group_mean_std", "last_turns", "list_algorithms",
    "list_hook_options",
    "list_loss_terms", "list_policy_losses", "normalize", "register_algorithm", "register_hook_option",
    "register_loss_term", "register_policy_loss",
]


def __getattr__(name: str) -> Any:
    if name in _WITH_TORCH:  # torch is imported only by who asks for these
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WITH_TORCH[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
