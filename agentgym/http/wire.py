"""The HTTP wire format: pydantic models for every request and response body of the env service.

Requests forbid unknown fields (a typo is a 422 that names the field, not a silently ignored
option). This module, with the error body and integer fields every service shares
(``agentgym.service_kit.wire``), is where the env service validates untrusted data.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agentgym.service_kit.wire import ErrorBody, whole_number

#: Longest action string a request may carry (characters).
MAX_ACTION_CHARS = 100_000
#: Most items one batched request may carry.
MAX_BATCH_ITEMS = 4096
#: Deepest nesting of lists/dicts allowed in ``options`` and ``kwargs`` (env code deep-copies them,
#: and a pathological depth would exhaust the recursion limit there, not here).
MAX_JSON_DEPTH = 32


def _depth_ok(value: Any) -> Any:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nests too deep (more than {MAX_JSON_DEPTH} levels of lists/objects)")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return value


#: A JSON object of bounded depth (env options and constructor arguments).
JsonObject = Annotated[dict[str, Any], AfterValidator(_depth_ok)]
#: Seeds are below this bound (unsigned 63-bit, as the service draws them). A power of two, so a
#: float carries it exactly (OpenAPI tooling turns bounds into floats).
SEED_BOUND = 2**63


#: An episode seed: a whole number in [0, SEED_BOUND).
Seed = whole_number(ge=0, lt=SEED_BOUND)


class _Request(BaseModel):
    # strict: "3" is not a seed and true is not 1; a client sending them has a bug worth a 422.
    # Integer fields are ``whole_number``s (``agentgym.service_kit.wire``): 3.0 is a JSON integer and is
    # accepted as 3.
    model_config = ConfigDict(extra="forbid", strict=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSessionRequest(_Request):
    env_id: str = Field(description="A registered env id, e.g. 'maze-v0'.", examples=["maze-v0"])
    kwargs: JsonObject = Field(default_factory=dict, description="Constructor arguments for the env.")
    max_turns: whole_number(ge=1, le=1_000_000) | None = Field(  # type: ignore[valid-type]
        default=None, description="Override the spec's turn budget.")


class SessionInfo(_Response):
    session_id: str
    env_id: str
    max_turns: int | None
    turn: int = Field(description="Steps taken in the current episode.")
    episode_over: bool = Field(description="True before the first reset and after the episode ended.")
    episode_seed: int | None
    has_expert: bool
    supports_snapshot: bool
    idle_s: float = Field(description="Seconds since the last request touched the session.")


class ResetRequest(_Request):
    seed: Seed | None = Field(default=None, description="Episode seed; none draws one.")  # type: ignore[valid-type]
    options: JsonObject | None = Field(default=None, description="Env options, e.g. {'task_id': ...}.")


class ResetResponse(_Response):
    observation: str
    info: dict[str, Any]
    episode_seed: int = Field(description="The seed used (drawn by the service when none was sent).")


class StepRequest(_Request):
    action: str = Field(max_length=MAX_ACTION_CHARS, examples=["up"])


class StepResponse(_Response):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    turn: int


class ForkRequest(_Request):
    mode: Literal["auto", "snapshot", "replay"] = "auto"


class ExpertResponse(_Response):
    action: str | None = Field(description="The expert's action in the current state, or null.")


class BatchStepItem(_Request):
    session_id: str
    action: str = Field(max_length=MAX_ACTION_CHARS)


class BatchStepRequest(_Request):
    """Steps of many sessions. A session may appear only once per batch (its steps are ordered):
    a batch naming one twice is rejected whole with 422."""

    steps: list[BatchStepItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS,
                                       description="One step per session; session ids must be distinct.")


class BatchResetItem(_Request):
    session_id: str
    seed: Seed | None = None  # type: ignore[valid-type]
    options: JsonObject | None = None


class BatchResetRequest(_Request):
    """Resets of many sessions. A session may appear only once per batch: a batch naming one twice
    is rejected whole with 422."""

    resets: list[BatchResetItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS,
                                         description="One reset per session; session ids must be distinct.")


class BatchForkItem(_Request):
    session_id: str
    mode: Literal["auto", "snapshot", "replay"] = "auto"


class BatchForkRequest(_Request):
    forks: list[BatchForkItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class BatchForkResponse(_Response):
    """One entry per request item, in order: the new session (``SessionInfo``) or an ``ErrorBody``."""

    results: list[SessionInfo | ErrorBody]


class BatchStepResponse(_Response):
    """One entry per request item, in order: a ``StepResponse`` or an ``ErrorBody``."""

    results: list[StepResponse | ErrorBody]


class BatchResetResponse(_Response):
    results: list[ResetResponse | ErrorBody]


class EnvSummary(_Response):
    id: str
    description: str
    max_turns: int | None


class EnvDetail(EnvSummary):
    entry_point: str
    kwargs: dict[str, Any]
    action_format: Literal["plain", "tag", "raw"] | None = Field(
        default=None, description="How a policy's reply becomes an action for this env (None: plain).")
    schemas: dict[str, Any] = Field(description="JSON schemas of the reset/step request and response bodies.")


class Health(_Response):
    """``ok``; ``degraded`` (HTTP 200) when some worker threads are stuck in env calls past their
    deadline but others still run calls; ``unavailable`` (HTTP 503) when every one is stuck."""

    status: Literal["ok", "degraded", "unavailable"]
    version: str
    active_sessions: int
    max_sessions: int
    envs: list[str]
    workers: int = Field(description="Threads that run env calls (num_workers).")
    stuck_workers: int = Field(description="Threads still inside env calls that ran past the step timeout.")
    available_workers: int = Field(
        description="Threads not stuck (spares stand in for stuck ones, boundedly).")
    queued_calls: int = Field(description="Env calls waiting for a thread.")
