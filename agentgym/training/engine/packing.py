"""Token batches for the update: ``TokenBatch``, ``pack_turns``, ``minibatches``, ``sequence_logprobs``.

One row per turn: the turn's prompt followed by its response, right-padded. This module is the one
place where per-turn advantages are broadcast onto tokens, and where the token alignment of every
log-prob tensor is fixed.

**Alignment.** Position ``j`` of every log-prob (and entropy) tensor holds the log-prob of
``input_ids[:, j]`` given ``input_ids[:, :j]``; position 0 has no context and holds 0.
``response_mask`` is 1 exactly at the positions of generated response tokens, so a turn with prompt
length ``p`` and response length ``r`` has ``response_mask[row, p : p + r] == 1`` and its sampler
log-probs in ``old_logprobs[row, p : p + r]``. Prompt tokens (chat template, env observations,
earlier turns) and padding are 0 in the mask and never enter a loss term (policy, KL or entropy).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from agentgym.backends.transformers_backend import cache_argument_name
from agentgym.errors import ConfigError
from agentgym.rollout.records import Turn
from agentgym.training.api.batch import TokenBatch

#: Upper bound on the elements of the float32 (rows, seq, vocab) temporaries that
#: ``sequence_logprobs`` creates per chunk of rows (2**26 floats = 256 MiB).
MAX_CHUNK_ELEMENTS = 2**26


def pack_turns(
    turns: Sequence[Turn],
    advantages: Sequence[float] | np.ndarray | torch.Tensor,
    *,
    pad_token_id: int,
    max_length: int | None = None,
    skip_forced: bool = False,
    turn_step: Sequence[int] | np.ndarray | None = None,
) -> TokenBatch:
    """Pack turns into one right-padded row each and broadcast each turn's advantage to its response.

    A row is ``prompt_ids + response_ids``. When it is longer than ``max_length``, the prompt is cut
    from the left (its oldest tokens go) and every response token is kept; at least one prompt token
    stays, because the first response token needs a context to have a log-prob.

    Args:
        turns: The turns, e.g. ``[turn for g in groups for t in g.trajectories for turn in t.turns]``.
        advantages: One advantage per turn, same order (what an ``AdvantageEstimator`` returns).
        pad_token_id: Id written into padding (masked everywhere, so its value does not matter).
        max_length: Longest row in tokens; None keeps every prompt whole.
        skip_forced: Leave out of ``response_mask`` the response positions a decoding constraint
            forced (``turn.extras["forced_positions"]``: the only token allowed there). The sampled
            policy made no choice at them, so they carry no policy-gradient signal; left in, a
            constrained response (mostly forced: a copy runs on by itself) would push the model's
            unconstrained distribution around at every copied character.
        turn_step: One turn position (0-based, in its trajectory) per turn, same order, for loss terms
            that read it (``TurnTable.step`` of the turns); None leaves ``TokenBatch.turn_step`` unset.

    Returns:
        A ``TokenBatch`` on the CPU with ``seq`` = the longest (truncated) row.

    Raises:
        ConfigError: No turns, a length mismatch (advantages or turn steps vs turns, or response ids vs their
            log-probs), an empty prompt, a non-finite advantage or log-prob, a negative id, or a
            response too long for ``max_length``.

    Example:
        >>> turns = [Turn([1, 2, 3], [4, 5], [-0.1, -0.2], 0.0, "a"), Turn([6], [7], [-0.3], 0.0, "b")]
        >>> batch = pack_turns(turns, [1.0, -1.0], pad_token_id=0, max_length=4)
        >>> batch.input_ids.tolist(), batch.response_mask.tolist()
        ([[2, 3, 4, 5], [6, 7, 0, 0]], [[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
        >>> batch.advantages.tolist()
        [[0.0, 0.0, 1.0, 1.0], [0.0, -1.0, 0.0, 0.0]]
    """
    num = len(turns)
    if num == 0:
        raise ConfigError("pack_turns got no turns; skip the update when a batch has none")
    if isinstance(advantages, torch.Tensor):
        adv = advantages.detach().to("cpu", torch.float32).reshape(-1)
    else:
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float64).reshape(-1), dtype=torch.float32)
    if adv.shape[0] != num:
        raise ConfigError(f"pack_turns needs one advantage per turn: {num} turns, {adv.shape[0]} advantages")
    if not torch.isfinite(adv).all():
        bad = int((~torch.isfinite(adv)).nonzero()[0, 0])
        raise ConfigError(f"advantage of turn {bad} is {adv[bad].item()}; advantages must be finite")
    steps = None if turn_step is None else torch.as_tensor(np.asarray(turn_step, dtype=np.int64).reshape(-1))
    if steps is not None and steps.shape[0] != num:
        raise ConfigError(f"pack_turns needs one turn step per turn: {num} turns, "
                          f"{steps.shape[0]} turn steps")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
        raise ConfigError(f"pack_turns: max_length must be an integer >= 2 or None, got {max_length!r}")

    prompt_len = torch.tensor([len(t.prompt_ids) for t in turns], dtype=torch.long)
    response_len = torch.tensor([len(t.response_ids) for t in turns], dtype=torch.long)
    logprob_len = torch.tensor([len(t.response_logprobs) for t in turns], dtype=torch.long)
    if (logprob_len != response_len).any():
        i = int((logprob_len != response_len).nonzero()[0, 0])
        raise ConfigError(
            f"turn {i} has {int(response_len[i])} response ids but {int(logprob_len[i])} response_logprobs"
        )
    if (prompt_len == 0).any():
        i = int((prompt_len == 0).nonzero()[0, 0])
        raise ConfigError(f"turn {i} has an empty prompt; its first response token would have no context")
    if max_length is not None and (response_len >= max_length).any():
        i = int((response_len >= max_length).nonzero()[0, 0])
        raise ConfigError(
            f"turn {i} has a {int(response_len[i])}-token response, which does not fit max_length="
            f"{max_length} with at least one prompt token; raise max_length above {int(response_len.max())}"
            f" or cap max_new_tokens below {max_length}"
        )

    ids = torch.tensor(
        list(itertools.chain.from_iterable(itertools.chain(t.prompt_ids, t.response_ids) for t in turns)),
        dtype=torch.long,
    )
    if ids.numel() and int(ids.min()) < 0:
        raise ConfigError("pack_turns got a negative token id")
    response_logprobs = torch.tensor(
        list(itertools.chain.from_iterable(t.response_logprobs for t in turns)), dtype=torch.float32
    )
    if not torch.isfinite(response_logprobs).all():
        raise ConfigError("pack_turns got a non-finite response log-prob; "
                          "the sampler must report finite ones")

    total = prompt_len + response_len
    drop = torch.zeros_like(total) if max_length is None else (total - max_length).clamp(min=0)
    row = torch.repeat_interleave(torch.arange(num), total)  # row of each flat token
    starts = torch.cumsum(total, 0) - total
    pos = torch.arange(ids.numel()) - starts[row]  # position in the untruncated row
    keep = pos >= drop[row]
    col = pos - drop[row]
    is_response = pos >= prompt_len[row]  # flat order of these equals the order of response_logprobs

    width = int((total - drop).max())
    input_ids = torch.full((num, width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((num, width), dtype=torch.long)
    response_mask = torch.zeros((num, width), dtype=torch.float32)
    old_logprobs = torch.zeros((num, width), dtype=torch.float32)
    input_ids[row[keep], col[keep]] = ids[keep]
    attention_mask[row[keep], col[keep]] = 1
    response_mask[row[is_response], col[is_response]] = 1.0
    old_logprobs[row[is_response], col[is_response]] = response_logprobs
    if skip_forced:
        for i, turn in enumerate(turns):
            forced = turn.extras.get("forced_positions") or ()
            if any(not 0 <= k < len(turn.response_ids) for k in forced):
                raise ConfigError(f"turn {i} has forced_positions outside its {len(turn.response_ids)}-token "
                                  "response")
            start = int(prompt_len[i] - drop[i])
            response_mask[i, [start + int(k) for k in forced]] = 0.0
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        advantages=torch.where(response_mask.bool(), adv.unsqueeze(1), torch.zeros(())),
        old_logprobs=old_logprobs,
        turn_index=torch.arange(num, dtype=torch.long),
        turn_step=steps,
    )


def _permutation(num: int, generator: torch.Generator | None, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(num)
    return torch.randperm(num, generator=generator)


def minibatches(
    batch: TokenBatch,
    num_minibatches: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
) -> list[TokenBatch]:
    """Split the rows into ``num_minibatches`` shuffled parts whose sizes differ by at most one.

    Every row lands in exactly one part. The permutation is drawn from ``generator`` (CPU), so the
    same generator state gives the same split; None draws from torch's global generator. Each part
    is ``trim``-med to its own longest row.

    Args:
        batch: The rows to split.
        num_minibatches: Number of parts, in ``[1, batch.num_rows]``.
        generator: Source of the shuffle.
        shuffle: False keeps the row order (parts are consecutive rows).

    Returns:
        The parts (each a ``TokenBatch``).

    Raises:
        ConfigError: ``num_minibatches`` outside ``[1, batch.num_rows]``.

    Example:
        >>> turns = [Turn([1], [2], [-0.1], 0.0, str(i)) for i in range(5)]
        >>> parts = minibatches(pack_turns(turns, [0.0] * 5, pad_token_id=0), 2,
        ...                     generator=torch.Generator().manual_seed(0))
        >>> sorted(i for p in parts for i in p.turn_index.tolist()), [p.num_rows for p in parts]
        ([0, 1, 2, 3, 4], [3, 2])
    """
    if not isinstance(num_minibatches, int) or not 1 <= num_minibatches <= batch.num_rows:
        raise ConfigError(
            f"num_minibatches must be an integer in [1, {batch.num_rows}] (the number of rows), "
            f"got {num_minibatches!r}"
        )
    order = _permutation(batch.num_rows, generator, shuffle)
    return [batch.select(part).trim() for part in torch.tensor_split(order, num_minibatches)]


def token_minibatches(
    batch: TokenBatch,
    max_tokens: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
) -> list[TokenBatch]:
    """Split shuffled rows into consecutive parts of at most ``max_tokens`` padded tokens each.

    A part's cost is ``rows × longest row`` (what a forward pass allocates). Rows are taken in
    shuffled order and a new part starts when the next row would break the budget; a single row
    longer than the budget gets a part of its own. Use it for gradient accumulation: with
    ``token-mean`` weight each part's loss by its share of the response tokens
    (``part.num_response_tokens / batch.num_response_tokens``) so the sum equals the full-batch loss.

    Args:
        batch: The rows to split.
        max_tokens: Budget of padded tokens per part (>= 1).
        generator: Source of the shuffle.
        shuffle: False keeps the row order.

    Returns:
        The parts, each ``trim``-med; every row lands in exactly one.

    Raises:
        ConfigError: ``max_tokens`` < 1.
    """
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    order = _permutation(batch.num_rows, generator, shuffle).tolist()
    lengths = batch.attention_mask.sum(-1).tolist()
    parts: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(int(lengths[i]), 1)
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            parts.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        parts.append(current)
    return [batch.select(part).trim() for part in parts]


def _token_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and (optionally) entropy under ``log_softmax(logits / temperature)``.

    ``logits`` ``(rows, n, vocab)`` in any float dtype, computed in float32; returns two ``(rows, n)``.
    """
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    logprobs = torch.log_softmax(scores, dim=-1)
    chosen = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return chosen, torch.zeros_like(chosen)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return chosen, entropy


def sequence_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_rows: int | None = None,
    all_positions: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs (and entropies) of the batch's response tokens, in one forward pass.

    ``logprobs[:, j] = log_softmax(logits[:, j - 1] / temperature)[input_ids[:, j]]`` at the
    ``response_mask`` positions ``j`` (``all_positions``: at every ``j >= 1``) and 0 elsewhere (the
    alignment of ``TokenBatch``); ``entropy[:, j]`` is the entropy in nats of that same full-vocabulary
    distribution.

    With ``all_positions=False`` only the response positions' logits are computed where the model allows
    it (``optim.response_logits``): its decoder's last
    hidden states go through the output layer at those positions only (``(tokens, vocab)`` instead of
    ``(rows, seq, vocab)``: a tool turn's prompt is most of its row, and with a 49k vocabulary the
    logits were most of the update's memory). That needs ``get_decoder``/``get_output_embeddings`` and
    logits that are exactly the output layer of the last hidden state, which is checked on the model's
    first batch (else every position's logits are computed). Float rounding then differs from the full
    pass in the last bits, so a run is not bit-identical to one with every position's logits.
    The log-softmax runs over chunks (at most ``MAX_CHUNK_ELEMENTS`` floats each unless ``chunk_rows``
    says otherwise), and with autograd on each chunk is checkpointed, so its float32 temporaries are
    recomputed in the backward pass instead of being kept.

    The model runs in whatever mode it is in (call ``model.train()``/``eval()`` first) and with
    autograd as the caller has it (wrap in ``torch.no_grad()`` for old/reference log-probs).

    Args:
        model: A causal LM whose forward takes ``input_ids``, ``attention_mask``, ``position_ids``
            and returns ``.logits`` ``(rows, seq, vocab)`` (any ``transformers`` causal LM).
        batch: The packed rows (moved to the model's device if needed).
        temperature: Divides the logits (use the sampling temperature); must be > 0.
        return_entropy: Also return the entropies.
        chunk_rows: Rows (of the full-logits path; tokens of the response path: rows × sequence
            length) per log-softmax chunk; None picks the most that fit ``MAX_CHUNK_ELEMENTS``.
        all_positions: Compute every position's logits (the default); False: the response positions'
            only, where the model allows it.

    Returns:
        ``(logprobs, entropy)``, float32 ``(rows, seq)`` each on the model's device; ``entropy`` is
        None unless ``return_entropy``.

    Raises:
        ConfigError: A non-positive ``temperature`` or ``chunk_rows``.
    """
    if not temperature > 0:
        raise ConfigError(f"sequence_logprobs: temperature must be > 0, got {temperature}")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ConfigError("sequence_logprobs: chunk_rows must be a positive integer or None, "
                          f"got {chunk_rows!r}")
    device = _model_device(model)
    input_ids = batch.input_ids.to(device)
    attention_mask = batch.attention_mask.to(device)
    # Right padding: real tokens sit at 0..len-1 already; counting from the mask keeps it explicit.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return row_logprobs(model, input_ids, attention_mask, position_ids, batch.response_mask.to(device),
                        temperature=temperature, return_entropy=return_entropy, chunk_rows=chunk_rows,
                        all_positions=all_positions)


def row_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, response_mask: torch.Tensor, *, temperature: float,
                 return_entropy: bool, chunk_rows: int | None, all_positions: bool,
                 past_key_values: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` on tensors already on the model's device, optionally continuing a cache.

    With ``past_key_values`` (a prefix's cache, one row per row here), ``input_ids`` are the rows'
    continuations: ``attention_mask`` covers prefix and continuation, ``position_ids`` count on from the
    prefix, and position 0 of the result (the continuation's first token, whose logits belong to the
    prefix pass) holds 0 like the other positions that are not computed. ``response_mask`` is aligned
    with ``input_ids``.
    """
    rows, seq = input_ids.shape
    device = input_ids.device
    if seq < 2:
        zeros = torch.zeros((rows, seq), dtype=torch.float32, device=device)
        return zeros, (zeros.clone() if return_entropy else None)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
              "use_cache": past_key_values is not None}
    targets = input_ids[:, 1:]
    head = None if all_positions else _response_head(model, inputs, probe=past_key_values is None)
    if head is not None:
        decoder, layer = head
        hidden = decoder(**inputs, **_with_cache(decoder, past_key_values)).last_hidden_state
        where = response_mask[:, 1:].bool()
        logits = layer(hidden[:, :-1][where])  # (response tokens, vocab)
        chosen, entropy = _chunked_stats(logits, targets[where], temperature, return_entropy,
                                         chunk_rows * (seq - 1) if chunk_rows else None)
        logprobs = torch.zeros((rows, seq - 1), dtype=chosen.dtype, device=device)
        logprobs = logprobs.masked_scatter(where, chosen)
        logprobs = F.pad(logprobs, (1, 0))
        if not return_entropy:
            return logprobs, None
        entropies = torch.zeros((rows, seq - 1), dtype=entropy.dtype, device=device)
        return logprobs, F.pad(entropies.masked_scatter(where, entropy), (1, 0))
    logits = model(**inputs, **_with_cache(model, past_key_values)).logits[:, :-1, :]
    vocab = logits.shape[-1]
    step = chunk_rows or max(1, MAX_CHUNK_ELEMENTS // max((seq - 1) * vocab, 1))
    recompute = torch.is_grad_enabled() and logits.requires_grad
    chosen_parts: list[torch.Tensor] = []
    entropy_parts: list[torch.Tensor] = []
    for start in range(0, rows, step):
        args = (logits[start : start + step], targets[start : start + step], temperature, return_entropy)
        if recompute:
            chosen, entropy = checkpoint(_token_stats, *args, use_reentrant=False)
        else:
            chosen, entropy = _token_stats(*args)
        chosen_parts.append(chosen)
        entropy_parts.append(entropy)
    logprobs = F.pad(torch.cat(chosen_parts, 0), (1, 0))
    if not return_entropy:
        return logprobs, None
    return logprobs, F.pad(torch.cat(entropy_parts, 0), (1, 0))


def _with_cache(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword that hands ``cache`` to ``module``'s forward (its name changed in transformers 5)."""
    return {} if cache is None else {cache_argument_name(module): cache}


def _chunked_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                   chunk: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_token_stats`` over ``(tokens, vocab)`` logits, in checkpointed chunks of tokens."""
    if logits.shape[0] == 0:
        empty = logits.new_zeros((0,), dtype=torch.float32)
        return empty, empty.clone()
    step = chunk or max(1, MAX_CHUNK_ELEMENTS // max(logits.shape[-1], 1))
    recompute = torch.is_grad_enabled() and logits.requires_grad
    chosen_parts, entropy_parts = [], []
    for start in range(0, logits.shape[0], step):
        args = (logits[None, start : start + step], targets[None, start : start + step], temperature,
                with_entropy)
        chosen, entropy = (checkpoint(_token_stats, *args, use_reentrant=False) if recompute
                           else _token_stats(*args))
        chosen_parts.append(chosen[0])
        entropy_parts.append(entropy[0])
    return torch.cat(chosen_parts), torch.cat(entropy_parts)


def _response_head(model: Any, inputs: dict[str, Any], *, probe: bool = True) -> tuple[Any, Any] | None:
    """``(decoder, output layer)`` when the model's logits are exactly the output layer applied to its
    decoder's last hidden state, so logits can be computed at chosen positions only; None otherwise.

    Checked once per model, on its first batch (``inputs``), against the model's own logits of the last
    position; a model whose config scales or soft-caps logits after the layer is not tried. ``probe=False``
    (inputs that continue a cache, which a probe pass would extend): a model not checked yet gets None.
    """
    ok = getattr(model, "_agentgym_head_ok", None)
    if ok is False or (ok is None and not probe):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_layer = getattr(model, "get_output_embeddings", None)
    config = getattr(model, "config", None)
    scaled = any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale",
                                                          "logits_scaling"))
    if not (callable(get_decoder) and callable(get_layer)) or config is None or scaled:
        return None
    decoder, layer = get_decoder(), get_layer()
    if decoder is None or layer is None:
        return None
    if ok is None:
        with torch.no_grad():
            try:
                expected = model(**inputs).logits[:, -1:].float()
                got = layer(decoder(**inputs).last_hidden_state[:, -1:]).float()
                ok = got.shape == expected.shape and bool(torch.allclose(got, expected, atol=1e-4, rtol=1e-4))
            except (TypeError, AttributeError):
                ok = False  # a decoder that takes other arguments or returns no last_hidden_state
        try:
            model._agentgym_head_ok = ok
        except AttributeError:
            return None
    return (decoder, layer) if ok else None


def _model_device(model: torch.nn.Module) -> torch.device:
    embeddings = getattr(model, "get_input_embeddings", None)
    if callable(embeddings):
        layer = embeddings()
        if layer is not None and getattr(layer, "weight", None) is not None:
            return layer.weight.device
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")
