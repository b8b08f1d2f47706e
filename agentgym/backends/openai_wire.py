"""Request bodies of the OpenAI-compatible policy server (pydantic, validated where requests enter).

Fields follow the OpenAI API; ``top_k``, ``return_token_ids`` (adds ``token_ids`` and
``prompt_token_ids`` to every choice), ``include_stop_str_in_output`` and
``return_tokens_as_token_ids`` (log-prob tokens written ``token_id:N``) are the vLLM extensions of
the same names. Fields
clients commonly send but this server does not implement are accepted only at their neutral value.
Every number has bounds in the schema (``SEED_LIMIT``, ``MAX_INT32``...), so a value the server could
not use is a 400 naming the field, never a failure inside generation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 16
MAX_TOP_LOGPROBS = 20
#: Seeds are below this (torch seeds generators with 64-bit integers; n samples of a seeded request
#: use seed, seed+1, ...). A power of two, so the OpenAPI schema states it exactly.
SEED_LIMIT = 2**63
#: Token ids, ``top_k`` and ``max_tokens`` are 32-bit in every tokenizer and sampler this serves.
MAX_INT32 = 2**31 - 1

TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]


class _Request(BaseModel):
    # Unknown fields (user, metadata, ...) are ignored as OpenAI's own API ignores most of them.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="Served model name (GET /v1/models).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=MAX_INT32, description="vLLM extension; 0 or -1 disables it.")
    n: int = Field(1, ge=1, le=MAX_N, description="Samples per prompt.")
    stop: str | list[str] | None = Field(None, description="Up to 4 stop sequences (excluded from the text).")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT,
                             description="Seeds this request's sampling (reproducible).")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = Field(False, description="vLLM extension: add token_ids / prompt_token_ids.")
    include_stop_str_in_output: bool = Field(False,
                                             description="vLLM extension: keep the stop string in the text.")
    return_tokens_as_token_ids: bool = Field(False,
                                             description="vLLM extension: log-prob tokens as 'token_id:N'.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Not supported: only 0 is accepted.")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Not supported: only 0 is accepted.")
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, description="Not supported: only empty is accepted.")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> _Request:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported by this server; leave it at 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self.stop or ())  # type: ignore[arg-type]

    @property
    def include_usage_in_stream(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ErrorDetail(BaseModel):
    """What went wrong, in OpenAI's words."""

    message: str = Field(description="What was wrong and how to fix it.")
    type: str = Field(description="invalid_request_error (4xx) or server_error (5xx).")
    param: str | None = Field(None, description="The request field at fault, if one is.")
    code: str | None = Field(None, description="A machine-readable reason, e.g. model_not_found.")


class ErrorBody(BaseModel):
    """Every error answer of the policy server: OpenAI's ``{"error": {...}}``."""

    error: ErrorDetail


class CompletionRequest(_Request):
    """``POST /v1/completions``: a text prompt, a token-id prompt, or a batch of either."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(
        description="Text, token ids, or a list of either (a batch).")
    max_tokens: int | None = Field(16, ge=0, le=MAX_INT32)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                 description="Return log-probs, with this many alternatives per position.")
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="Not supported beyond 1 or n.")

    @model_validator(mode="after")
    def _completion_only(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported by this server")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of is not supported by this server")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a batch: each item text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt is empty")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    """One chat message; ``content`` may be text or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template expects it (text content, tool fields kept)."""
        content = self.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise ValueError("only text content parts are supported")
            content = "".join(str(part.get("text", "")) for part in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": content or ""}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_INT32)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _tool_choice(self) -> ChatRequest:
        if self.tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice must be 'auto' or 'none': this server returns tool calls as text")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def token_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
