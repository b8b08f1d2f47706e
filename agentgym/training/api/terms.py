"""Loss terms: what is added to the policy loss (``LossTerm``, ``register_loss_term``; built-ins ``kl``,
``entropy``).

A loss term is built once per run from its arguments and called on every minibatch as
``term(batch, outputs, cfg) -> (tensor, metrics)``: the tensor (already weighted by the term's own
coefficient) is added to the policy loss, the metrics are logged. Every term reads only positions
where ``batch.response_mask`` is 1, and reduces per-token values with the run's aggregation,
``outputs.agg.reduce(values, batch.response_mask)`` (so that it splits into micro-batches as the
policy loss does). A term may keep state across iterations (``end_iteration``,
``state_dict``/``load_state_dict``; checkpoints save it, so resume stays exact) and declares what it
needs from the forward pass (entropies, reference log-probs), so the trainer computes those only
when some term asks.

``loss.kl_coef``/``loss.kl_type`` configure the built-in ``kl`` term and ``loss.entropy_coef`` the
``entropy`` term; any other registered term is switched on under ``loss.terms``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from agentgym.errors import ConfigError
from agentgym.plugins import PluginRegistry
from agentgym.training.config.coercion import build

# torch is imported only where a term computes: registering terms and checking their arguments (a
# config check) must work without it.
if TYPE_CHECKING:
    import torch

    from agentgym.training.api.aggregation import Aggregation
    from agentgym.training.api.batch import TokenBatch
    from agentgym.training.config.schema import LossConfig


@dataclass(frozen=True, eq=False)
class ForwardOutputs:
    """What one minibatch's forward pass produced, aligned with the ``TokenBatch`` (``(rows, seq)`` each)."""

    logprobs: torch.Tensor
    """Log-probs of the batch's tokens under the policy being trained (with grad)."""
    entropy: torch.Tensor | None = None
    """Per-position entropies (with grad), when a term needs them."""
    ref_logprobs: torch.Tensor | None = None
    """Log-probs under the frozen reference policy, when a term needs them."""
    agg: Aggregation | None = None
    """How per-token values of this minibatch become a scalar: the run's ``loss.loss_agg_mode`` with its
    norm length resolved for the whole minibatch (``Aggregation.for_minibatch``), also when the batch
    is one micro-batch of it. ``total_loss`` sets it from ``cfg`` when it is None, so a term always
    finds it set."""


@dataclass(frozen=True)
class RunContext:
    """What a loss term may know of the run it is part of (``LossTerm.begin_run``)."""

    iterations: int
    """RL iterations the run has in all (a resumed run that extends ``iterations`` says the new number)."""


class LossTerm:
    """Base class of loss terms: subclass, set the ``needs_*`` flags and implement ``__call__``."""

    needs_entropy: bool = False
    """The forward pass must return entropies (``ForwardOutputs.entropy``)."""
    needs_reference: bool = False
    """The run keeps a frozen reference policy and fills ``ForwardOutputs.ref_logprobs``."""

    def __call__(self, batch: TokenBatch, outputs: ForwardOutputs, cfg: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """The weighted term (a 0-dim tensor added to the loss) and its metrics (``loss/<name>``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def begin_run(self, context: RunContext) -> None:
        """Called once when the run is set up (and again on ``--resume``), before any update."""

    def end_iteration(self) -> dict[str, float]:
        """Called once after each iteration's update; update state across iterations here."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints (default: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Reinstate ``state_dict()``."""


@dataclass(frozen=True)
class TermSpec:
    """A registered loss term: how to build it and its arguments."""

    name: str
    """Registry key, the name under ``loss.terms``."""
    factory: Callable[[Any], LossTerm]
    """Builds the term from its arguments."""
    args_type: type
    """Dataclass of its arguments (a docstring per field)."""
    description: str = ""
    """One line for listings."""

    def build(self, values: Mapping[str, Any] | None = None, where: str | None = None) -> LossTerm:
        """The term built from validated arguments; errors name ``loss.terms.<name>.<field>``."""
        return self.factory(build(self.args_type, dict(values or {}), where or f"loss.terms.{self.name}"))


LOSS_TERMS: PluginRegistry[TermSpec] = PluginRegistry("loss term", "agentgym.trainers", "agentgym.trainers")


def total_loss(policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]],
               terms: Mapping[str, LossTerm], batch: TokenBatch, outputs: ForwardOutputs,
               cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss plus every term's weighted value, all under ``batch.response_mask``.

    The policy loss gets ``outputs.agg`` as its ``agg``, and the terms ``outputs`` with it; when it is
    None, ``Aggregation.from_config(cfg)`` (L, if the mode needs one and ``cfg`` sets none, is then the
    batch's own padded width).

    Returns:
        ``(loss, metrics)``: the policy loss's metrics, each term's, and ``loss/total``.
    """
    if outputs.agg is None:
        from agentgym.training.api.aggregation import Aggregation

        outputs = replace(outputs, agg=Aggregation.from_config(cfg))
    loss, metrics = policy_loss(outputs.logprobs, batch.old_logprobs, batch.advantages, batch.response_mask,
                                cfg, agg=outputs.agg)
    for term in terms.values():
        value, term_metrics = term(batch, outputs, cfg)
        loss = loss + value
        metrics.update(term_metrics)
    metrics["loss/total"] = loss.item()
    return loss, metrics


def register_loss_term(name: str, factory: Callable[[Any], LossTerm], args_type: type, *,
                       description: str = "", override: bool = False) -> TermSpec:
    """Register a loss term under ``name``.

    Raises:
        RegistryError: ``name`` is taken and ``override`` is False.

    Example:
        >>> @dataclass(frozen=True)
        ... class L2Args:
        ...     coef: float = 0.01
        >>> class L2(LossTerm):
        ...     def __init__(self, args):
        ...         self.coef = args.coef
        ...     def __call__(self, batch, outputs, cfg):
        ...         value = outputs.agg.reduce(outputs.logprobs.square(), batch.response_mask)
        ...         return self.coef * value, {"loss/l2": value.item()}
        >>> spec = register_loss_term("doc_l2", L2, L2Args)
        >>> get_loss_term("doc_l2").build({"coef": 0.5}).coef
        0.5
        >>> LOSS_TERMS.unregister("doc_l2")
    """
    return LOSS_TERMS.register(name, TermSpec(name, factory, args_type, description), override=override)


def get_loss_term(name: str) -> TermSpec:
    """The registered term ``name``; unknown names raise with suggestions."""
    return LOSS_TERMS.get(name)


def list_loss_terms() -> list[str]:
    """Registered term names, sorted."""
    return LOSS_TERMS.names()


# --- built-ins -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KLArgs:
    """Arguments of the ``kl`` term (set through ``loss.kl_coef`` and ``loss.kl_type``)."""

    coef: float = 0.0
    """β: weight of the KL to the reference policy."""
    kl_type: Literal["k1", "k2", "k3"] = "k3"
    """Estimator: ``k1``, ``k2`` or ``k3`` (see ``agentgym.training.api.aggregation.kl_penalty``)."""


class KLTerm(LossTerm):
    """β·agg(KL(π ‖ π_ref)) over the response tokens, with the run's aggregation (``outputs.agg``).

    Example:
        >>> from agentgym.training.config.schema import LossConfig
        >>> import torch
        >>> from agentgym.rollout.records import Turn
        >>> from agentgym.training.engine.packing import pack_turns
        >>> batch = pack_turns([Turn([1], [2, 3], [0.0, 0.0], 0.0, "s")], [1.0], pad_token_id=0)
        >>> lp = torch.zeros(1, 3)
        >>> value, metrics = KLTerm(KLArgs(coef=0.5, kl_type="k1"))(
        ...     batch, ForwardOutputs(lp, ref_logprobs=lp - 1.0), LossConfig())
        >>> value.item(), metrics
        (0.5, {'loss/kl': 1.0})
    """

    needs_reference = True

    def __init__(self, args: KLArgs) -> None:
        self.args = args

    def __call__(self, batch: TokenBatch, outputs: ForwardOutputs, cfg: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        from agentgym.training.api.aggregation import Aggregation, kl_penalty

        if outputs.ref_logprobs is None:
            raise ConfigError("the kl term got no reference log-probs; a term that reads them must set "
                              "needs_reference = True")
        mask = batch.response_mask.to(outputs.logprobs.device)
        agg = outputs.agg or Aggregation.from_config(cfg)  # None: called on its own, not by total_loss
        per_token = kl_penalty(outputs.logprobs, outputs.ref_logprobs, self.args.kl_type, mask=mask)
        kl = agg.reduce(per_token, mask)
        return self.args.coef * kl, {"loss/kl": kl.item()}


@dataclass(frozen=True)
class EntropyArgs:
    """Arguments of the ``entropy`` term (set through ``loss.entropy_coef``)."""

    coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""


class EntropyTerm(LossTerm):
    """−coef·agg(entropy) over the response tokens: a bonus for keeping the policy stochastic."""

    needs_entropy = True

    def __init__(self, args: EntropyArgs) -> None:
        self.args = args

    def __call__(self, batch: TokenBatch, outputs: ForwardOutputs, cfg: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        from agentgym.training.api.aggregation import Aggregation

        if outputs.entropy is None:
            raise ConfigError("the entropy term got no entropies; a term that reads them must set "
                              "needs_entropy = True")
        mask = batch.response_mask.to(outputs.logprobs.device)
        agg = outputs.agg or Aggregation.from_config(cfg)  # None: called on its own, not by total_loss
        bonus = agg.reduce(outputs.entropy, mask)
        return -self.args.coef * bonus, {"loss/entropy": bonus.item()}


register_loss_term("kl", KLTerm, KLArgs,
                   description="KL to the frozen reference policy (loss.kl_coef, loss.kl_type)")
register_loss_term("entropy", EntropyTerm, EntropyArgs, description="entropy bonus (loss.entropy_coef)")
