"""``TokenBatch``: a batch's turns as token rows, what the update hands to policy losses and loss terms.

One row per turn: the turn's prompt followed by its response, right-padded
(``agentgym.training.engine.packing.pack_turns`` builds it). Position ``j`` of every log-prob tensor holds
the log-prob of ``input_ids[:, j]`` given ``input_ids[:, :j]``; ``response_mask`` is 1 exactly at the
generated response tokens, the only positions a loss term reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agentgym.errors import ConfigError


@dataclass(frozen=True, eq=False)  # tensors have no single truth value, so no field-wise ==
class TokenBatch:
    """Turns packed as right-padded token rows, one row per turn (see the module docstring for alignment).

    Example:
        >>> from agentgym.rollout.records import Turn
        >>> from agentgym.training.engine.packing import pack_turns
        >>> batch = pack_turns([Turn([1, 2], [3], [-0.5], 0.0, "s")], [2.0], pad_token_id=0)
        >>> batch.num_rows, batch.seq_len, batch.response_mask.tolist(), batch.advantages.tolist()
        (1, 3, [[0.0, 0.0, 1.0]], [[0.0, 0.0, 2.0]])
    """

    input_ids: torch.Tensor
    """int64 ``(rows, seq)``: prompt then response ids, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """int64 ``(rows, seq)``: 1 on real tokens (prompt and response), 0 on padding."""
    response_mask: torch.Tensor
    """float32 ``(rows, seq)``: 1 exactly on generated response tokens, 0 on prompt, env and template
    tokens and on padding. Every loss term (policy, KL, entropy) is masked by it."""
    advantages: torch.Tensor
    """float32 ``(rows, seq)``: the row's per-turn advantage on its response tokens, 0 elsewhere."""
    old_logprobs: torch.Tensor
    """float32 ``(rows, seq)``: sampler log-probs at the response positions, 0 elsewhere. A trainer
    that recomputes them with the current weights (verl's "old") swaps them in with ``replace``."""
    turn_index: torch.Tensor
    """int64 ``(rows,)``: index of the row's turn in the sequence given to ``pack_turns`` (for a batch
    of groups: order group → trajectory → turn, the order of the advantages)."""
    turn_step: torch.Tensor | None = None
    """int64 ``(rows,)`` or None: each row's turn position in its trajectory (0-based), for loss terms
    that depend on it (``pack_turns(..., turn_step=table.step)``); None when packed without it."""

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ConfigError(f"TokenBatch.input_ids must be (rows, seq), got shape {shape}")
        for name in ("attention_mask", "response_mask", "advantages", "old_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ConfigError(f"TokenBatch.{name} has shape {tuple(value.shape)}, expected {shape}")
        for name in ("turn_index", "turn_step"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape[:1]:
                raise ConfigError(f"TokenBatch.{name} has shape {tuple(value.shape)}, expected ({shape[0]},)")

    @property
    def num_rows(self) -> int:
        """Number of rows (turns)."""
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """Padded row length in tokens."""
        return int(self.input_ids.shape[1])

    @property
    def num_response_tokens(self) -> int:
        """Number of response tokens over all rows (the ``token-mean`` normaliser)."""
        return int(self.response_mask.sum().item())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TokenBatch:
        changes = {
            f.name: (None if getattr(self, f.name) is None else fn(getattr(self, f.name)))
            for f in dataclasses.fields(self)
        }
        return TokenBatch(**changes)

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def select(self, indices: Sequence[int] | torch.Tensor) -> TokenBatch:
        """The rows ``indices`` (in that order), keeping the padded width.

        Example:
            >>> from agentgym.rollout.records import Turn
            >>> from agentgym.training.engine.packing import pack_turns
            >>> turns = [Turn([1], [2], [-0.1], 0.0, "a"), Turn([3, 4], [5, 6], [-0.2, -0.3], 0.0, "b")]
            >>> pack_turns(turns, [1.0, -1.0], pad_token_id=0).select([1]).turn_index.tolist()
            [1]
        """
        index = torch.as_tensor(indices, dtype=torch.long, device=self.input_ids.device).reshape(-1)
        return self._map(lambda t: t.index_select(0, index))

    def trim(self) -> TokenBatch:
        """Drop trailing columns that are padding in every row (e.g. after ``select``)."""
        real = self.attention_mask.bool().any(0).nonzero()
        width = int(real.max().item()) + 1 if real.numel() else 0
        if width == self.seq_len:
            return self
        return self._map(lambda t: t if t.dim() == 1 else t[:, :width])
