"""The algorithm API: the one import point for plug-in authors.

An algorithm is an advantage estimator over a batch's ``TurnTable`` plus what it needs from rollouts,
its rollout hooks and its update plan (``register_algorithm``); a loss term adds to the policy loss
(``register_loss_term``, told the run's length through ``RunContext``); a hook option wraps collection
(``register_hook_option``); a policy loss replaces the clipped surrogate (``register_policy_loss``).
``PluginSet`` is what one run builds from its config out of all of them, and checks at start-up.

Importing this package imports no ML framework: ``register_policy_loss``, ``PolicyLoss`` and
``Aggregation`` (how a loss reduces its tokens, handed to policy losses and terms), which compute with
torch, are loaded from ``agentgym.training.engine`` when first asked for.

Example:
    >>> from agentgym.training.api import TurnTable, episode_advantages, register_algorithm
    >>> from agentgym.training.api import register_policy_loss  # loads the update engine (torch)
    >>> register_policy_loss.__module__
    'agentgym.training.engine.losses'
"""

from __future__ import annotations

from typing import Any

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
    NormMode,
    TurnTable,
    discounted_returns,
    episode_advantages,
    group_mean_std,
    last_turns,
    normalize,
)

_FROM_ENGINE = {"register_policy_loss": "losses", "PolicyLoss": "losses", "Aggregation": "aggregation"}

__all__ = [
    "AdvantageEstimator", "Aggregation", "Algorithm", "AlgorithmNeeds", "ForwardOutputs", "HookOption",
    "LossTerm",
    "NormMode", "Phase", "PluginSet", "PolicyLoss", "RunContext", "TurnTable", "UpdatePlan",
    "discounted_returns", "episode_advantages", "get_algorithm", "get_hook_option", "get_loss_term",
    "group_mean_std", "last_turns", "list_algorithms", "list_hook_options", "list_loss_terms", "normalize",
    "register_algorithm", "register_hook_option", "register_loss_term", "register_policy_loss",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_ENGINE:  # torch is imported only by who registers a policy loss
        import importlib

        return getattr(importlib.import_module(f"agentgym.training.engine.{_FROM_ENGINE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
