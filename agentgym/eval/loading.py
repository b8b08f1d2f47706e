"""Turning a ``PolicySpec`` into something that plays: a token-level ``Policy`` (local models, endpoint
completions), a chat endpoint, or nothing to load (``random``, ``expert``). Checks what it can
before any episode: files, tokenizer and chat template, that an endpoint answers and serves the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError
from agentgym.eval.policies import PolicySpec
from agentgym.rollout.policy import Policy

if TYPE_CHECKING:
    from agentgym.eval.plan import EvalPlan


@dataclass
class LoadedPolicy:
    """A policy ready to play."""

    spec: PolicySpec
    token_policy: Policy | None = None
    """Token-level policies run through the ``Collector``."""
    endpoint: Any = None
    """Chat endpoints (``OpenAIEndpoint``) run episode by episode."""

    def close(self) -> None:
        closer = getattr(self.token_policy, "close", None)
        if callable(closer):
            closer()


def _model_config(spec: PolicySpec, path: str | None, model: dict[str, Any] | None = None) -> Any:
    from agentgym.backends.config import ModelConfig, TinyModelConfig

    model = model or {}
    tiny = TinyModelConfig(**model["tiny"]) if model.get("tiny") else TinyModelConfig()
    return ModelConfig(path=path, tiny=tiny, backend="transformers", dtype=model.get("dtype", spec.dtype),
                       device=spec.device)  # type: ignore[arg-type]


def _load_checkpoint(spec: PolicySpec, location: str) -> Policy:
    """A run's checkpoint: the model the run's config describes, with the checkpoint's weights."""
    import torch

    from agentgym.backends.builder import make_policy

    config = spec.run_config or {}
    model_section = config.get("model") or {}
    policy = make_policy(_model_config(spec, model_section.get("path"), model_section),
                         seed=int(config.get("seed", 0)))
    state = torch.load(location, map_location="cpu", weights_only=False)  # our own checkpoint (RNG states too)
    if not isinstance(state, dict) or "model" not in state:
        raise ConfigError(f"policy {spec.text!r}: {location} is not an `agentgym train` checkpoint (no 'model' entry)")
    try:
        policy.model.load_state_dict(state["model"])  # type: ignore[attr-defined]
    except RuntimeError as exc:
        raise ConfigError(f"policy {spec.text!r}: the checkpoint does not fit the model its config.json describes "
                          f"({str(exc).splitlines()[0]})") from None
    return policy


def load_policy(spec: PolicySpec, plan: EvalPlan) -> LoadedPolicy:
    """Load or connect to ``spec``'s policy.

    Raises:
        ConfigError: a model directory without weights, tokenizer or chat template; a checkpoint that
            does not fit; an endpoint model the server does not serve.
        PolicyEndpointError: an endpoint that cannot be reached or answers with an error.
    """
    if spec.kind in ("random", "expert"):
        return LoadedPolicy(spec)
    if spec.kind == "endpoint":
        from agentgym.backends.openai_backend import OpenAIEndpoint, OpenAIPolicy, load_chat_tokenizer

        endpoint = OpenAIEndpoint(spec.location or "", spec.model, timeout_s=spec.timeout_s,
                                  max_retries=spec.max_retries)
        endpoint.check()
        if spec.api == "chat":
            return LoadedPolicy(spec, endpoint=endpoint)
        tokenizer = load_chat_tokenizer(spec.tokenizer or "")
        return LoadedPolicy(spec, OpenAIPolicy(endpoint, tokenizer, concurrency=plan.concurrency,
                                               allow_retokenize=True))
    from agentgym.backends.builder import make_policy

    location = spec.location or ""
    if spec.kind == "run" and location.endswith(".pt"):
        return LoadedPolicy(spec, _load_checkpoint(spec, location))
    return LoadedPolicy(spec, make_policy(_model_config(spec, location), seed=plan.sampling_seed))
