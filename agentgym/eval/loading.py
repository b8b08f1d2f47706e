"""Turning a ``PolicySpec`` into something that plays: a token-level ``Policy`` (local models, endpoint
completions), a chat endpoint, or nothing to load (``random``, ``expert``). Checks what it can
before any episode: files (a model's ``config.json`` is JSON, a checkpoint is a whole ``agentgym train``
checkpoint), tokenizer and chat template, that an endpoint answers and serves the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
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
    # A run trained from a Hub id recorded it with its revision: its checkpoint goes onto that model.
    return ModelConfig(path=path, revision=model.get("revision") if path else None, tiny=tiny,
                       backend="transformers", dtype=model.get("dtype", spec.dtype),
                       device=spec.device)  # type: ignore[arg-type]


def check_model_config(spec: PolicySpec, model_dir: str | Path) -> None:
    """Check that a model directory's ``config.json`` is a JSON object, before a loader trips on it.

    Raises:
        ConfigError: it is not JSON, or not an object (one line naming the file and what to do).
    """
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return  # the loader says what a model directory needs
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"policy {spec.text!r}: {path} is not JSON ({_first_line(exc)}); restore the model "
                          "directory (copy or save the model again)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"policy {spec.text!r}: {path} holds {type(data).__name__}, not a model config; "
                          "restore the model directory (copy or save the model again)")


def read_checkpoint(spec: PolicySpec, location: str | Path) -> dict[str, Any]:
    """The state of an ``agentgym train`` checkpoint file, checked to be one.

    Raises:
        ConfigError: the file is empty, cut short, not a torch file, or has no ``model`` entry (one line
            naming the file and what to do).
    """
    import torch

    path = Path(location)
    redo = "evaluate the run's model/ folder or another checkpoint file instead, or train the run again"
    if path.stat().st_size == 0:
        raise ConfigError(f"policy {spec.text!r}: {path} is empty (0 bytes: cut short while it was "
                          f"written); {redo}")
    try:
        # Our own checkpoint, which holds RNG states too: not loadable with weights_only.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a damaged file fails deep in zipfile or pickle with many types
        raise ConfigError(f"policy {spec.text!r}: {path} is not a readable checkpoint (cut short or not a "
                          f"torch file: {type(exc).__name__}: {_first_line(exc)}); {redo}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise ConfigError(f"policy {spec.text!r}: {path} is not an `agentgym train` checkpoint (no 'model' "
                          f"entry); {redo}")
    return state


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or ["no message"])[0]


def _load_checkpoint(spec: PolicySpec, location: str) -> Policy:
    """A run's checkpoint: the model the run's config describes, with the checkpoint's weights."""
    from agentgym.backends.builder import make_policy

    state = read_checkpoint(spec, location)  # checked first: a damaged file fails before a model is built
    config = spec.run_config or {}
    model_section = config.get("model") or {}
    if not isinstance(model_section, dict):
        raise ConfigError(f"policy {spec.text!r}: the 'model' section of the run's config.json is "
                          f"{type(model_section).__name__}, not a mapping; restore config.json from the run")
    policy = make_policy(_model_config(spec, model_section.get("path"), model_section),
                         seed=int(config.get("seed", 0)))
    try:
        policy.model.load_state_dict(state["model"])  # type: ignore[attr-defined]
    except RuntimeError as exc:
        raise ConfigError(f"policy {spec.text!r}: the checkpoint does not fit the model its config.json "
                          f"describes ({str(exc).splitlines()[0]})") from None
    return policy


def load_policy(spec: PolicySpec, plan: EvalPlan) -> LoadedPolicy:
    """Load or connect to ``spec``'s policy.

    Raises:
        ConfigError: a model directory without weights, tokenizer or chat template, or whose config.json
            is damaged; a checkpoint that is damaged or does not fit; an endpoint model the server does
            not serve.
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
    check_model_config(spec, location)
    return LoadedPolicy(spec, make_policy(_model_config(spec, location), seed=plan.sampling_seed))
