"""The shared token-level loss pieces: ``aggregate`` and the built-in policy losses (PPO-clip, GSPO, CISPO,
DPPO), registered here under the names the torch-free registry (``agentgym.training.api.loss_registry``)
declares; ``kl_penalty`` and the registry's functions are re-exported from the algorithm API.

Every function takes ``(rows, seq)`` tensors aligned as in ``agentgym.training.engine.packing`` and a
``response_mask`` of the same shape; only positions where the mask is 1 (generated response tokens)
enter any term. Values at masked-out positions, even ``inf`` or ``nan``, change neither a loss nor
its gradients: inputs are replaced by 0 there (``torch.where``) before any arithmetic.

Policy losses are plain callables registered by name (verl's ``core_algos`` pattern) with one
signature, ``fn(logprobs, old_logprobs, advantages, mask, cfg, agg) -> (loss, metrics)``; built-ins are
``"ppo_clip"``, ``"gspo"``, ``"cispo"`` and ``"dppo"``. ``cfg`` is the run's
``agentgym.training.config.schema.LossConfig`` and ``agg`` the
``agentgym.training.api.aggregation.Aggregation`` that reduces per-token losses to the minibatch's loss
(the run's ``loss.loss_agg_mode``, its norm length resolved for the minibatch). The KL and entropy terms
added to the policy loss are loss terms (``agentgym.training.api.terms``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentgym.training.api.aggregation import Aggregation, check_same_shape, kl_penalty, masked
from agentgym.training.api.loss_registry import (  # torch-free, so a config check needs no torch
    POLICY_LOSSES,
    PolicyLoss,
    get_policy_loss,
    list_policy_losses,
    register_policy_loss,
)
from agentgym.training.config.schema import AGG_MODES  # the modes ``aggregate`` takes

__all__ = ["AGG_MODES", "POLICY_LOSSES", "PolicyLoss", "aggregate", "cispo_policy_loss", "dppo_policy_loss",
           "entropy_bonus", "get_policy_loss", "gspo_policy_loss", "kl_penalty", "list_policy_losses",
           "policy_loss", "register_policy_loss"]

if TYPE_CHECKING:
    from agentgym.training.config.schema import AggMode, LossConfig

#: GSPO: the log of the sequence ratio is capped here (verl's guard), so exp() stays finite.
MAX_SEQUENCE_LOG_RATIO = 10.0
#: Token log-ratios are clamped to +-this before exp() (verl's guard against float32 overflow).
MAX_TOKEN_LOG_RATIO = 20.0


# --- aggregation ------------------------------------------------------------------------------------


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    *,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values ``(rows, seq)`` over the masked tokens to a scalar, once:
    ``Aggregation(mode, norm_tokens).reduce(values, mask)`` (the modes are described there).

    A policy loss or loss term inside an update reduces with the ``Aggregation`` it is given instead
    (``agg``, ``ForwardOutputs.agg``): its L is the whole minibatch's, where ``norm_tokens=None`` here
    means the padded width of ``values``.

    Args:
        values: ``(rows, seq)`` per-token values.
        mask: ``(rows, seq)``; non-zero entries are the tokens that count.
        mode: One of ``AGG_MODES``.
        norm_tokens: L of ``seq-mean-token-sum-norm``; None uses ``seq`` (the padded width).

    Returns:
        A 0-dim float32 tensor (differentiable w.r.t. ``values``).

    Raises:
        ConfigError: An unknown mode, mismatched shapes or a non-positive ``norm_tokens``.

    Example:
        >>> values = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
        >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
        >>> [round(aggregate(values, mask, m).item(), 4) for m in AGG_MODES]
        [2.3333, 2.75, 3.5, 2.3333]
    """
    return Aggregation(mode, norm_tokens).reduce(values, mask)


# --- policy loss -----------------------------------------------------------------------------------


# override=True: the registry declares the built-ins by name until this module is imported.
@register_policy_loss("ppo_clip", override=True)
def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    agg: Aggregation | None = None,
    *,
    sequence_ratio: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip with asymmetric and dual clip (and GSPO's sequence ratio when ``sequence_ratio``).

    Per token, with ρ = exp(logπ − logπ_old) and A the advantage:
    ℓ = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)); when A < 0 and dual clip is on,
    ℓ = min(ℓ, −A·c) (verl's dual clip). The token log-ratio is clamped to ±20 first. With
    ``sequence_ratio`` (GSPO, §1.5 of the algorithms reference) ρ is replaced by the token form of
    the sequence ratio s_{i,t} = sg[s_i]·π_t/sg[π_t], s_i = exp(mean over the row's tokens of the
    log-ratio) with log s_i capped at 10: its value is s_i at every token of row i, and with a
    constant advantage per row and ``seq-mean-token-mean`` its gradient equals that of the
    sequence-level objective. The per-token losses are reduced by ``agg``.

    Args:
        logprobs: ``(rows, seq)`` current log-probs (with grad).
        old_logprobs: ``(rows, seq)`` behaviour log-probs.
        advantages: ``(rows, seq)`` per-token advantages.
        mask: ``(rows, seq)`` response mask.
        cfg: Loss settings (clip ranges, dual clip).
        agg: The aggregation of the per-token losses; None: ``cfg``'s (``Aggregation.from_config``), with
            L the padded width of ``mask`` under ``seq-mean-token-sum-norm`` when ``cfg`` sets none.
        sequence_ratio: use GSPO's sequence ratio; the ``gspo`` policy loss (``loss.loss_mode=gspo``) sets it,
            so GSPO has one spelling in configs.

    Returns:
        ``(loss, metrics)``; metrics are python floats over the masked tokens: ``loss/policy``,
        ``loss/clipfrac`` (fraction where the clipped term was the larger one, i.e. clipping
        changed the loss), ``loss/dual_clip_frac`` (fraction where dual clip was active),
        ``loss/approx_kl`` (mean of logπ_old − logπ) and ``loss/ratio_mean`` (mean ratio used).

    Raises:
        ConfigError: Mismatched shapes.

    Example:
        >>> from agentgym.training.config.schema import LossConfig
        >>> old = torch.zeros(1, 3)
        >>> new = torch.log(torch.tensor([[1.0, 1.5, 0.5]]))
        >>> loss, metrics = policy_loss(new, old, torch.ones(1, 3), torch.tensor([[0, 1, 1]]), LossConfig())
        >>> round(loss.item(), 4), metrics["loss/clipfrac"]   # ratios 1.5 -> 1.2 (clipped), 0.5
        (-0.85, 0.5)
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    keep = mask.bool()
    logprobs = masked(logprobs, keep)
    old_logprobs = masked(old_logprobs, keep)
    advantages = masked(advantages, keep)

    token_log_ratio = logprobs - old_logprobs  # 0 outside the mask
    if sequence_ratio:
        row_tokens = keep.sum(-1, keepdim=True).clamp(min=1)
        sequence_log_ratio = token_log_ratio.sum(-1, keepdim=True) / row_tokens
        log_ratio = sequence_log_ratio.detach() + logprobs - logprobs.detach()
        log_ratio = log_ratio.clamp(max=MAX_SEQUENCE_LOG_RATIO)
        log_ratio = torch.where(keep, log_ratio, torch.zeros_like(log_ratio))
    else:
        log_ratio = token_log_ratio.clamp(-MAX_TOKEN_LOG_RATIO, MAX_TOKEN_LOG_RATIO)
    ratio = torch.exp(log_ratio)

    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    per_token = clip_loss
    if cfg.dual_clip_c is not None:
        dual_bound = -advantages * cfg.dual_clip_c
        per_token = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    if agg is None:
        agg = Aggregation.from_config(cfg)
    loss = agg.reduce(per_token, keep)

    with torch.no_grad():
        count = keep.sum().clamp(min=1)
        clip_active = (clipped > unclipped) & keep
        if cfg.dual_clip_c is not None:
            dual_active = (advantages < 0) & (clip_loss > dual_bound) & keep
        else:
            dual_active = torch.zeros_like(keep)
        stats = torch.stack(
            [
                loss.detach(),
                clip_active.sum() / count,
                -token_log_ratio.sum() / count,
                masked(ratio, keep).sum() / count,
                dual_active.sum() / count,
            ]
        ).tolist()
    names = ("loss/policy", "loss/clipfrac", "loss/approx_kl", "loss/ratio_mean", "loss/dual_clip_frac")
    return loss, dict(zip(names, stats, strict=True))


@register_policy_loss("gspo", override=True)
def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    agg: Aggregation | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (``loss.loss_mode=gspo``): ``policy_loss`` with the sequence ratio.

    GSPO's paper pairs it with ``loss_agg_mode="seq-mean-token-mean"``, clip ranges 3e-4/4e-4 and
    no KL; verl's GSPO has no dual clip (set ``dual_clip_c=None`` to match it exactly).
    """
    return policy_loss(logprobs, old_logprobs, advantages, mask, cfg, agg, sequence_ratio=True)


def _ratio_metrics(loss: torch.Tensor, keep: torch.Tensor, token_log_ratio: torch.Tensor,
                   ratio: torch.Tensor, clipped: torch.Tensor) -> dict[str, float]:
    """``policy_loss``'s metrics for a loss without dual clip: ``loss/clipfrac`` is the fraction of the
    masked tokens in ``clipped`` (what clipping means is the loss's own)."""
    with torch.no_grad():
        count = keep.sum().clamp(min=1)
        stats = torch.stack([loss.detach(), (clipped & keep).sum() / count, -token_log_ratio.sum() / count,
                             masked(ratio, keep).sum() / count]).tolist()
    names = ("loss/policy", "loss/clipfrac", "loss/approx_kl", "loss/ratio_mean")
    return {**dict(zip(names, stats, strict=True)), "loss/dual_clip_frac": 0.0}


@register_policy_loss("cispo", override=True)
def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    agg: Aggregation | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (``loss.loss_mode=cispo``): REINFORCE weighted by a clipped, detached importance weight.

    MiniMax-M1 (arXiv 2506.13585, Eq. 4-5): per token, with r = exp(logπ − logπ_old) (log-ratio clamped
    to ±20 first) and A the advantage,
    ŵ = clip(r, 1−ε_low, 1+ε_high) and ℓ = −sg(ŵ)·A·logπ, so ∂ℓ/∂logπ = −ŵ·A. Unlike PPO-clip no token is
    dropped: where PPO's clipped term wins its gradient is 0, here it is the clipped weight times the
    policy gradient; only the weight is bounded. The paper sets ε_low large (no lower bound) and tunes
    ε_high: ``cfg.cispo_clip_low`` (None: no lower bound) and ``cfg.cispo_clip_high`` (0.28); PPO's
    ``clip_ratio_*`` and ``dual_clip_c`` are not used. The paper normalises by the batch's tokens
    (``token-mean``); any ``agg`` reduces the per-token losses. At r = 1 the gradient is REINFORCE's,
    −A·∇logπ, which is also PPO-clip's there; the loss value, −A·logπ, is not PPO's −A·r.

    Args:
        logprobs: ``(rows, seq)`` current log-probs (with grad).
        old_logprobs: ``(rows, seq)`` log-probs the data was sampled (or recomputed) with.
        advantages: ``(rows, seq)`` per-token advantages.
        mask: ``(rows, seq)`` response mask.
        cfg: Loss settings (``cispo_clip_low``, ``cispo_clip_high``, the aggregation).
        agg: The aggregation of the per-token losses; None: ``cfg``'s (``Aggregation.from_config``).

    Returns:
        ``(loss, metrics)`` with ``policy_loss``'s keys, over the masked tokens: ``loss/clipfrac`` is the
        fraction whose weight was clipped (their gradient is scaled, not dropped), ``loss/ratio_mean`` the
        mean unclipped r, ``loss/dual_clip_frac`` always 0 (no dual clip).

    Raises:
        ConfigError: Mismatched shapes.

    Example:
        >>> from agentgym.training.config.schema import LossConfig
        >>> new = torch.log(torch.tensor([[0.5, 0.6, 0.1]])).requires_grad_(True)
        >>> old = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))   # r = 1, 2 (weight 1.28), 0.5
        >>> loss, metrics = cispo_policy_loss(new, old, torch.ones(1, 3), torch.ones(1, 3), LossConfig())
        >>> loss.backward(); [round(g, 4) for g in new.grad[0].tolist()], metrics["loss/clipfrac"]
        ([-0.3333, -0.4267, -0.1667], 0.3333333432674408)
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    keep = mask.bool()
    logprobs = masked(logprobs, keep)
    old_logprobs = masked(old_logprobs, keep)
    advantages = masked(advantages, keep)

    token_log_ratio = logprobs - old_logprobs  # 0 outside the mask
    ratio = torch.exp(token_log_ratio.clamp(-MAX_TOKEN_LOG_RATIO, MAX_TOKEN_LOG_RATIO)).detach()
    low = 0.0 if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
    high = 1.0 + cfg.cispo_clip_high
    weight = ratio.clamp(low, high)  # detached: the IS weight scales the gradient, is not optimised
    per_token = -weight * advantages * logprobs
    if agg is None:
        agg = Aggregation.from_config(cfg)
    loss = agg.reduce(per_token, keep)
    return loss, _ratio_metrics(loss, keep, token_log_ratio, ratio, (ratio < low) | (ratio > high))


@register_policy_loss("dppo", override=True)
def dppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    agg: Aggregation | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO (``loss.loss_mode=dppo``): the importance-weighted surrogate with a trust region on the change
    in each sampled token's probability instead of on its ratio.

    Divergence PPO, "Rethinking the Trust Region in LLM Reinforcement Learning" (Qi et al., arXiv
    2602.04879), its DPPO-Binary-TV variant: the total variation between π and π_old restricted to the
    two outcomes {sampled token, any other} is |π(a) − π_old(a)|, and a token leaves the trust region
    when that exceeds δ in the direction its advantage pushes. Per token, with r = exp(logπ − logπ_old)
    (log-ratio clamped to ±20) and Δ = π(a) − π_old(a) (probabilities):

        M = 0 if (A > 0 and Δ > δ_high) or (A < 0 and Δ < −δ_low), else 1;
        ℓ = −A·(M·r + (1 − M)·sg(r)),  so ∂ℓ/∂logπ = −M·A·r.

    The gradient is PPO's unclipped surrogate gradient on the tokens inside the region and 0 outside;
    unlike the ratio clip, a rare token may move far in ratio (1e-3 → 1e-2 is r = 10, Δ < 0.01) and a
    likely one may not move far in probability (0.99 → 0.8 is r ≈ 0.81, inside PPO's clip, Δ = −0.19).
    The loss value is −A·r at every token (masked ones included, detached), so at r = 1 it and its
    gradient equal PPO-clip's. δ_low, δ_high are ``cfg.dppo_tv_low``/``dppo_tv_high`` (0.15, the
    authors' Binary-TV recipe); ``clip_ratio_*`` and ``dual_clip_c`` are not used. The authors' code
    (verl ``compute_policy_loss_dppo_tv``, sail-sg/Stable-RL) writes ℓ = −A·sg(min(r, C))·logπ·M, the same
    gradient for r ≤ C; their recipe sets C = 10000, i.e. no truncation, which is what is done here
    (``loss.tis_cap`` bounds sampler/trainer weights separately). The paper anchors the region at the
    rollout policy; here it is at ``old_logprobs``, whatever the update passes.

    Args:
        logprobs: ``(rows, seq)`` current log-probs (with grad).
        old_logprobs: ``(rows, seq)`` log-probs the data was sampled (or recomputed) with.
        advantages: ``(rows, seq)`` per-token advantages.
        mask: ``(rows, seq)`` response mask.
        cfg: Loss settings (``dppo_tv_low``, ``dppo_tv_high``, the aggregation).
        agg: The aggregation of the per-token losses; None: ``cfg``'s (``Aggregation.from_config``).

    Returns:
        ``(loss, metrics)`` with ``policy_loss``'s keys, over the masked tokens: ``loss/clipfrac`` is the
        fraction outside the trust region (M = 0: no gradient), ``loss/ratio_mean`` the mean r,
        ``loss/dual_clip_frac`` always 0 (no dual clip).

    Raises:
        ConfigError: Mismatched shapes.

    Example:
        >>> from agentgym.training.config.schema import LossConfig
        >>> new = torch.log(torch.tensor([[0.01, 0.75, 0.8]])).requires_grad_(True)
        >>> old = torch.log(torch.tensor([[0.001, 0.5, 0.99]]))   # Δ = 0.009, 0.25 (> 0.15), -0.19
        >>> loss, metrics = dppo_policy_loss(new, old, torch.ones(1, 3), torch.ones(1, 3), LossConfig())
        >>> loss.backward(); [round(g, 4) for g in new.grad[0].tolist()]   # -r/3 inside, 0 outside
        [-3.3333, 0.0, -0.2694]
    """
    check_same_shape(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    keep = mask.bool()
    logprobs = masked(logprobs, keep)
    old_logprobs = masked(old_logprobs, keep)
    advantages = masked(advantages, keep)

    token_log_ratio = logprobs - old_logprobs  # 0 outside the mask
    ratio = torch.exp(token_log_ratio.clamp(-MAX_TOKEN_LOG_RATIO, MAX_TOKEN_LOG_RATIO))
    with torch.no_grad():
        change = torch.exp(logprobs) - torch.exp(old_logprobs)  # Δ = π − π_old, in probability
        outside = ((advantages > 0) & (change > cfg.dppo_tv_high)) | (
            (advantages < 0) & (change < -cfg.dppo_tv_low))
        outside &= keep
    per_token = -advantages * torch.where(outside, ratio.detach(), ratio)
    if agg is None:
        agg = Aggregation.from_config(cfg)
    loss = agg.reduce(per_token, keep)
    return loss, _ratio_metrics(loss, keep, token_log_ratio, ratio, outside)


# --- KL and entropy ---------------------------------------------------------------------------------


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    *,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """The aggregated entropy of the response tokens (a scalar to *maximise*; the ``entropy`` term).

    Example:
        >>> entropy_bonus(torch.tensor([[9.0, 1.0, 3.0]]), torch.tensor([[0, 1, 1]])).item()
        2.0
    """
    return aggregate(entropy, mask, mode, norm_tokens=norm_tokens)
