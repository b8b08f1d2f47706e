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

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

MAX_N = 16
MAX_TOP_LOGPROBS = 20
#: Seeds are below this (torch seeds generators with 64-bit integers; n samples of a seeded request
#: use seed, seed+1, ...). A power of two, so the OpenAPI schema states it exactly.
SEED_LIMIT = 2**63
#: Token ids, ``top_k`` and ``max_tokens`` are 32-bit in every tokenizer and sampler this serves.
MAX_INT32 = 2**31 - 1

TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
StopString = Annotated[str, Field(min_length=1)]


class _Request(BaseModel):
    # Unknown fields (user, metadata, ...) are ignored as OpenAI's own API ignores most of them.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="Served model name (GET /v1/models).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=MAX_INT32, description="vLLM extension; 0 or -1 disables it.")
    n: int = Field(1, ge=1, le=MAX_N, description="Samples per prompt.")
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = Field(
        None, description="Up to 4 stop sequences (excluded from the text).")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT,
                             description="Seeds this request's sampling (reproducible).")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = Field(False, description="vLLM extension: add token_ids / prompt_token_ids.")
    include_stop_str_in_output: bool = Field(False,
                                             description="vLLM extension: keep the stop string in the text.")
    return_tokens_as_token_ids: bool = Field(False,
                                             description="vLLM extension: log-prob tokens as 'token_id:N'.")
    # Fields this server does not implement: the schema admits only their neutral value.
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Not supported: only 0 is accepted.")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="Not supported: only 0 is accepted.")
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, max_length=0, description="Not supported: only empty is accepted.")

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        stops = [value] if isinstance(value, str) else value
        if isinstance(stops, list) and (len(stops) > 4 or any(s == "" for s in stops)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @field_validator("presence_penalty", "frequency_penalty", "logit_bias", mode="before")
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        # Before the bounds, so that the message says why only the neutral value passes.
        if value and not isinstance(value, str):
            hint = "" if info.field_name == "logit_bias" else "; leave it at 0"
            raise ValueError(f"{info.field_name} is not supported by this server{hint}")
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

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
    echo: Literal[False] = Field(False, description="Not supported: only false is accepted.")
    suffix: str | None = Field(None, max_length=0, description="Not supported: only empty is accepted.")
    best_of: int | None = Field(None, ge=1, le=1,
                                description="Not supported: only 1 (or n, as vLLM takes it).")

    @field_validator("echo", "suffix", "best_of", mode="before")
    @classmethod
    def _completion_only(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name == "best_of":
            if value is not None and value == info.data.get("n"):
                return None  # best_of = n: what this server does anyway
            neutral = value in (None, 1)
        else:
            neutral = not value
        if not neutral:
            raise ValueError(f"{info.field_name} is not supported by this server")
        return value

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
    tool_choice: Literal["none", "auto"] | None = Field(
        None, description="'auto' or 'none': tool calls come back as text, for the client to parse.")
    max_tokens: int | None = Field(None, ge=0, le=MAX_INT32)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none", "auto"):
            raise ValueError("tool_choice must be 'auto' or 'none': this server returns tool calls as text")
        return value

    @model_validator(mode="after")
    def _top_logprobs(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def token_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
