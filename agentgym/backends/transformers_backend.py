"""``TransformersPolicy``: the ``Policy`` backend over a ``transformers`` causal LM, on CPU or CUDA.

Generation is an explicit KV-cached decoding loop (not ``model.generate``) so the per-token
log-probs, top log-probs and entropies are exactly those of the distribution each token was drawn
from. Prompts of different lengths are left-padded and position ids are counted from the
attention mask, so padding never shifts a prompt's positions. The cache and the shapes of the forward
passes belong to a ``DecodeSteps`` engine (``agentgym.backends.decode_steps``): by default a growing cache
whose prefill runs each distinct prompt, and the prefix all of them share, once, and from which finished
rows are dropped; or a static cache with fixed shapes, optionally compiled (CUDA graphs on a GPU).
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from agentgym.backends.constrained import ConstraintMask, token_pieces
from agentgym.backends.decode_steps import (
    DECODE_MODES,
    DecodeMode,
    DecodeSteps,
    DynamicSteps,
    StaticCaches,
    StaticSteps,
)
from agentgym.backends.prefill import MIN_SHARED_PREFIX, pack_left, positions_from_mask
from agentgym.errors import ConfigError
from agentgym.rollout.constraints import make_constraint
from agentgym.rollout.policy import Generation, PolicyBase, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from agentgym.backends.tiny import TinyModelConfig


def sampling_logprobs(
    logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probs of the distribution a token is drawn from: temperature, then top-k, then top-p.

    The logits are divided by ``temperature``; with ``top_k > 0`` tokens scoring below the k-th
    largest are removed (ties with it are kept); with ``top_p < 1`` the smallest set of most likely
    tokens whose mass reaches ``top_p`` is kept (always at least one). The kept tokens are
    renormalised and removed ones get ``-inf``. With ``temperature=1``, ``top_k=0`` and ``top_p=1``
    this is ``log_softmax(logits)``.

    Args:
        logits: ``(batch, vocab)`` raw next-token logits.
        temperature: Must be > 0 (greedy decoding does not call this).
        top_k: Keep the k most likely tokens; 0 keeps all.
        top_p: Nucleus mass in (0, 1]; 1 keeps all.

    Returns:
        ``(batch, vocab)`` float32 log-probs.

    Example:
        >>> lp = sampling_logprobs(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), top_k=2)
        >>> [round(x, 4) for x in lp.exp()[0].tolist()]
        [0.7311, 0.2689, 0.0, 0.0]
    """
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def entropy_of(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``(batch, vocab)`` log-probs (``-inf`` entries contribute 0).

    Example:
        >>> round(entropy_of(torch.log(torch.tensor([[0.5, 0.5, 0.0]]))).item(), 4)
        0.6931
    """
    finite = torch.isfinite(logprobs)
    plogp = torch.where(finite, logprobs.exp() * logprobs, torch.zeros_like(logprobs))
    return (-plogp.sum(-1)).clamp(min=0.0)


def _forward_parameters(model: torch.nn.Module) -> Mapping[str, inspect.Parameter]:
    """The parameters of the model's ``forward`` (of the base model under PEFT, which passes them on)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        return inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return {}


def _logits_to_keep_name(model: torch.nn.Module) -> str | None:
    """Name of the forward argument that limits the logits to the last n positions, if any."""
    parameters = _forward_parameters(model)
    for name in ("logits_to_keep", "num_logits_to_keep"):  # renamed in transformers 4.50
        if name in parameters:
            return name
    return None


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute the layers' activations in the backward pass instead of keeping them (non-reentrant).
    transformers 5 renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable`` and the
    old name warns on every call; older releases have only the old one."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def cache_argument_name(model: torch.nn.Module) -> str:
    """Name under which ``forward`` takes and returns the KV cache.

    transformers 5.x renamed ``past_key_values`` to ``cache`` and warns on every call that uses the
    old name; earlier releases know only ``past_key_values``.
    """
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


class TransformersPolicy(PolicyBase):
    """``Policy`` over a ``transformers`` causal LM (CPU or CUDA), plus teacher-forced ``score``.

    **What the numbers mean.** For sampled decoding (``temperature > 0``), each position's
    distribution is ``sampling_logprobs(logits, temperature, top_k, top_p)``: logits divided by the
    temperature, then top-k and top-p filtering, renormalised. ``Generation.logprobs`` is the
    log-prob of the sampled id under that distribution, ``top_logprobs`` its most likely entries
    (most likely first; filtered-out tokens, whose log-prob is ``-inf``, are left out, so a position
    may list fewer than ``num_top_logprobs``) and ``entropies`` its entropy in nats. With
    ``temperature=1``, ``top_k=0`` and ``top_p=1`` these are the model's own ``log_softmax``, and
    ``logprobs`` equals ``score(prompts, continuations)`` of the same ids (teacher forcing).
    For greedy decoding (``temperature=0``) the sampling distribution is a point mass, which carries
    no information, so all three are reported under the model's unscaled, unfiltered distribution
    (temperature 1); the chosen id is its argmax, hence always ``top_logprobs[i][0]``.

    **Stopping.** A row stops (``finish_reason="stop"``) after sampling one of ``stop_token_ids``
    (the end-of-turn token is kept as the last id) or a token whose text completes one of
    ``params.stop_strings`` (ids are never cut, so the stop string is inside the last token's text);
    otherwise it stops with ``"length"`` after ``max_new_tokens`` ids.

    **Constraints.** With ``params.constraint`` the tokens the named ``DecodingConstraint`` forbids
    are removed (log-prob ``-inf``) before everything above, so all the numbers are those of the
    constrained distribution (``agentgym.backends.constrained``).

    **Randomness.** ``params.seed`` seeds a fresh generator for that batch: the same prompts, params
    and weights give the same generations. With ``seed=None`` the policy's own generator
    (seeded by ``seed`` at construction) continues. Sampling is per batch, so a prompt's sample
    depends on the rest of its batch; greedy output does not.

    ``generate`` and ``score`` put the model in ``eval`` mode under ``torch.no_grad()`` and restore
    its previous mode, so a trainer may share the model object (then ``sync_weights`` is a no-op).

    Args:
        model: A ``transformers`` causal LM (``PreTrainedModel``); its input-embedding device is used.
        tokenizer: Its tokenizer (a ``ChatTokenizer``).
        device: Move the model there first; None keeps it where it is.
        seed: Seed of the policy's own generator, used when ``params.seed`` is None.
        stop_token_ids: Ids that end a turn; None means the tokenizer's ``eos_token_id`` plus the
            model's ``generation_config.eos_token_id`` (one id or a list).
        decode: How the decoding steps run (``agentgym.backends.decode_steps``): ``"dynamic"`` (a growing
            cache, shared prefixes prefilled once, finished rows dropped: the fastest on a CPU),
            ``"static"`` (a preallocated cache, fixed shapes) or ``"compiled"`` (static, each step through
            ``torch.compile``, with CUDA graphs on a GPU). The numbers above are the same on every one.

    Example:
        >>> from agentgym.backends.tiny import TinyModelConfig
        >>> policy = TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1))
        >>> prompt = policy.tokenizer.encode("2+2=", add_special_tokens=False)
        >>> [gen] = policy.generate([prompt], SamplingParams(max_new_tokens=5, temperature=0))
        >>> len(gen.token_ids), len(gen.logprobs), gen.finish_reason
        (5, 5, 'length')
        >>> scored = policy.score([prompt], [gen.token_ids])[0]
        >>> max(abs(a - b) for a, b in zip(scored, gen.logprobs)) < 1e-4
        True
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device | None = None,
        seed: int = 0,
        stop_token_ids: Sequence[int] | None = None,
        decode: DecodeMode = "dynamic",
    ) -> None:
        if decode not in DECODE_MODES:
            raise ConfigError(f"decode must be one of {list(DECODE_MODES)}, got {decode!r}")
        if device is not None:
            model = model.to(device)
        self.model = model
        self.tokenizer = tokenizer
        if stop_token_ids is None:
            found: list[int] = []
            generation_config = getattr(model, "generation_config", None)
            for ids in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
                if ids is not None:
                    found.extend([ids] if isinstance(ids, int) else ids)
            stop_token_ids = found
        self.stop_token_ids: frozenset[int] = frozenset(int(i) for i in stop_token_ids)
        """Ids that end a turn (``finish_reason="stop"``)."""
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id: int = int(pad)
        """Id written into padding (always masked out)."""
        self._logits_to_keep = _logits_to_keep_name(model)
        self._cache_name = cache_argument_name(model)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self._pieces: dict[int, str] | None = None  # token texts, for constrained decoding
        self.min_shared_prefix: int = MIN_SHARED_PREFIX
        """A batch whose prompts all start with this many common tokens prefills them once
        (``agentgym.backends.prefill``); a larger value than any prompt's length turns that off."""
        self.decode: DecodeMode = decode
        """How the decoding steps run (see the constructor)."""
        self._static_caches = StaticCaches()
        self._compiled_call: Any = None  # torch.compile of the model's __call__, made on first use

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike | TinyModelConfig,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        seed: int = 0,
    ) -> TransformersPolicy:
        """Build the policy from a Hugging Face model (a local directory, or a Hub id ``org/name[@revision]``
        loaded through the Hugging Face cache) or a ``TinyModelConfig``.

        See ``agentgym.backends.tiny.load_model_and_tokenizer`` for ``source`` and ``dtype`` (and its
        ``ConfigError``s); ``device`` and ``seed`` are as in the constructor.
        """
        from agentgym.backends.tiny import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(source, dtype=dtype, device=device)
        return cls(model, tokenizer, seed=seed)

    @property
    def device(self) -> torch.device:
        """Device of the model's input embeddings, where batches are put."""
        return self.model.get_input_embeddings().weight.device

    @property
    def vocab_size(self) -> int:
        """Rows of the model's input embedding; token ids must be below it."""
        return int(self.model.get_input_embeddings().num_embeddings)

    # --- Policy ---------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (see the class docstring for what the numbers mean).

        Args:
            prompts: Token-id lists, chat template already applied; lengths may differ.
            params: How to sample.

        Returns:
            One ``Generation`` per prompt, in order.

        Raises:
            ConfigError: An invalid ``params`` field, an empty prompt or an id outside the vocabulary.
        """
        _check_params(params)
        self._check_ids(prompts, "prompts")
        if not prompts:
            return []
        if params.max_new_tokens == 0:
            return [
                Generation(
                    [],
                    [],
                    "length",
                    [] if params.num_top_logprobs else None,
                    [] if params.return_entropy else None,
                )
                for _ in prompts
            ]
        if params.seed is None:
            if self._generator.device != self.device:  # the model moved since the last batch
                seed = int(
                    torch.randint(0, 2**62, (), generator=self._generator, device=self._generator.device)
                )
                self._generator = torch.Generator(device=self.device)
                self._generator.manual_seed(seed)
            generator = self._generator
        else:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._decode(prompts, params, generator)
        finally:
            self.model.train(was_training)

    is_trained_model = True
    """The trainer trains this policy's own model."""

    def detached_copy(self, seed: int) -> TransformersPolicy:
        """A policy over a deep copy of the model: it keeps generating with these weights while the
        trainer updates the original (asynchronous rollouts)."""
        return TransformersPolicy(copy.deepcopy(self.model), self.tokenizer, seed=seed, decode=self.decode)

    def sync_weights(self, state_dict: Any) -> None:
        """Load trained weights: a state dict, a module, or None.

        A no-op when ``state_dict`` is None, is this policy's model, or holds exactly the model's
        own tensors (a trainer sharing the model). Otherwise tensors are copied in (cast to the
        model's device and dtype); a partial state dict updates only the tensors it names.

        Raises:
            ConfigError: Keys the model does not have, or shapes that do not match.
        """
        if state_dict is None or state_dict is self.model:
            return
        if isinstance(state_dict, torch.nn.Module):
            state_dict = state_dict.state_dict()
        if not isinstance(state_dict, Mapping):
            raise ConfigError(
                f"sync_weights expects a state dict (mapping of name -> tensor), an "
                f"nn.Module or None, got {type(state_dict).__name__}"
            )
        own = self.model.state_dict()
        if all(
            name in own and isinstance(t, torch.Tensor) and t.data_ptr() == own[name].data_ptr()
            for name, t in state_dict.items()
        ):
            return
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise ConfigError(
                f"sync_weights got {len(unexpected)} tensors this model does not have, "
                f"e.g. {unexpected[:3]}; pass the state dict of the same architecture"
            )
        try:
            self.model.load_state_dict(state_dict, strict=False)
        except RuntimeError as error:
            raise ConfigError(f"sync_weights could not load the state dict: {error}") from error

    # --- teacher forcing ------------------------------------------------------------------------

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        batch_size: int | None = None,
    ) -> list[list[float]]:
        """Teacher-forced log-prob of every continuation id given its prompt and the ids before it.

        Computes ``log_softmax(logits / temperature)`` at each continuation position (no top-k or
        top-p filtering), in batches padded on the left like ``generate``.

        Args:
            prompts: Context token-id lists (each non-empty).
            continuations: The ids to score, one list per prompt (may be empty).
            temperature: Divides the logits; must be > 0.
            batch_size: Sequences per forward pass; None scores all at once.

        Returns:
            Per continuation, one log-prob per id (``len(continuations[i])`` floats).

        Raises:
            ConfigError: Mismatched lengths, an empty prompt, an id outside the vocabulary, or a
                non-positive ``temperature``/``batch_size``.
        """
        if len(prompts) != len(continuations):
            raise ConfigError(
                f"score needs one continuation per prompt, got {len(prompts)} prompts "
                f"and {len(continuations)} continuations"
            )
        if not temperature > 0:
            raise ConfigError(f"score: temperature must be > 0, got {temperature}")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"score: batch_size must be >= 1 or None, got {batch_size}")
        self._check_ids(prompts, "prompts")
        self._check_ids(continuations, "continuations", allow_empty=True)
        step = batch_size or max(len(prompts), 1)
        results: list[list[float]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(prompts), step):
                    results.extend(
                        self._score_batch(
                            prompts[start : start + step], continuations[start : start + step], temperature
                        )
                    )
        finally:
            self.model.train(was_training)
        return results

    # --- internals ------------------------------------------------------------------------------

    def _forward(self, keep_last: int, **inputs: Any) -> tuple[Any, torch.Tensor]:
        """The model output and its last ``keep_last`` logits ``(batch, keep_last, vocab)`` as float32."""
        return self._call(self.model, keep_last, inputs)

    def _compiled_forward(self, keep_last: int, **inputs: Any) -> tuple[Any, torch.Tensor]:
        """``_forward`` through ``torch.compile`` (CUDA graphs on a GPU); its logits are copied out, since
        the next replay of a captured graph overwrites its outputs."""
        if self._compiled_call is None:
            cuda = self.device.type == "cuda"
            self._compiled_call = torch.compile(self.model.__call__, mode="reduce-overhead" if cuda else None)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        out, logits = self._call(self._compiled_call, keep_last, inputs)
        return out, logits.clone()

    def _call(self, call: Any, keep_last: int, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor]:
        if self._logits_to_keep is not None:
            inputs[self._logits_to_keep] = keep_last
        out = call(**inputs)
        # .to(): with a model split over devices the logits come off the last one.
        return out, out.logits[:, -keep_last:, :].float().to(self.device)

    def _score_batch(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], temperature: float
    ) -> list[list[float]]:
        width = max(len(c) for c in continuations)
        if width == 0:
            return [[] for _ in prompts]
        input_ids, attention_mask = pack_left(
            [list(p) + list(c) for p, c in zip(prompts, continuations, strict=True)], self.pad_token_id,
            self.device,
        )
        # Left padding puts every continuation in the last `width` columns; the logits one column
        # earlier predict them.
        _, logits = self._forward(
            width + 1,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
        )
        logprobs = torch.log_softmax(logits[:, :-1, :] / temperature, dim=-1)
        targets = input_ids[:, -width:]
        token_logprobs = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).tolist()
        return [row[width - len(c) :] if len(c) else []
                for row, c in zip(token_logprobs, continuations, strict=True)]

    def _decode(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, generator: torch.Generator
    ) -> list[Generation]:
        greedy = params.temperature == 0
        num_top = min(params.num_top_logprobs, self.vocab_size)
        mask = self._constraint_mask(params, prompts)
        # A stop string of n bytes spans at most n tokens (every token is at least one byte); the
        # margin covers decoders that drop a leading space of the first token decoded.
        window = max((len(s.encode("utf-8")) for s in params.stop_strings), default=0) + 2

        rows = list(range(len(prompts)))  # prompt index of each batch row
        active = [True] * len(rows)  # False only for finished rows kept when the cache cannot shrink
        token_ids: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        top_logprobs: list[list[list[tuple[int, float]]]] = [[] for _ in prompts]
        entropies: list[list[float]] = [[] for _ in prompts]
        reasons: list[str] = ["length"] * len(prompts)
        forced: list[list[int]] = [[] for _ in prompts]  # positions where the constraint allowed one token
        steps = self._decode_steps(prompts, params.max_new_tokens)
        logits = steps.logits
        for _ in range(params.max_new_tokens):
            if mask is not None:
                live_rows = [i if a else None for i, a in zip(rows, active, strict=True)]
                allowed = mask.step(live_rows, self.device)
                logits = logits + allowed
            if greedy:
                dist = torch.log_softmax(logits, dim=-1)
                chosen = logits.argmax(dim=-1)
            else:
                dist = sampling_logprobs(
                    logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
                )
                chosen = self._draw(dist, active, generator)
            # What the rows record, copied to the host in one piece (on a GPU every copy waits for the
            # device): id, log-prob, top ids, top log-probs, entropy, whether the rule left one token.
            columns = [chosen.unsqueeze(-1), dist.gather(-1, chosen.unsqueeze(-1))]
            if num_top:
                top = torch.topk(dist, num_top, dim=-1)
                columns += [top.indices, top.values]
            if params.return_entropy:
                columns.append(entropy_of(dist).unsqueeze(-1))
            if mask is not None:
                columns.append(torch.isfinite(allowed).sum(-1, keepdim=True) == 1)
            host = torch.cat([c.double() for c in columns], dim=-1).tolist()

            keep: list[int] = []
            for j, i in enumerate(rows):
                if not active[j]:
                    continue
                row = host[j]
                token = int(row[0])
                token_ids[i].append(token)
                if mask is not None:
                    mask.advance(i, token)
                    if row[-1]:
                        forced[i].append(len(token_ids[i]) - 1)
                logprobs[i].append(row[1])
                if num_top:
                    top_logprobs[i].append([(int(t), v) for t, v in zip(row[2 : 2 + num_top],
                                                                        row[2 + num_top : 2 + 2 * num_top],
                                                                        strict=True) if v != float("-inf")])
                if params.return_entropy:
                    entropies[i].append(row[2 + 2 * num_top])
                if token in self.stop_token_ids or self._hits_stop_string(token_ids[i], params, window):
                    reasons[i] = "stop"
                elif len(token_ids[i]) >= params.max_new_tokens:
                    reasons[i] = "length"
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < sum(active):
                index = torch.tensor(keep, device=self.device)
                if steps.drop(index):
                    rows = [rows[j] for j in keep]
                    active = [True] * len(rows)
                    chosen = chosen.index_select(0, index)
                else:  # keep finished rows in the batch, feeding masked padding
                    active = [j in keep for j in range(len(rows))]
            live = torch.tensor(active, device=self.device)
            # Every kept row is below max_new_tokens, so the next step's logits are needed.
            logits = steps.step(torch.where(live, chosen, torch.full_like(chosen, self.pad_token_id)), live)

        return [
            Generation(
                token_ids=token_ids[i],
                logprobs=logprobs[i],
                finish_reason=reasons[i],  # type: ignore[arg-type]
                top_logprobs=top_logprobs[i] if num_top else None,
                entropies=entropies[i] if params.return_entropy else None,
                extras={} if mask is None else {"forced_positions": forced[i]},
            )
            for i in range(len(prompts))
        ]

    def _draw(self, dist: torch.Tensor, active: list[bool], generator: torch.Generator) -> torch.Tensor:
        """One sampled token per row of ``dist``, drawn for the live rows only: finished rows that an
        engine keeps as padding take no randomness, so every engine (one that drops finished rows or one
        that keeps them) draws the same tokens from the same seed. A finished row's entry is 0, never read."""
        if all(active):
            return torch.multinomial(dist.exp(), 1, generator=generator).squeeze(-1)
        live = torch.tensor([j for j, a in enumerate(active) if a], device=dist.device)
        chosen = torch.zeros(dist.shape[0], dtype=torch.long, device=dist.device)
        chosen[live] = torch.multinomial(dist.index_select(0, live).exp(), 1, generator=generator).squeeze(-1)
        return chosen

    def _decode_steps(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> DecodeSteps:
        if self.decode == "dynamic":
            return DynamicSteps(self._forward, self.model, self._cache_name, prompts, self.pad_token_id,
                                self.device, min_shared_prefix=self.min_shared_prefix)
        step_forward = self._compiled_forward if self.decode == "compiled" else self._forward
        return StaticSteps(self._forward, step_forward, self.model, self._cache_name, self._static_caches,
                           prompts, max_new_tokens, self.pad_token_id, self.device)

    def _constraint_mask(self, params: SamplingParams,
                         prompts: Sequence[Sequence[int]]) -> ConstraintMask | None:
        if params.constraint is None:
            return None
        if self._pieces is None:
            self._pieces = token_pieces(self.tokenizer, self.vocab_size)
        return ConstraintMask(make_constraint(params.constraint), self.tokenizer, prompts, self._pieces,
                              self.stop_token_ids, self.vocab_size)

    def _hits_stop_string(self, ids: list[int], params: SamplingParams, window: int) -> bool:
        # Any occurrence that ended before the last token would already have stopped the row, so
        # one inside the window's text ends in the last token.
        if not params.stop_strings:
            return False
        text = self.tokenizer.decode(ids[-window:], skip_special_tokens=False)
        return any(stop in text for stop in params.stop_strings)

    def _check_ids(self, sequences: Sequence[Sequence[int]], what: str, allow_empty: bool = False) -> None:
        vocab = self.vocab_size
        for n, seq in enumerate(sequences):
            if not allow_empty and len(seq) == 0:
                raise ConfigError(
                    f"{what}[{n}] is empty; every prompt needs at least one token "
                    f"(render it with tokenizer.apply_chat_template)"
                )
            if len(seq) and (min(seq) < 0 or max(seq) >= vocab):
                raise ConfigError(
                    f"{what}[{n}] has token ids outside [0, {vocab}) of this model's "
                    f"vocabulary; were they made by a different tokenizer?"
                )


def _check_params(params: SamplingParams) -> None:
    if not isinstance(params, SamplingParams):
        raise ConfigError("params must be agentgym.rollout.policy.SamplingParams, "
                          f"got {type(params).__name__}")
    if params.max_new_tokens < 0:
        raise ConfigError(f"SamplingParams.max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ConfigError(f"SamplingParams.temperature must be >= 0 (0 is greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ConfigError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ConfigError(f"SamplingParams.top_k must be >= 0 (0 disables it), got {params.top_k}")
    if params.num_top_logprobs < 0:
        raise ConfigError(f"SamplingParams.num_top_logprobs must be >= 0, got {params.num_top_logprobs}")
    if params.constraint is not None:
        make_constraint(params.constraint)  # an unknown name raises, with the registered ones
    if any(not isinstance(s, str) or not s for s in params.stop_strings):
        raise ConfigError(
            f"SamplingParams.stop_strings must be non-empty strings, got {params.stop_strings!r}"
        )
