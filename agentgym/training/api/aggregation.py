"""How a minibatch's per-token values become one loss: ``Aggregation`` (the modes of ``loss.loss_agg_mode``).

One object knows everything about a mode, so the policy loss, the loss terms and the update's
micro-batching cannot disagree about it:

- ``reduce(values, mask)``: the scalar of per-token values over the masked (response) tokens;
- ``units(mask)``: what ``reduce`` divides by, counted over a micro-batch, and so ``weight(part, whole)``:
  a micro-batch's share of the minibatch's units, its loss weight. Weighted micro-batch losses summed
  over micro-batches and processes are the loss of the minibatch in one piece;
- ``additive``: the divisor is a constant (``seq-mean-token-sum-norm``), so micro-batch losses simply
  add up (weight 1 each), and ``metric_share(part, whole)``: how a micro-batch's metrics count towards
  the minibatch's;
- ``for_minibatch(mask)``: the aggregation with its norm length L fixed to the minibatch's padded width
  when the config leaves L None, so every micro-batch (each trimmed to its own width) divides by the
  minibatch's L.

``PolicyUpdate`` builds one from the run's ``LossConfig`` (``Aggregation.from_config``), asks it for each
minibatch's (``for_minibatch``) and hands that to the policy loss and the loss terms as
``ForwardOutputs.agg``; the config itself is never rewritten.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agentgym.errors import ConfigError
from agentgym.training.config.schema import (  # declared once, beside the config's Literal types
    AGG_MODES,
    KL_TYPES,
)

if TYPE_CHECKING:
    from agentgym.training.config.schema import AggMode, KlType, LossConfig


def check_same_shape(mask: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Raise ``ConfigError`` naming the first of ``tensors`` (None ones skipped) not shaped like ``mask``."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != mask.shape:
            raise ConfigError(f"{name} has shape {tuple(tensor.shape)} but the mask has {tuple(mask.shape)}")


def masked(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``values`` as float32 with 0 wherever ``keep`` is False (no gradient reaches those entries, and
    ``inf`` or ``nan`` there changes nothing: ``torch.where``, not a product)."""
    values = values.float()
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


@dataclass(frozen=True)
class Aggregation:
    """A ``loss.loss_agg_mode`` with its norm length: how per-token values ``(rows, seq)`` become a scalar.

    Modes (ℓ = values, sums over masked tokens only; |o_i| = masked tokens of row i):

    - ``token-mean``: Σ_i Σ_t ℓ / Σ_i |o_i| (every token weighs the same).
    - ``seq-mean-token-mean``: mean over rows of (Σ_t ℓ / |o_i|) (every row weighs the same).
    - ``seq-mean-token-sum``: mean over rows of Σ_t ℓ.
    - ``seq-mean-token-sum-norm``: Σ_i Σ_t ℓ / L with a constant L (Dr.GRPO, §1.2 of the algorithms
      reference), not divided by the number of rows.

    Rows with no masked token are left out of the ``seq-mean-*`` row means, and a batch with no masked
    token at all gives 0.

    Raises:
        ConfigError: An unknown mode or a non-positive ``norm_tokens``.

    Example:
        >>> values = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
        >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
        >>> [round(Aggregation(m).reduce(values, mask).item(), 4) for m in AGG_MODES]
        [2.3333, 2.75, 3.5, 2.3333]
        >>> agg = Aggregation("seq-mean-token-sum-norm").for_minibatch(torch.ones(2, 10))
        >>> agg.norm_tokens, round(agg.reduce(values, mask).item(), 4)   # 7 / 10, not 7 / 3
        (10, 0.7)
    """

    mode: AggMode = "token-mean"
    """One of ``AGG_MODES``."""
    norm_tokens: int | None = None
    """L of ``seq-mean-token-sum-norm``; None: the padded width of what is reduced (``for_minibatch``
    fixes it to the minibatch's)."""

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            close = difflib.get_close_matches(str(self.mode), AGG_MODES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown loss_agg_mode {self.mode!r}{hint}; valid: {list(AGG_MODES)}")
        norm = self.norm_tokens
        if norm is not None and (isinstance(norm, bool) or not isinstance(norm, int) or norm < 1):
            raise ConfigError(f"norm_tokens must be a positive integer or None, got {norm!r}")

    @classmethod
    def from_config(cls, cfg: LossConfig) -> Aggregation:
        """The aggregation ``loss.loss_agg_mode`` and ``loss.loss_agg_norm_tokens`` describe."""
        return cls(cfg.loss_agg_mode, cfg.loss_agg_norm_tokens)

    @property
    def additive(self) -> bool:
        """The divisor is a constant, so losses of the parts of a minibatch add up to its loss."""
        return self.mode == "seq-mean-token-sum-norm"

    def for_minibatch(self, mask: torch.Tensor) -> Aggregation:
        """This aggregation for the minibatch of response mask ``mask`` ``(rows, seq)``: under
        ``seq-mean-token-sum-norm`` with no L set, L becomes the minibatch's padded width ``seq`` (not
        the width of each trimmed micro-batch); otherwise this aggregation itself."""
        if self.additive and self.norm_tokens is None:
            return dataclasses.replace(self, norm_tokens=max(int(mask.shape[-1]), 1))
        return self

    def reduce(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Reduce per-token ``values`` over the tokens where ``mask`` (same shape) is non-zero.

        Returns:
            A 0-dim float32 tensor (differentiable w.r.t. ``values``).

        Raises:
            ConfigError: ``values`` and ``mask`` differ in shape.
        """
        check_same_shape(mask, values=values)
        keep = mask.bool()
        values = masked(values, keep)
        if self.mode == "token-mean":
            return values.sum() / keep.sum().clamp(min=1)
        if self.additive:
            norm = values.shape[-1] if self.norm_tokens is None else self.norm_tokens
            return values.sum() / max(norm, 1)
        row_tokens = keep.sum(-1)
        row_sums = values.sum(-1)
        per_row = row_sums / row_tokens.clamp(min=1) if self.mode == "seq-mean-token-mean" else row_sums
        # Empty rows have per_row == 0, so they only need leaving out of the row count.
        return per_row.sum() / (row_tokens > 0).sum().clamp(min=1)

    def units(self, mask: torch.Tensor) -> float:
        """What ``reduce`` divides by, counted over ``mask``: response tokens for ``token-mean``; rows with
        a response token for ``seq-mean-token-mean``/``seq-mean-token-sum``; 1 for
        ``seq-mean-token-sum-norm`` (a constant divisor).

        Example:
            >>> mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
            >>> [Aggregation(m).units(mask) for m in AGG_MODES]
            [3.0, 2.0, 2.0, 1.0]
        """
        if self.mode == "token-mean":
            return float(mask.sum())
        if self.additive:
            return 1.0
        return float((mask.sum(-1) > 0).sum())

    def weight(self, part: torch.Tensor, whole: torch.Tensor) -> float:
        """The loss weight of a micro-batch (response mask ``part``) of a minibatch (``whole``): its share
        of the minibatch's units (0 when the minibatch has none), or 1 under an additive mode. Its loss
        times this, summed over the minibatch's micro-batches, is the minibatch's loss.

        Example:
            >>> whole = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
            >>> Aggregation("token-mean").weight(whole[:1], whole), Aggregation("seq-mean-token-mean").weight(
            ...     whole[:1], whole), Aggregation("seq-mean-token-sum-norm").weight(whole[:1], whole)
            (0.75, 0.5, 1.0)
        """
        if self.additive:
            return 1.0
        total = self.units(whole)
        return self.units(part) / total if total else 0.0

    def metric_share(self, part: torch.Tensor, whole: torch.Tensor) -> float:
        """How much a micro-batch's metrics count towards the minibatch's: its loss weight (so
        ``loss/policy`` is the minibatch's); under an additive mode, whose weights are all 1, its share of
        the response tokens instead (so fractions such as ``loss/clipfrac`` stay fractions)."""
        if not self.additive:
            return self.weight(part, whole)
        return float(part.sum()) / max(float(whole.sum()), 1.0)


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: KlType = "k3",
    *,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the log-probs of the sampled tokens.

    - ``k1``: logπ − logπ_ref (unbiased, can be negative).
    - ``k2``: ½ (logπ − logπ_ref)².
    - ``k3`` (verl's ``low_var_kl``): with d = logπ_ref − logπ clamped to ±20, e^d − d − 1, then
      clamped to [−10, 10]; always ≥ 0 and 0 where the two agree.

    Args:
        logprobs: ``(rows, seq)`` current log-probs.
        ref_logprobs: ``(rows, seq)`` reference log-probs.
        kind: One of ``KL_TYPES``.
        mask: When given, entries outside it are 0 and get no gradient.

    Returns:
        ``(rows, seq)`` float32; reduce it with an ``Aggregation`` (or ``aggregate``).

    Raises:
        ConfigError: An unknown ``kind`` or mismatched shapes.

    Example:
        >>> lp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, 0.0]])
        >>> [round(x, 4) for x in kl_penalty(lp, ref, "k3")[0].tolist()]   # e^1 - 1 - 1
        [0.0, 0.7183]
    """
    if kind not in KL_TYPES:
        raise ConfigError(f"unknown kl_type {kind!r}; valid: {list(KL_TYPES)}")
    if ref_logprobs.shape != logprobs.shape:
        raise ConfigError(f"ref_logprobs has shape {tuple(ref_logprobs.shape)}, "
                          f"logprobs {tuple(logprobs.shape)}")
    logprobs, ref_logprobs = logprobs.float(), ref_logprobs.float()
    if mask is not None:
        check_same_shape(mask, logprobs=logprobs)
        keep = mask.bool()
        logprobs, ref_logprobs = masked(logprobs, keep), masked(ref_logprobs, keep)
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    # The clamps guard exp() against overflow where the two policies disagree wildly (verl).
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
