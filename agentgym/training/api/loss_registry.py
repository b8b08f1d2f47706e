"""The policy losses ``loss.loss_mode`` names, torch-free: ``PolicyLoss`` (the contract),
``register_policy_loss``, ``get_policy_loss``, ``list_policy_losses``, ``POLICY_LOSSES``, and the settings
types of the built-ins that have settings (``CispoSettings``, ``DppoSettings``).

A policy loss with settings of its own declares them as a dataclass (``register_policy_loss(name,
settings=...)``): its fields are keys of the config's ``loss`` section, named after the loss
(``loss.cispo_clip_high``), checked by the dataclass and read by the loss as ``cfg.<field>``.

Checking a config's ``loss.loss_mode`` must not import torch, so the built-in names (``ppo_clip``,
``gspo``, ``cispo``, ``dppo``) are declared here and their functions are registered by the update engine
(``agentgym.training.engine.losses``) when it is imported, which the update does before it asks for one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentgym.errors import ConfigError, RegistryError
from agentgym.plugins import PluginRegistry
from agentgym.training.config.plugin_settings import register_plugin_settings

if TYPE_CHECKING:
    import torch

    from agentgym.training.api.aggregation import Aggregation
    from agentgym.training.config.schema import LossConfig


class PolicyLoss(Protocol):
    """Contract of a registered policy loss.

    Args:
        logprobs: ``(rows, seq)`` log-probs under the policy being trained (with grad).
        old_logprobs: ``(rows, seq)`` log-probs the data was sampled (or recomputed) with.
        advantages: ``(rows, seq)`` per-token advantages (a turn's advantage on its response tokens).
        mask: ``(rows, seq)`` response mask; nothing outside it may affect the loss or its gradients.
        cfg: The ``LossConfig`` (clip ranges...).
        agg: How per-token losses become the loss: ``agg.reduce(per_token, mask)`` (``total_loss`` passes
            the minibatch's, by keyword).

    Returns:
        ``(loss, metrics)``: a 0-dim tensor to minimise and python floats keyed ``loss/<name>``,
        at least ``loss/policy``.
    """

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        cfg: LossConfig,
        agg: Aggregation,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class BuiltinPolicyLoss:
    """A built-in policy loss whose function the update engine has not registered yet (torch not loaded)."""

    name: str
    """Its ``loss.loss_mode`` value."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RegistryError(f"the built-in policy loss {self.name!r} is defined by the update engine: import "
                            f"agentgym.training.engine.losses (which imports torch) before calling it")


@dataclass(frozen=True)
class CispoSettings:
    """The settings of the ``cispo`` policy loss (keys of ``loss``).

    Example:
        >>> CispoSettings(cispo_clip_high=-1.0)
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: CispoSettings.cispo_clip_high must be >= 0, got -1.0
    """

    cispo_clip_low: float | None = None
    """CISPO ε_low (``loss.loss_mode=cispo``): the detached IS weight is clipped below at
    ``1 - cispo_clip_low``; None: no lower bound, as in MiniMax-M1, which set ε_low large and tuned only
    ε_high."""
    cispo_clip_high: float = 0.28
    """CISPO ε_high: the IS weight is clipped above at ``1 + cispo_clip_high`` (0.28: DAPO's clip-higher
    and Trinity-RFT's CISPO default). It bounds how much one stale token can weigh, never drops one; raise
    it for more off-policy batches."""

    def __post_init__(self) -> None:
        if self.cispo_clip_low is not None and not 0.0 <= self.cispo_clip_low <= 1.0:
            raise ConfigError(f"CispoSettings.cispo_clip_low must be in [0, 1] (or None for no lower bound), "
                              f"got {self.cispo_clip_low}")
        if not 0.0 <= self.cispo_clip_high < math.inf:
            raise ConfigError(f"CispoSettings.cispo_clip_high must be >= 0, got {self.cispo_clip_high}")


@dataclass(frozen=True)
class DppoSettings:
    """The settings of the ``dppo`` policy loss (keys of ``loss``)."""

    dppo_tv_low: float = 0.15
    """DPPO δ_low (``loss.loss_mode=dppo``), in probability: a token with A < 0 whose probability fell by
    more than this since the old policy (π − π_old < −δ_low) gets no gradient. 0.15: the DPPO-Binary-TV
    recipe (Qi et al. 2026)."""
    dppo_tv_high: float = 0.15
    """DPPO δ_high, in probability: a token with A > 0 whose probability rose by more than this
    (π − π_old > δ_high) gets no gradient."""

    def __post_init__(self) -> None:
        for name in ("dppo_tv_low", "dppo_tv_high"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"DppoSettings.{name} must be in [0, 1] (a change in probability), "
                                  f"got {getattr(self, name)}")


_LossT = TypeVar("_LossT", bound=Callable[..., Any])

#: Policy losses by name (values of ``loss.loss_mode``).
POLICY_LOSSES: PluginRegistry[Any] = PluginRegistry("policy loss", "agentgym.trainers", "agentgym.trainers")


def register_policy_loss(name: str, *, override: bool = False, settings: type | None = None
                         ) -> Callable[[_LossT], _LossT]:
    """Decorator registering a ``PolicyLoss`` under ``name`` (a value of ``loss.loss_mode``).

    Args:
        name: the loss's name.
        override: replace a loss registered under ``name``.
        settings: the loss's own settings, a dataclass whose fields become keys of the config's ``loss``
            section (name them after the loss: ``cispo_clip_high``); the loss reads them as ``cfg.<field>``.

    Raises:
        RegistryError: ``name`` is empty, taken by another function and ``override`` is False, or a settings
            field is a key of ``loss`` already.

    Example:
        >>> @register_policy_loss("doc_reinforce")
        ... def reinforce(logprobs, old_logprobs, advantages, mask, cfg, agg):
        ...     loss = agg.reduce(-advantages * logprobs, mask)
        ...     return loss, {"loss/policy": loss.item()}
        >>> get_policy_loss("doc_reinforce") is reinforce
        True
        >>> POLICY_LOSSES.unregister("doc_reinforce")
    """
    if not isinstance(name, str) or not name:
        raise RegistryError(f"a policy loss name must be a non-empty string, got {name!r}")
    if settings is not None:
        register_plugin_settings("loss", settings, owner=f"policy loss {name!r}")

    def decorator(fn: _LossT) -> _LossT:
        POLICY_LOSSES.register(name, fn, override=override)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered under ``name`` (a built-in's function once the update engine is loaded).

    Raises:
        RegistryError: Unknown name; the message suggests close names and lists the registered ones.

    Example:
        >>> get_policy_loss("ppo-clip")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.RegistryError: no policy loss named 'ppo-clip'. Did you mean 'ppo_clip'...
    """
    return POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    """Registered policy-loss names, sorted."""
    return POLICY_LOSSES.names()


for _name in ("ppo_clip", "gspo"):
    POLICY_LOSSES.register(_name, BuiltinPolicyLoss(_name))
# Declared with their settings types; the update engine registers their functions (override=True).
register_policy_loss("cispo", settings=CispoSettings)(BuiltinPolicyLoss("cispo"))
register_policy_loss("dppo", settings=DppoSettings)(BuiltinPolicyLoss("dppo"))
