"""The ``Policy`` and ``Scorer`` protocols (what rollouts need from a model) and their records.

A policy turns a batch of prompts (token ids, chat template already applied) into sampled
continuations with per-token log-probs. A policy that can also compute teacher-forced log-probs of
given continuations is a ``Scorer`` (IGPO needs one). Backends live in ``agentgym.backends``
(transformers on CPU or CUDA, vLLM in-process or as a server, any OpenAI-compatible endpoint). This
module imports no ML framework, so the env side stays torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch."""

    max_new_tokens: int = 64
    """Cap on generated tokens per prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax), which makes generation deterministic."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 disables it)."""
    top_k: int = 0
    """Sample only among the k most likely tokens (0 disables it)."""
    stop_strings: tuple[str, ...] = ()
    """Stop when the decoded continuation ends with one of these (kept in the output)."""
    num_top_logprobs: int = 0
    """Also return the k most likely tokens' log-probs at every position (ARPO needs them)."""
    return_entropy: bool = False
    """Also return the entropy at every position (see ``Generation.entropies``)."""
    seed: int | None = None
    """Seed for this batch's sampling; None continues the backend's generator."""
    constraint: str | None = None
    """Name of a registered ``agentgym.rollout.constraints.DecodingConstraint`` that every response
    must satisfy, with its arguments after a colon if any (e.g. ``"tag_spans"``,
    ``"tag_spans:python,answer"``); None generates freely."""


@dataclass(frozen=True)
class Generation:
    """One sampled continuation."""

    token_ids: list[int]
    """Generated ids, never re-tokenized; includes the end-of-turn token when one was sampled."""
    logprobs: list[float]
    """Log-prob of each generated id under the sampling distribution (after temperature and
    filtering); at temperature 0 (greedy), under the model's temperature-1 distribution."""
    finish_reason: Literal["stop", "length"]
    """``stop``: an end-of-turn token or stop string; ``length``: ``max_new_tokens`` reached."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per position, the ``num_top_logprobs`` most likely (id, log-prob) pairs, most likely first."""
    entropies: list[float] | None = None
    """Per position, the entropy (nats) of the sampling distribution: the full vocabulary unless
    top-k/top-p filter it; at temperature 0 (greedy), of the model's temperature-1 distribution."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Backend-specific data (JSON-safe). Under a decoding constraint, ``"forced_positions"``: the
    positions where the constraint allowed exactly one token (no choice was made there)."""


@runtime_checkable
class ChatTokenizer(Protocol):
    """What the collector needs from a tokenizer (a ``transformers`` tokenizer satisfies it)."""

    eos_token_id: int | None
    pad_token_id: int | None

    def apply_chat_template(self, conversation: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...


@runtime_checkable
class Policy(Protocol):
    """Contract of every generation backend.

    ``generate(prompts, params)`` takes a batch of prompt token-id lists and returns one
    ``Generation`` per prompt, in order. Prompts may have different lengths; backends pad as they
    need. ``tokenizer`` renders chat messages to ids and decodes generated ids.
    ``sync_weights(state_dict)`` loads trained weights (a no-op for a backend that *is* the trained
    model); called after every update so rollouts use the newest policy.

    What a backend can and cannot do beyond this (entropies, a cap on top-k log-probs, whether it is
    the trained model, pauses for updates or is shared by processes) it declares as the attributes of
    ``PolicyBase``; the trainer reads them through ``capability``.
    """

    tokenizer: ChatTokenizer

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]: ...

    def sync_weights(self, state_dict: Any) -> None: ...


class PolicyBase:
    """The capabilities a ``Policy`` declares beyond the protocol, with the defaults of a plain backend.

    The trainer reads these instead of testing a backend's type. Built-in backends inherit this class and
    override what differs; a policy that does not inherit it is read with these defaults (``capability``).
    """

    supports_entropies: bool = True
    """``Generation.entropies`` are returned when asked for (False: algorithms that need them refuse it)."""
    max_top_logprobs: int | None = None
    """Most top-k log-probs per position it can return (None: no cap)."""
    is_trained_model: bool = False
    """It generates with the trained model's own parameters, so an update changes it mid-collection:
    asynchronous rollouts generate with ``detached_copy()`` instead."""
    pauses_for_updates: bool = False
    """A colocated engine that gives the accelerator back during updates (``offload`` before each): it
    cannot generate while an update runs, so asynchronous rollouts cannot use it."""
    takes_weights_in_flight: bool = False
    """``sync_weights`` may run while ``generate`` runs in another thread (a server swaps weights between
    requests): asynchronous rollouts send it each update's weights at once, mid-collection."""
    shared_by_processes: bool = False
    """One generator serves every training process (a server): only the main process sends it weights
    (its ``writer`` attribute says whether this process does)."""

    def offload(self) -> None:
        """Free the accelerator for an update (called when ``pauses_for_updates``); the next ``generate``
        takes it back."""

    def detached_copy(self, seed: int) -> Policy:
        """A policy with a frozen copy of the weights (needed when ``is_trained_model``)."""
        raise NotImplementedError(f"{type(self).__name__} generates with weights of its own; it has no "
                                  "detached copy to make")


def capability(policy: Any, name: str) -> Any:
    """The capability ``name`` of ``policy`` (a ``PolicyBase`` attribute), or its default.

    Example:
        >>> class Plain:  # a third-party policy that declares nothing
        ...     pass
        >>> capability(Plain(), "supports_entropies"), capability(Plain(), "max_top_logprobs")
        (True, None)
    """
    return getattr(policy, name, getattr(PolicyBase, name))


@runtime_checkable
class Scorer(Protocol):
    """A policy capability: teacher-forced log-probs of given continuations after given prompts.

    ``score(prompts, continuations)`` returns, per pair, one log-prob per continuation id under the
    model's temperature-1 distribution (``temperature`` divides the logits), computed without
    sampling. ``TransformersPolicy`` implements it; algorithms that need it (``needs.scorer``) fail
    at start-up with a clear message on a backend that does not.
    """

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *,
              temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]: ...
