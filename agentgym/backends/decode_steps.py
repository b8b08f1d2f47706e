"""The model side of a decoding batch: the prefill, then one forward pass per generated token.

``TransformersPolicy._decode`` samples, records and stops rows; a ``DecodeSteps`` object owns the key/value
cache and the shapes of the forward passes, behind one seam:

- ``DynamicSteps`` (``model.decode: dynamic``, the default): a ``DynamicCache`` that grows by one column a
  step; the prefill runs what rows share once (``agentgym.backends.prefill``) and rows that finish leave
  the batch and the cache. The fastest engine on a CPU, where the arithmetic dominates.
- ``StaticSteps`` (``model.decode: static`` or ``compiled``): a ``StaticCache`` allocated once for the whole
  generation and every step the same shape (rows and cache length rounded up to buckets, finished rows
  kept and fed masked padding). Fixed shapes are what let ``compiled`` run each step through
  ``torch.compile`` — with CUDA graphs on a GPU (``mode="reduce-overhead"``), where launching a step's few
  hundred small kernels, not the arithmetic, is the cost of decoding a small model.

Both give the same tokens and log-probs up to float rounding (``tests/backends/test_decode_steps.py``).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentgym.backends.config import DECODE_MODES, DecodeMode
from agentgym.backends.prefill import pack_left, positions_from_mask, prefill

__all__ = ["DECODE_MODES", "DecodeMode", "DecodeSteps", "DynamicSteps", "StaticSteps"]

#: Static shapes are rounded up to these steps, so a run's varying batch sizes and prompt lengths reuse a
#: few caches (and compiled graphs) instead of making one per shape.
CACHE_LENGTH_BUCKET = 64
#: At most this many static caches are kept for reuse (each holds keys and values for rows × length).
KEPT_STATIC_CACHES = 2

Forward = Callable[..., tuple[Any, torch.Tensor]]
"""``forward(keep_last, **inputs) -> (model output, last keep_last logits as float32)``."""


def select_cache_rows(cache: Any, rows: torch.Tensor) -> Any | None:
    """Keep only the batch ``rows`` of a KV cache; None when the cache type cannot do it.

    Handles ``transformers`` ``Cache`` objects (``batch_select_indices``) and the legacy
    tuple-of-(key, value) format.
    """
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(rows)
        return cache
    if isinstance(cache, tuple) and all(isinstance(layer, tuple) for layer in cache):
        return tuple(tuple(t.index_select(0, rows) for t in layer) for layer in cache)
    return None


def new_kv_cache(model: torch.nn.Module) -> Any:
    """An empty ``DynamicCache`` laid out for ``model`` (per-layer types from its config where supported).

    Passing a ``Cache`` object, rather than None or the legacy tuples, is what every transformers
    release since 4.36 expects; it is filled in place by each forward pass.
    """
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=model.config)
    return DynamicCache()


def bucket_rows(rows: int) -> int:
    """The batch size a static step runs at: the next power of two.

    Example:
        >>> [bucket_rows(n) for n in (1, 2, 3, 5, 8, 33)]
        [1, 2, 4, 8, 8, 64]
    """
    return 1 << max(0, rows - 1).bit_length()


def bucket_length(length: int) -> int:
    """The cache length a static batch allocates: ``length`` rounded up to ``CACHE_LENGTH_BUCKET``.

    Example:
        >>> bucket_length(1), bucket_length(64), bucket_length(65)
        (64, 64, 128)
    """
    return -(-length // CACHE_LENGTH_BUCKET) * CACHE_LENGTH_BUCKET


class DecodeSteps(ABC):
    """One batch's forward passes. ``logits`` holds each row's next-token logits ``(rows, vocab)`` after the
    prefill and after every ``step``; rows are the prompts in order until ``drop`` removes some (the next
    ``step`` returns the kept rows' logits)."""

    logits: torch.Tensor

    @abstractmethod
    def step(self, ids: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Feed one id per row (``ids``, ``(rows,)``; rows where ``live`` is False are finished and their
        id is ignored) and return the next logits ``(rows, vocab)``."""

    @abstractmethod
    def drop(self, keep: torch.Tensor) -> bool:
        """Keep only the rows ``keep`` (indices, in order) from now on; False when this engine keeps every
        row, and the caller feeds finished rows masked padding instead."""


class DynamicSteps(DecodeSteps):
    """A growing ``DynamicCache``; shared prompts and prefixes prefilled once; finished rows leave."""

    def __init__(self, forward: Forward, model: torch.nn.Module, cache_name: str,
                 prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device, *,
                 min_shared_prefix: int) -> None:
        self._forward = forward
        self._cache_name = cache_name
        self._cache, self.logits, self._attention_mask, self._next_positions = prefill(
            forward, new_kv_cache(model), cache_name, prompts, pad_id, device,
            min_shared_prefix=min_shared_prefix)

    def step(self, ids: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        self._attention_mask = torch.cat([self._attention_mask, live.long().unsqueeze(-1)], dim=-1)
        out, logits = self._forward(1, input_ids=ids.unsqueeze(-1), attention_mask=self._attention_mask,
                                    position_ids=self._next_positions, use_cache=True,
                                    **{self._cache_name: self._cache})
        self._cache = getattr(out, self._cache_name)
        self._next_positions = self._next_positions + 1
        self.logits = logits[:, -1, :]
        return self.logits

    def drop(self, keep: torch.Tensor) -> bool:
        shrunk = select_cache_rows(self._cache, keep)
        if shrunk is None:
            return False
        self._cache = shrunk
        self._attention_mask = self._attention_mask.index_select(0, keep)
        self._next_positions = self._next_positions.index_select(0, keep)
        return True


class StaticCaches:
    """The ``StaticCache``s a policy reuses across batches, keyed by (rows, length); the least recently used
    goes when more than ``KEPT_STATIC_CACHES`` would be kept. Reusing one keeps its tensors at the addresses
    a captured CUDA graph reads."""

    def __init__(self) -> None:
        self._caches: OrderedDict[tuple[int, int, torch.device], Any] = OrderedDict()

    def get(self, model: torch.nn.Module, rows: int, length: int, device: torch.device) -> Any:
        from transformers import StaticCache

        key = (rows, length, device)
        cache = self._caches.pop(key, None)
        if cache is None:
            cache = StaticCache(config=model.config, max_cache_len=length)
        else:
            cache.reset()
        self._caches[key] = cache
        while len(self._caches) > KEPT_STATIC_CACHES:
            self._caches.popitem(last=False)
        return cache


class StaticSteps(DecodeSteps):
    """A ``StaticCache`` sized once, every step the same shape; ``step_forward`` may be a compiled forward.

    The batch is padded to ``bucket_rows(len(prompts))`` rows (the extra rows hold one padding token and
    are never read) and the cache to ``bucket_length(prompt width + max_new_tokens)`` columns. The attention
    mask is allocated at that full length, zeros ahead of the current step, so its shape never changes.
    """

    def __init__(self, forward: Forward, step_forward: Forward, model: torch.nn.Module, cache_name: str,
                 caches: StaticCaches, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int,
                 device: torch.device) -> None:
        self._rows = len(prompts)
        rows = bucket_rows(self._rows)
        # Filler rows: one (masked-in) padding token each, so no row attends to nothing.
        input_ids, prompt_mask = pack_left(list(prompts) + [[pad_id]] * (rows - self._rows), pad_id, device)
        self._width = input_ids.shape[-1]
        length = bucket_length(self._width + max_new_tokens)
        self._cache = caches.get(model, rows, length, device)
        self._cache_name = cache_name
        self._step_forward = step_forward
        self._attention_mask = torch.zeros((rows, length), dtype=torch.long, device=device)
        self._attention_mask[:, : self._width] = prompt_mask
        self._next_positions = prompt_mask.sum(-1, keepdim=True)
        self._ids = torch.full((rows, 1), pad_id, dtype=torch.long, device=device)
        self._step = 0
        _, logits = forward(1, input_ids=input_ids, attention_mask=self._attention_mask,
                            position_ids=positions_from_mask(prompt_mask), use_cache=True,
                            cache_position=torch.arange(self._width, device=device),
                            **{cache_name: self._cache})
        self.logits = logits[: self._rows, -1, :]

    def step(self, ids: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        column = self._width + self._step
        self._ids[: self._rows, 0] = ids
        self._attention_mask[: self._rows, column] = live.long()
        self._attention_mask[self._rows :, column] = 1
        _, logits = self._step_forward(
            1, input_ids=self._ids, attention_mask=self._attention_mask, position_ids=self._next_positions,
            use_cache=True, cache_position=torch.tensor([column], device=self._ids.device),
            **{self._cache_name: self._cache})
        self._step += 1
        self._next_positions = self._next_positions + 1
        self.logits = logits[: self._rows, -1, :]
        return self.logits

    def drop(self, keep: torch.Tensor) -> bool:
        return False
