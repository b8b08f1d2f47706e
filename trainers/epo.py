"""EPO entropy smoothing (loss term ``epo``; Xu et al. 2025, "EPO: Entropy-regularized Policy
Optimization for LLM Agents", arXiv 2509.22576), usable with any algorithm.

Multi-turn agents suffer an exploration–exploitation cascade: entropy that swings at one turn
index derails the turns after it. EPO keeps, per turn index k, the running mean H̄_k of the policy's
entropy over all past iterations, and penalises a turn whose entropy leaves the band
[κ_lo·H̄_k, κ_hi·H̄_k], with a weight that decays over training (the phase weighting). EPO's plain
entropy bonus across all turns is the built-in ``entropy`` term (``loss.entropy_coef``).

The reference adds a piecewise-constant penalty (a fixed p_out per out-of-band token), which has no
gradient, so as released only the entropy bonus moves the policy. Here the penalty is a hinge on the
distance outside the band, max(0, H − κ_hi·H̄_k) + max(0, κ_lo·H̄_k − H), so it pulls entropy back
into the band (the paper's intent). The reference also applies the penalty only to micro-batches
that contain a turn from the second half of the episode budget, which makes the loss depend on how
rows fall into minibatches; that gate is left out.

The history H̄ is state: saved in checkpoints, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from agentgym.errors import ConfigError
from agentgym.training.api import ForwardOutputs, LossTerm, RunContext, register_loss_term

if TYPE_CHECKING:
    import torch

    from agentgym.training.config.schema import LossConfig
    from agentgym.training.engine.packing import TokenBatch


@dataclass(frozen=True)
class EPOArgs:
    """Arguments of the ``epo`` loss term."""

    coef: float = 0.1
    """Weight of the band penalty in the loss (before the phase weight)."""
    band_low: float = 0.8
    """κ_lo: entropy below κ_lo·H̄_k is penalised (the reference code's 0.8; its README runs use 0)."""
    band_high: float = 1.2
    """κ_hi: entropy above κ_hi·H̄_k is penalised (the reference code's 1.2; its README runs use 2.0)."""
    level: Literal["turn", "token"] = "turn"
    """``turn``: a turn's mean entropy over its response tokens is compared with the band (mean over
    turns); ``token``: every response token's entropy is (reduced with the run's aggregation,
    ``loss.loss_agg_mode``)."""
    phase_weighting: bool = True
    """Scale the penalty by the phase weight w(p) of training progress p (see ``phase_weight``)."""
    schedule_iterations: int | None = None
    """Iterations over which the phase weight runs its course; None: the run's ``iterations``."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.band_low <= self.band_high:
            raise ConfigError(f"EPOArgs.band_low must be in [0, band_high], got {self.band_low} "
                              f"(band_high {self.band_high})")
        if not math.isfinite(self.coef) or self.coef < 0:
            raise ConfigError(f"EPOArgs.coef must be >= 0, got {self.coef}")
        if self.schedule_iterations is not None and (isinstance(self.schedule_iterations, bool)
                                                     or self.schedule_iterations < 1):
            raise ConfigError("EPOArgs.schedule_iterations must be an integer >= 1, "
                              f"got {self.schedule_iterations!r}")


def phase_weight(progress: float) -> float:
    """EPO's phase weight at training progress ``progress`` ∈ [0, 1] (clamped).

    First half (x = 2p): 1 − 0.2·(1 − e^{−2x}), from 1 down to 0.83; second half (x = 2p − 1):
    0.8·e^{−3x}, from 0.8 down to 0.04 — strong smoothing early, when entropy is most volatile, and
    little once the policy has settled (the schedule of the reference code, in its 150-epoch runs).

    Example:
        >>> [round(phase_weight(p), 4) for p in (0.0, 0.25, 0.5, 1.0)]
        [1.0, 0.8736, 0.8, 0.0398]
    """
    p = min(max(progress, 0.0), 1.0)
    if p < 0.5:
        return 1.0 - 0.2 * (1.0 - math.exp(-2.0 * (2.0 * p)))
    return 0.8 * math.exp(-3.0 * (2.0 * p - 1.0))


class EPOTerm(LossTerm):
    """Band penalty around the running per-turn-index entropy history (see the module docstring).

    Example (turn index 0 has history H̄_0 = 1.0; a turn at entropy 1.5 is 0.3 above κ_hi·H̄_0 = 1.2):
        >>> import torch
        >>> from agentgym.rollout.records import Turn
        >>> from agentgym.training.config.schema import LossConfig
        >>> from agentgym.training.engine.packing import pack_turns
        >>> term = EPOTerm(EPOArgs(coef=1.0, phase_weighting=False))
        >>> term.load_state_dict({"sums": [1.0], "counts": [1], "iterations": 1})
        >>> batch = pack_turns([Turn([1], [2, 3], [0.0, 0.0], 0.0, "s")], [1.0], pad_token_id=0,
        ...                    turn_step=[0])
        >>> value, metrics = term(batch, ForwardOutputs(torch.zeros(1, 3), entropy=torch.full((1, 3), 1.5)),
        ...                       LossConfig())
        >>> round(value.item(), 4), metrics["epo/out_of_band_frac"]
        (0.3, 1.0)
    """

    needs_entropy = True

    def __init__(self, args: EPOArgs) -> None:
        self.args = args
        self.sums = np.zeros(0)  # Σ over past iterations of each turn index's mean entropy
        self.counts = np.zeros(0, dtype=np.int64)  # iterations in which each turn index occurred
        self.iterations = 0
        self.run_iterations: int | None = None  # from begin_run
        self._pending_sum = np.zeros(0)  # this iteration's entropy statistic per turn index
        self._pending_count = np.zeros(0)

    def history(self) -> np.ndarray:
        """H̄_k per turn index k (NaN where index k has not occurred yet)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)

    def weight(self) -> float:
        """The phase weight of the current iteration (1 when phase weighting is off)."""
        if not self.args.phase_weighting:
            return 1.0
        schedule = self.args.schedule_iterations or self.run_iterations
        if schedule is None:
            raise ConfigError("the epo term's phase weight needs its schedule: set "
                              "loss.terms.epo.schedule_iterations (a run sets it to its iterations)")
        return phase_weight(self.iterations / schedule)

    def begin_run(self, context: RunContext) -> None:
        self.run_iterations = context.iterations

    def __call__(self, batch: TokenBatch, outputs: ForwardOutputs, cfg: LossConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        # torch is imported where the term computes, so registering it (and checking a config) needs none.
        import torch

        from agentgym.training.engine.aggregation import Aggregation

        if outputs.entropy is None:
            raise ConfigError("the epo term got no entropies; it sets needs_entropy, so the trainer must "
                              "pass them")
        if batch.turn_step is None:
            raise ConfigError("the epo term needs each row's turn position: pack with "
                              "pack_turns(..., turn_step=...)")
        mask = batch.response_mask.to(outputs.entropy.device).bool()
        entropy = torch.where(mask, outputs.entropy.float(), torch.zeros((), device=mask.device))
        steps = batch.turn_step.cpu().numpy().astype(np.int64)
        history = self.history()
        known = np.full(steps.shape, np.nan)
        inside = steps < history.shape[0]
        known[inside] = history[steps[inside]]
        has_target = torch.as_tensor(~np.isnan(known), device=mask.device)
        target = torch.as_tensor(np.nan_to_num(known), dtype=torch.float32, device=mask.device)
        low, high = self.args.band_low * target, self.args.band_high * target
        tokens = mask.sum(-1)
        if self.args.level == "turn":
            statistic = entropy.sum(-1) / tokens.clamp(min=1)  # (rows,) each turn's mean entropy
            outside = torch.relu(statistic - high) + torch.relu(low - statistic)
            rows = tokens > 0
            outside = torch.where(has_target & rows, outside, torch.zeros_like(outside))
            penalty = outside.sum() / rows.sum().clamp(min=1)
            out_of_band = ((outside > 0).sum() / rows.sum().clamp(min=1)).item()
            self._record(steps[rows.cpu().numpy()], statistic.detach()[rows].cpu().numpy(), None)
        else:
            outside = torch.relu(entropy - high[:, None]) + torch.relu(low[:, None] - entropy)
            outside = torch.where(mask & has_target[:, None], outside, torch.zeros_like(outside))
            agg = outputs.agg or Aggregation.from_config(cfg)  # None: called on its own, not by total_loss
            penalty = agg.reduce(outside, mask)
            out_of_band = ((outside > 0).sum() / mask.sum().clamp(min=1)).item()
            self._record(steps, entropy.detach().sum(-1).cpu().numpy(), tokens.cpu().numpy())
        weight = self.weight()
        metrics = {"loss/epo": penalty.item(), "epo/out_of_band_frac": out_of_band, "epo/weight": weight}
        return self.args.coef * weight * penalty, metrics

    def _record(self, steps: np.ndarray, values: np.ndarray, counts: np.ndarray | None) -> None:
        """Accumulate this iteration's entropy statistic per turn index (per turn, or per token)."""
        size = int(steps.max()) + 1 if steps.size else 0
        if size > self._pending_sum.shape[0]:
            self._pending_sum = np.pad(self._pending_sum, (0, size - self._pending_sum.shape[0]))
            self._pending_count = np.pad(self._pending_count, (0, size - self._pending_count.shape[0]))
        n = self._pending_sum.shape[0]
        self._pending_sum += np.bincount(steps, weights=values.astype(np.float64), minlength=n)
        weights = np.ones(steps.shape) if counts is None else counts.astype(np.float64)
        self._pending_count += np.bincount(steps, weights=weights, minlength=n)

    def end_iteration(self) -> dict[str, float]:
        """Fold this iteration's per-turn-index mean entropy into the history."""
        seen = self._pending_count > 0
        size = self._pending_sum.shape[0]
        if size > self.sums.shape[0]:
            self.sums = np.pad(self.sums, (0, size - self.sums.shape[0]))
            self.counts = np.pad(self.counts, (0, size - self.counts.shape[0]))
        means = np.where(seen, self._pending_sum / np.maximum(self._pending_count, 1), 0.0)
        self.sums[:size] += means
        self.counts[:size] += seen
        self.iterations += 1
        self._pending_sum, self._pending_count = np.zeros(0), np.zeros(0)
        metrics = {"epo/history_turns": float((self.counts > 0).sum())}
        if seen.any():
            metrics["epo/entropy"] = float(means[seen].mean())
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums.tolist(), "counts": self.counts.tolist(), "iterations": self.iterations}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums = np.asarray(state.get("sums", []), dtype=np.float64)
        self.counts = np.asarray(state.get("counts", []), dtype=np.int64)
        self.iterations = int(state.get("iterations", 0))


register_loss_term("epo", EPOTerm, EPOArgs,
                   description="EPO: hinge band around the running per-turn-index entropy, phase-weighted")
