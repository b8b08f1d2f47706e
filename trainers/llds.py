"""LLDS likelihood-preserving penalty (loss term ``llds``; "On GRPO Collapse in Search-R1: The Lazy
Likelihood-Displacement Death Spiral", arXiv 2512.04220), usable with any algorithm.

Lazy likelihood displacement: under GRPO the likelihood of responses — correct ones included —
stagnates or falls, which feeds a collapse. LLDS penalises a *fall* in likelihood, only where it
happens and only on the actions responsible: an action (a maximal run of response tokens whose
advantage is ≥ 0; here one turn's response) is gated on when its summed log-prob fell,
Σ_t (logπ_old − logπ_θ) > 0, and then each of its tokens whose log-prob fell pays that fall:

    L_LLDS = λ · Σ_t gate_{c(t)} · max(0, logπ_old(t) − logπ_θ(t)) / Σ_t response_mask_t

(the action-level "A" gate of the reference; the denominator counts every response token of the
minibatch). ``logπ_old`` are the log-probs recomputed before the update phase, so the penalty is 0
on the first minibatch (π_θ = π_old) and acts across minibatches and epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentgym.errors import ConfigError
from agentgym.training.api import ForwardOutputs, LossTerm, register_loss_term

if TYPE_CHECKING:
    import torch

    from agentgym.training.config.schema import LossConfig
    from agentgym.training.engine.packing import TokenBatch


@dataclass(frozen=True)
class LLDSArgs:
    """Arguments of the ``llds`` loss term."""

    coef: float = 0.2
    """λ: weight of the penalty (the reference's ``no_reduce_lambda``)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.coef) or self.coef < 0:
            raise ConfigError(f"LLDSArgs.coef must be >= 0, got {self.coef}")


def displacement_penalty(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The un-weighted LLDS penalty with its action-level gate.

    Args:
        logprobs: ``(rows, seq)`` current log-probs (with grad).
        old_logprobs: ``(rows, seq)`` log-probs before the update.
        advantages: ``(rows, seq)`` per-token advantages.
        mask: ``(rows, seq)`` response mask.

    Returns:
        ``(penalty, gated_actions, actions)``: the 0-dim penalty, and how many actions were gated on
        out of how many were eligible (advantage ≥ 0).

    Example (one action whose log-probs moved by −0.3 and +0.1: its sum fell, so it is gated and the
    token that fell pays 0.3, over 2 response tokens):
        >>> import torch
        >>> old = torch.zeros(1, 3)
        >>> new = torch.tensor([[0.0, -0.3, 0.1]])
        >>> mask = torch.tensor([[0, 1, 1]])
        >>> penalty, gated, actions = displacement_penalty(new, old, torch.ones(1, 3), mask)
        >>> round(penalty.item(), 4), int(gated), int(actions)
        (0.15, 1, 1)
    """
    # torch is imported where the term computes, so registering it (and checking a config) needs none.
    import torch

    keep = mask.bool()
    eligible = keep & (advantages >= 0)
    zero = torch.zeros((), dtype=torch.float32, device=logprobs.device)
    drop = torch.where(eligible, old_logprobs.float() - logprobs.float(), zero)  # Δ_t, > 0 where it fell
    # Each maximal run of eligible tokens in a row is one action: number the runs by where they start.
    before = torch.nn.functional.pad(eligible[:, :-1], (1, 0), value=False)
    starts = eligible & ~before
    action = torch.cumsum(starts.reshape(-1).long(), 0).reshape(eligible.shape) - 1
    num_actions = int(starts.sum())
    if num_actions == 0:
        return (drop * 0.0).sum(), torch.zeros(()), torch.zeros(())
    summed = torch.zeros(num_actions, device=logprobs.device).index_add(0, action[eligible],
                                                                        drop.detach()[eligible])
    gate = summed > 0
    gated_token = eligible & gate[action.clamp(min=0)]
    penalty = torch.where(gated_token, torch.relu(drop), zero).sum() / keep.sum().clamp(min=1)
    return penalty, gate.sum(), torch.tensor(num_actions)


class LLDSTerm(LossTerm):
    """λ · the action-gated likelihood-displacement penalty (see the module docstring)."""

    def __init__(self, args: LLDSArgs) -> None:
        self.args = args

    def __call__(self, batch: TokenBatch, outputs: ForwardOutputs, cfg: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        device = outputs.logprobs.device
        penalty, gated, actions = displacement_penalty(outputs.logprobs, batch.old_logprobs.to(device),
                                                       batch.advantages.to(device),
                                                       batch.response_mask.to(device))
        return self.args.coef * penalty, {"loss/llds": penalty.item(),
                                          "llds/gated_frac": float(gated) / max(float(actions), 1.0)}


register_loss_term("llds", LLDSTerm, LLDSArgs,
                   description="LLDS: penalise falls in the likelihood of non-negative-advantage actions")
