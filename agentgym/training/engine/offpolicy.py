"""Importance correction for samples the trainer's policy did not draw itself.

Two gaps separate the sampler's distribution from the one the trainer differentiates: a different
engine (vLLM's kernels and precision give log-probs that differ from the trainer's recomputation of
the same weights), and staleness (asynchronous rollouts drawn with weights one update old). Both are
corrected the same way, with truncated importance sampling (TIS, as verl does it): the trainer
recomputes the "old" log-probs itself (the proximal policy of the PPO ratio), and each response
token's policy loss is weighted by ``w = min(exp(old - behaviour), cap)``, with ``behaviour`` the
sampler's log-probs. ``w`` carries no gradient; it only affects the policy term (KL and entropy
terms are unchanged). The weighting is applied by scaling the token advantages, which scales
PPO-clip's and GSPO's per-token losses by exactly ``w`` (both are linear in the advantage).
"""

from __future__ import annotations

import dataclasses

import torch

from agentgym.training.engine.packing import TokenBatch

#: Cap of the importance weight of stale (asynchronous) batches when ``loss.tis_cap`` is not set
#: (verl's default).
DEFAULT_CAP = 2.0


def importance_weights(behaviour: torch.Tensor, old: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """``min(exp(old - behaviour), cap)`` at the response positions, 1 elsewhere.

    Example:
        >>> w = importance_weights(torch.log(torch.tensor([[0.5, 0.5, 0.1]])),
        ...                        torch.log(torch.tensor([[0.5, 0.25, 0.9]])),
        ...                        torch.tensor([[1.0, 1.0, 1.0]]), cap=2.0)
        >>> [round(x, 4) for x in w[0].tolist()]
        [1.0, 0.5, 2.0]
    """
    keep = mask.bool()
    log_ratio = torch.where(keep, old.float() - behaviour.float(), torch.zeros((), dtype=torch.float32))
    return torch.exp(log_ratio.clamp(max=20.0)).clamp(max=cap)


def importance_corrected(batch: TokenBatch, old: torch.Tensor, cap: float,
                         metrics: dict[str, list[float]]) -> TokenBatch:
    """``batch`` with its advantages weighted by ``importance_weights`` of its sampler log-probs (the
    packed ``old_logprobs``) against the trainer's ``old``; appends ``offpolicy/*`` metrics."""
    mask = batch.response_mask.bool()
    weights = importance_weights(batch.old_logprobs, old, mask, cap)
    count = max(int(mask.sum()), 1)
    metrics.setdefault("offpolicy/is_weight_mean", []).append(float(weights[mask].sum()) / count)
    metrics.setdefault("offpolicy/is_capped_frac", []).append(float((weights[mask] >= cap).sum()) / count)
    gap = (old - batch.old_logprobs.float()).abs()
    metrics.setdefault("offpolicy/logprob_gap", []).append(float(gap[mask].sum()) / count)
    return dataclasses.replace(batch, advantages=batch.advantages * weights)
