"""Shared prompt prefixes, computed once per group of rows: ``prefix_order``, ``prefix_segments``,
``shared_prefix_logprobs``.

The G episodes of a task start from the same prompt, and an episode's later turns repeat its history, so
the rows of an update share long prefixes. The plain pass (``sequence_logprobs``) runs every row whole and
so repeats the shared part's forward and backward pass once per row. Here the rows, sorted so that rows
with a common prefix are neighbours, are cut into segments; a segment's common prefix runs once, with a
key/value cache that every row of the segment then continues with its own suffix. Gradients from all the
suffixes flow back into the prefix's one pass, so log-probs, entropies and gradients equal the plain
pass's up to float rounding (tests/training/engine/test_prefix_sharing.py checks both on random batches).

A segment's prefix stops at least one token before its earliest response, so every response token's
log-prob comes from a suffix pass, where the plain pass's logic (response positions only, chunked
log-softmax) applies unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentgym.backends.decode_steps import new_kv_cache
from agentgym.backends.prefill import cache_shared_prefix, prefix_inputs
from agentgym.backends.transformers_backend import cache_argument_name
from agentgym.training.engine.packing import (
    TokenBatch,
    _model_device,
    _response_head,
    row_logprobs,
    sequence_logprobs,
)

#: A segment's fixed cost in the plan, in tokens: a pass of its own (two with a prefix) has overheads
#: that a few tokens fewer do not pay for, so rows join a segment only where that saves more than this.
SEGMENT_OVERHEAD_TOKENS = 64


@dataclass(frozen=True)
class Segment:
    """Consecutive rows of a batch (in ``prefix_order``) that share their first ``prefix_len`` tokens."""

    rows: list[int]
    """The rows, as indices into the batch."""
    prefix_len: int
    """Tokens computed once for all the rows; 0: the rows run whole (``sequence_logprobs``)."""


def prefix_order(batch: TokenBatch) -> torch.Tensor:
    """A permutation of the rows that puts rows with common prefixes next to each other (sorted by
    their real tokens), for ``TokenBatch.select`` before cutting micro-batches.

    Example:
        >>> from agentgym.rollout.records import Turn
        >>> from agentgym.training.engine.packing import pack_turns
        >>> turns = [Turn([5, 6], [1], [-0.1], 0.0, "a"), Turn([2, 3], [1], [-0.1], 0.0, "b"),
        ...          Turn([5, 6, 7], [1], [-0.1], 0.0, "c")]
        >>> prefix_order(pack_turns(turns, [0.0] * 3, pad_token_id=0)).tolist()
        [1, 0, 2]
    """
    lengths = batch.attention_mask.sum(-1).tolist()
    ids = batch.input_ids.tolist()
    keys = [ids[i][: int(lengths[i])] for i in range(batch.num_rows)]
    return torch.tensor(sorted(range(batch.num_rows), key=keys.__getitem__), dtype=torch.long)


def prefix_segments(batch: TokenBatch, *, overhead_tokens: int = SEGMENT_OVERHEAD_TOKENS) -> list[Segment]:
    """Cut the rows, in their order, into segments that minimise the tokens computed.

    A segment of rows ``i..j`` with common prefix ``p`` (the shortest common prefix of neighbouring rows,
    kept at least one token short of every row's first response token) costs ``p + n × longest suffix``
    (padded) plus ``overhead_tokens``; the plain pass costs ``n × longest row``. The cut is the cheapest
    (dynamic programming over the cut points); sort the rows with ``prefix_order`` first.

    Example:
        >>> from agentgym.rollout.records import Turn
        >>> from agentgym.training.engine.packing import pack_turns
        >>> shared = list(range(10, 90))  # an 80-token prompt that three rows share
        >>> turns = [Turn(shared + [1], [2], [-0.1], 0.0, "a"), Turn(shared + [3], [4], [-0.1], 0.0, "b"),
        ...          Turn(shared + [6], [7], [-0.1], 0.0, "c"), Turn([9, 9], [8], [-0.1], 0.0, "d")]
        >>> [(s.rows, s.prefix_len) for s in prefix_segments(pack_turns(turns, [0.0] * 4, pad_token_id=0))]
        [([0, 1, 2], 80), ([3], 0)]
    """
    n = batch.num_rows
    mask = batch.attention_mask.bool()
    lengths = mask.sum(-1)
    has_response = batch.response_mask.bool()
    first_response = torch.where(has_response.any(-1), has_response.float().argmax(-1), lengths).tolist()
    same = (batch.input_ids[:-1] == batch.input_ids[1:]) & mask[:-1] & mask[1:]
    common = same.long().cumprod(-1).sum(-1).tolist()  # common prefix of row k and row k + 1
    lengths = lengths.tolist()
    best = [0.0] + [float("inf")] * n
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (segment start, prefix length) ending at each j
    for end in range(1, n + 1):
        shared = 1 << 62
        longest = 0
        for start in range(end - 1, -1, -1):
            longest = max(longest, lengths[start])
            prefix = 0
            if start < end - 1:
                shared = min(shared, common[start], first_response[start] - 1,
                             first_response[start + 1] - 1)
                prefix = max(shared, 0)
            # Every row is longer than the prefix, so the longest suffix is the longest row's.
            cost = best[start] + overhead_tokens + prefix + (end - start) * (longest - prefix)
            if cost < best[end]:
                best[end], cut[end] = cost, (start, prefix)
    segments: list[Segment] = []
    end = n
    while end > 0:
        start, prefix = cut[end]
        segments.append(Segment(list(range(start, end)), prefix))
        end = start
    return segments[::-1]


def shared_prefix_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    all_positions: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` of ``batch`` with each segment's common prefix computed once.

    Same alignment and, at every response position, the same values up to float rounding, with gradients
    (with autograd on) that reach the prefix from every row. ``all_positions`` applies to the suffixes:
    the positions inside a segment's prefix hold 0, as no response token sits there. The rows keep their
    order in the result; sort them with ``prefix_order`` first for the segments to be long. The model must
    take a key/value cache (any ``transformers`` causal LM).
    """
    device = _model_device(model)
    rows, seq = batch.input_ids.shape
    logprobs = torch.zeros((rows, seq), dtype=torch.float32, device=device)
    entropy = torch.zeros((rows, seq), dtype=torch.float32, device=device) if return_entropy else None
    for segment in prefix_segments(batch):
        part = batch.select(segment.rows).trim().to(device)
        width = part.seq_len
        index = torch.tensor(segment.rows, dtype=torch.long, device=device)
        if segment.prefix_len == 0:
            got, got_entropy = sequence_logprobs(model, part, temperature=temperature,
                                                 return_entropy=return_entropy, all_positions=all_positions)
        else:
            got, got_entropy = _continue_prefix(model, part, segment.prefix_len, temperature=temperature,
                                                return_entropy=return_entropy, all_positions=all_positions)
        logprobs = logprobs.index_put((index[:, None], torch.arange(width, device=device)[None]),
                                      got.float())
        if entropy is not None and got_entropy is not None:
            entropy = entropy.index_put((index[:, None], torch.arange(width, device=device)[None]),
                                        got_entropy.float())
    return logprobs, entropy


def _continue_prefix(model: torch.nn.Module, part: TokenBatch, prefix_len: int, *, temperature: float,
                     return_entropy: bool, all_positions: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The segment's log-probs: one pass over the common prefix, then every row's suffix continuing its
    cache. Positions before the suffix's second token hold 0 (no response token sits there)."""
    prefix_ids = part.input_ids[:1, :prefix_len]
    if not all_positions:
        _response_head(model, {**prefix_inputs(prefix_ids), "use_cache": False})  # the once-per-model check
    cache = new_kv_cache(model)
    cache_shared_prefix(model, cache, cache_argument_name(model), prefix_ids, part.num_rows)
    suffix_mask = part.attention_mask[:, prefix_len:]
    position_ids = (prefix_len + suffix_mask.long().cumsum(-1) - 1).clamp(min=prefix_len)
    got, got_entropy = row_logprobs(
        model, part.input_ids[:, prefix_len:], part.attention_mask, position_ids,
        part.response_mask[:, prefix_len:], temperature=temperature, return_entropy=return_entropy,
        chunk_rows=None, all_positions=all_positions, past_key_values=cache)
    pad = torch.nn.functional.pad
    return pad(got, (prefix_len, 0)), (None if got_entropy is None else pad(got_entropy, (prefix_len, 0)))
