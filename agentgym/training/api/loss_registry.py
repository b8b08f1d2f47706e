"""The policy losses ``loss.loss_mode`` names, torch-free: ``PolicyLoss`` (the contract),
``register_policy_loss``, ``get_policy_loss``, ``list_policy_losses`` and ``POLICY_LOSSES``.

Checking a config's ``loss.loss_mode`` must not import torch, so the built-in names (``ppo_clip``,
``gspo``, ``cispo``, ``dppo``) are declared here and their functions are registered by the update engine
(``agentgym.training.engine.losses``) when it is imported, which the update does before it asks for one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentgym.errors import RegistryError
from agentgym.plugins import PluginRegistry

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


_LossT = TypeVar("_LossT", bound=Callable[..., Any])

#: Policy losses by name (values of ``loss.loss_mode``).
POLICY_LOSSES: PluginRegistry[Any] = PluginRegistry("policy loss", "agentgym.trainers", "agentgym.trainers")
for _name in ("ppo_clip", "gspo", "cispo", "dppo"):
    POLICY_LOSSES.register(_name, BuiltinPolicyLoss(_name))


def register_policy_loss(name: str, *, override: bool = False) -> Callable[[_LossT], _LossT]:
    """Decorator registering a ``PolicyLoss`` under ``name`` (a value of ``loss.loss_mode``).

    Raises:
        RegistryError: ``name`` is empty, or taken by another function and ``override`` is False.

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
