"""A decoding batch's first step, the prefill: the prompts' forward pass, with what rows share computed once.

A group's episodes start from one prompt, and the turns of a batch often begin with the same system
prompt and instructions (with ``prompt_mode: current`` most of a maze turn's prompt is that). ``prefill``
runs each distinct prompt once and copies its cache rows to the rows that repeat it, and runs the leading
tokens every prompt shares once, continuing them with each row's own suffix, so the cost is the distinct
tokens. The key/value cache and last logits equal those of the plain left-padded pass up to float rounding
(``tests/backends/test_transformers_backend.py`` checks generations against it).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Prompts that all start with at least this many common tokens prefill them once; fewer are not worth
#: the extra pass.
MIN_SHARED_PREFIX = 16


def pack_left(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into one batch, so every row ends at the last column.

    Args:
        sequences: Token-id lists (of any lengths).
        pad_id: Id written into the padding (masked out, so its value does not matter).
        device: Where to put the tensors.

    Returns:
        ``(input_ids, attention_mask)``, both ``(batch, max_len)`` int64; the mask is 1 on real tokens.

    Example:
        >>> ids, mask = pack_left([[5, 6, 7], [8]], pad_id=0)
        >>> ids.tolist(), mask.tolist()
        ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    width = max((len(seq) for seq in sequences), default=0)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            input_ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            attention_mask[row, width - len(seq) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``(batch, seq)`` that count real tokens only: each row's first real token is 0.

    Padding gets position 0 too; the attention mask hides it, so the value is irrelevant.

    Example:
        >>> positions_from_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])).tolist()
        [[0, 0, 0, 1], [0, 1, 2, 3]]
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def distinct_rows(prompts: Sequence[Sequence[int]]) -> tuple[list[int] | None, list[int] | None]:
    """``(first row of each distinct prompt, for every row the position of its prompt among them)``, or
    ``(None, None)`` when no prompt repeats.

    Example:
        >>> distinct_rows([[1, 2], [3], [1, 2], [1, 2]])
        ([0, 1], [0, 1, 0, 0])
        >>> distinct_rows([[1], [2]])
        (None, None)
    """
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    copies = []
    for row, prompt in enumerate(prompts):
        key = tuple(prompt)
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        copies.append(seen[key])
    if len(first) == len(prompts):
        return None, None
    return first, copies


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every prompt shares, kept one short of the shortest prompt (each row needs a
    token of its own to predict from).

    Example:
        >>> shared_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]])
        2
        >>> shared_prefix_length([[1, 2], [1, 2]]), shared_prefix_length([[7, 8, 9]])
        (1, 2)
    """
    if not prompts:
        return 0
    common = len(os.path.commonprefix([list(p) for p in prompts]))
    return max(0, min(common, min(len(p) for p in prompts) - 1))


def prefix_inputs(prefix_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """A one-row prefix's model inputs: ``input_ids`` ``(1, length)``, an all-ones mask, positions from 0."""
    return {"input_ids": prefix_ids, "attention_mask": torch.ones_like(prefix_ids),
            "position_ids": torch.arange(prefix_ids.shape[-1], device=prefix_ids.device)[None]}


def cache_shared_prefix(call: Callable[..., Any], cache: Any, cache_name: str, prefix_ids: torch.Tensor,
                        rows: int) -> None:
    """Run a prefix that ``rows`` rows share once into ``cache`` and repeat its keys and values, one copy
    per row, for each row's own suffix to continue (a ``transformers`` ``Cache``).

    Args:
        call: Runs the model on keyword inputs (the model itself, or a wrapper that keeps some logits).
        cache: An empty cache; filled in place.
        cache_name: The model's keyword for the cache.
        prefix_ids: The shared tokens, ``(1, length)``.
        rows: How many rows continue it.
    """
    call(**prefix_inputs(prefix_ids), use_cache=True, **{cache_name: cache})
    cache.batch_repeat_interleave(rows)


def prefill(
    forward: Callable[..., tuple[Any, torch.Tensor]],
    cache: Any,
    cache_name: str,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
    *,
    min_shared_prefix: int = MIN_SHARED_PREFIX,
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``prompts`` through the model, filling ``cache`` for the decoding steps that follow.

    Args:
        forward: ``forward(keep_last, **inputs) -> (model output, last keep_last logits)``.
        cache: An empty key/value cache; reshaping it (repeated prompts, a shared prefix) needs a
            ``transformers`` ``Cache``, other caches get the plain pass.
        cache_name: The model's keyword for the cache.
        prompts: Token-id lists, one per row.
        pad_id: Id written into padding.
        device: Where the model is.
        min_shared_prefix: Fewest common leading tokens worth a pass of their own.

    Returns:
        ``(cache, logits, attention_mask, next_positions)``: the filled cache, each row's next-token
        logits ``(rows, vocab)``, the mask over the cache's positions ``(rows, width)`` (a shared prefix,
        then the left-padded rest) and each row's next position id ``(rows, 1)`` (its prompt length).
    """
    reshapable = hasattr(cache, "batch_select_indices") and hasattr(cache, "batch_repeat_interleave")
    distinct, copies = distinct_rows(prompts) if reshapable else (None, None)
    run = [prompts[row] for row in distinct] if distinct is not None else list(prompts)
    shared = shared_prefix_length(run) if reshapable and len(run) > 1 else 0
    if shared < min_shared_prefix:
        shared = 0
    if shared:
        prefix = torch.tensor([list(run[0][:shared])], dtype=torch.long, device=device)
        cache_shared_prefix(functools.partial(forward, 1), cache, cache_name, prefix, len(run))
    suffix_ids, suffix_mask = pack_left([p[shared:] for p in run], pad_id, device)
    # Padding sits between the shared prefix and a shorter row's suffix; the mask hides it and the
    # positions count real tokens only, so every token keeps its position in its own prompt.
    attention_mask = torch.cat([torch.ones((len(run), shared), dtype=torch.long, device=device), suffix_mask],
                               dim=-1)
    out, logits = forward(1, input_ids=suffix_ids, attention_mask=attention_mask,
                          position_ids=positions_from_mask(attention_mask)[:, shared:], use_cache=True,
                          **{cache_name: cache})
    cache = getattr(out, cache_name)
    logits = logits[:, -1, :]
    if copies is not None:  # back to one row per prompt
        expand = torch.tensor(copies, device=device)
        cache.batch_select_indices(expand)
        logits = logits.index_select(0, expand)
        attention_mask = attention_mask.index_select(0, expand)
    return cache, logits, attention_mask, attention_mask.sum(-1, keepdim=True)
