"""OpenEnv's protocol on the env service: every served env at ``/openenv/{env_id}`` (``install_openenv``).

OpenEnv (``pip install openenv``, 0.10) is the environment interface that TRL, SkyRL, torchforge and
others speak. Its clients take a base URL and open one WebSocket per episode stream at
``{base_url}/ws``; so ``GenericEnvClient(base_url="http://host:8000/openenv/maze-v0")`` plays
``maze-v0`` on an agentgym service unchanged. Routes under ``/openenv/{env_id}``:

    WS   /ws         one session per connection: {"type": "reset"|"step"|"state"|"close", "data": ...}
    POST /reset      a fresh env's first observation (stateless, as OpenEnv's HTTP reset)
    POST /step       refused with 409: an episode needs a session, i.e. the WebSocket
    GET  /state      the state of a fresh env (stateless)
    GET  /schema     JSON schemas of the action, observation and state
    GET  /metadata   name, description, version
    GET  /health     {"status": "healthy"}

OpenEnv's Task API, under the same base (and, as OpenEnv's servers name it, under ``{base}/{env_id}``:
``/openenv/maze-v0/maze-v0/splits`` and ``/openenv/maze-v0/splits`` are the same route):

    GET  /list_environments   [env_id]
    GET  /splits              [{"name", "type", "size", "description"}]; type is train, test or validation
    POST /num_tasks           {"split"} -> {"num_tasks": n}, null for a procedural (unbounded) split
    POST /task                {"split", "index"} -> {"task": {...}} (``Env.task``); 400 for a bad index
    POST /tasks               {"split"} -> {"tasks": [...], "env_name"}, at most ``MAX_LISTED_TASKS``
    POST /task_range          {"split", "start", "stop"} -> {"tasks": [...]}; a procedural split needs a stop

and a reset's ``data`` may name ``split`` and ``index`` to start that task.

Messages (OpenEnv's shapes): reset ``data`` may hold ``seed``, ``episode_id`` and agentgym's
``options``; step ``data`` is the action, ``{"action": "<text>"}``. Answers are
``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": bool}}``, where the
observation holds ``text``, ``info`` (privileged keys such as ``answer`` included, as on agentgym's
own routes: keep them out of prompts), ``terminated``, ``truncated`` and ``turn``;
``{"type": "state", "data": {...}}``; or ``{"type": "error", "data": {"message", "code", "type"}}``
with OpenEnv's error codes. A WebSocket session is an ordinary service session: capacity, idle
reaping and the step timeout apply; it is deleted when the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, WebSocket, WebSocketDisconnect
from fastapi.requests import HTTPConnection
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import agentgym
from agentgym.errors import (
    AgentGymError,
    ConfigError,
    EnvContractError,
    RemoteTimeout,
    SessionCapacityError,
)
from agentgym.http.sessions import Session, SessionStore
from agentgym.http.wire import MAX_ACTION_CHARS, JsonObject
from agentgym.registry import spec as lookup_spec
from agentgym.service_kit.responses import error_payload, error_responses, json_response


class OpenEnvAction(BaseModel):
    """The action of every agentgym env on OpenEnv's protocol."""

    model_config = ConfigDict(extra="forbid", strict=True)
    action: str = Field(max_length=MAX_ACTION_CHARS, description="The action text, e.g. 'up' or a tool call.")


class OpenEnvReset(BaseModel):
    """``data`` of a reset message (OpenEnv's ``ResetRequest`` plus agentgym's ``options``).

    ``split`` and ``index`` (OpenEnv's ``reset(split=..., index=...)``) start task ``index`` of a task split.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    episode_id: str | None = Field(default=None, max_length=256)
    options: JsonObject | None = None
    split: str | None = Field(default=None, max_length=256)
    index: int | None = Field(default=None, ge=0, lt=2**63)

    def reset_options(self) -> dict[str, Any] | None:
        """``options`` with ``split``/``index`` folded in (the env's Task API reads them there)."""
        if self.split is None and self.index is None:
            return self.options
        return {**(self.options or {}), "split": self.split, "index": self.index}


class TaskQuery(BaseModel):
    """The body of OpenEnv's Task API requests: a split, and an index or a ``[start, stop)`` range."""

    model_config = ConfigDict(extra="forbid", strict=True)
    split: str = Field(max_length=256)
    index: int | None = Field(default=None, ge=0, lt=2**63)
    start: int | None = Field(default=None, ge=0, lt=2**63)
    stop: int | None = Field(default=None, ge=0, lt=2**63)


#: At most this many tasks in one task list (OpenEnv lets a long or unbounded split answer with a preview;
#: ``num_tasks`` still says how many there are).
MAX_LISTED_TASKS = 1000


class OpenEnvObservation(BaseModel):
    """The observation of every agentgym env on OpenEnv's protocol (``reward``/``done`` travel beside it)."""

    text: str = Field(description="The observation text.")
    info: dict[str, Any] = Field(description="The env's info dict (state_key, admissible_actions, ...).")
    terminated: bool
    truncated: bool
    turn: int


class OpenEnvState(BaseModel):
    episode_id: str | None = None
    step_count: int = 0
    env_id: str
    episode_seed: int | None = None
    episode_over: bool = True


def _split_type(name: str) -> str:
    """OpenEnv's split type: ``train`` and ``test`` by name, every other split ``validation``."""
    return name if name in ("train", "test") else "validation"


def _observation(text: str, info: dict[str, Any], reward: float | None, terminated: bool, truncated: bool,
                 turn: int) -> dict[str, Any]:
    return {"observation": {"text": text, "info": info, "terminated": terminated, "truncated": truncated,
                            "turn": turn},
            "reward": reward, "done": terminated or truncated}


def _error(code: str, exc: BaseException | str) -> str:
    kind = type(exc).__name__ if isinstance(exc, BaseException) else "RequestRejected"
    return json.dumps({"type": "error", "data": {"message": str(exc), "code": code, "type": kind}})


class Coalescer:
    """Runs the env calls of many WebSocket sessions that arrive in the same event-loop turn in one
    trip to the store's thread pool, as ``/batch/step`` does for one request.

    One thread hop per message would cost more than a cheap env's step; gathering the calls that
    are ready together keeps env code off the event loop at the batch route's cost per step. The
    store's step timeout covers the trip: past it, the call running then poisons its session and
    the calls not yet started fail with ``RemoteTimeout`` without running.
    """

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.pending: list[tuple[Session, Any, asyncio.Future[Any]]] = []

    async def run(self, session: Session, fn: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)  # after every handler made ready in this turn has added its call
        self.pending.append((session, fn, future))
        return await future

    def _flush(self) -> None:
        items, self.pending = self.pending, []
        asyncio.get_running_loop().create_task(self._run(items))

    async def _run(self, items: list[tuple[Session, Any, asyncio.Future[Any]]]) -> None:
        outcomes: list[tuple[bool, Any] | None] = [None] * len(items)
        started: list[int] = []

        def run_all() -> None:
            for index, (_, fn, _) in enumerate(items):
                if timed_out:
                    return
                started.append(index)
                try:
                    outcomes[index] = (True, fn())
                except BaseException as exc:  # noqa: BLE001 - handed to that session's handler
                    outcomes[index] = (False, exc)

        def unfinished() -> list[Session]:
            nonlocal timed_out
            timed_out = True
            return [items[i][0] for i in started if outcomes[i] is None]

        timed_out = False
        try:
            await self.store.run(None, run_all, unfinished=unfinished)
        except RemoteTimeout as exc:
            for index, outcome in enumerate(list(outcomes)):
                if outcome is None:
                    outcomes[index] = (False, RemoteTimeout(f"{exc}; this call was not run"
                                                            if index not in started else str(exc)))
        except BaseException as exc:  # noqa: BLE001 - the pool is gone (shutdown): every caller hears it
            outcomes = [(False, exc) for _ in items]
        for (_, _, future), outcome in zip(items, outcomes, strict=True):
            if future.done():
                continue
            ok, value = outcome  # type: ignore[misc]
            future.set_result(value) if ok else future.set_exception(value)


def install_openenv(app: FastAPI, store: SessionStore, *, token: str | None, max_message_bytes: int) -> None:
    """Add the ``/openenv/{env_id}/...`` routes to an env service app (see the module docstring)."""
    app.state.openenv = OpenEnvService(store, token=token, max_message_bytes=max_message_bytes)
    tags, some = ["openenv"], error_responses
    app.get("/openenv", tags=tags, responses=some(401))(openenv_envs)
    app.get("/openenv/{env_id:path}/health", tags=tags, responses=some(401, 404))(openenv_health)
    app.get("/openenv/{env_id:path}/metadata", tags=tags, responses=some(401, 404))(openenv_metadata)
    app.get("/openenv/{env_id:path}/schema", tags=tags, responses=some(401, 404))(openenv_schema)
    app.get("/openenv/{env_id:path}/state", tags=tags, responses=some(401, 404))(openenv_state)
    app.post("/openenv/{env_id:path}/reset", tags=tags,
             responses=some(401, 404, 413, 422, 500, 503, 504))(openenv_reset)
    app.get("/openenv/{env_id:path}/list_environments", tags=tags,
            responses=some(401, 404))(openenv_list_environments)
    app.get("/openenv/{env_id:path}/splits", tags=tags, responses=some(401, 404, 503))(openenv_splits)
    app.post("/openenv/{env_id:path}/num_tasks", tags=tags,
             responses=some(401, 404, 422, 503))(openenv_num_tasks)
    app.post("/openenv/{env_id:path}/task", tags=tags, responses=some(400, 401, 404, 422, 503))(openenv_task)
    app.post("/openenv/{env_id:path}/tasks", tags=tags, responses=some(401, 404, 422, 503))(openenv_tasks)
    app.post("/openenv/{env_id:path}/task_range", tags=tags,
             responses=some(401, 404, 422, 503))(openenv_task_range)
    app.post("/openenv/{env_id:path}/step", tags=tags, responses=some(401, 404, 409))(openenv_step)
    app.websocket("/openenv/{env_id:path}/ws")(openenv_ws)


class OpenEnvService:
    """What the OpenEnv routes share: the service's session store, the coalescer of WebSocket steps, the
    bearer token a WebSocket must send and the largest message. The app keeps it as ``app.state.openenv``;
    routes reach it through ``Depends(openenv_service)``."""

    def __init__(self, store: SessionStore, *, token: str | None, max_message_bytes: int) -> None:
        self.store = store
        self.expected = b"Bearer " + token.encode() if token else None
        self.coalescer = Coalescer(store)
        self.max_message_bytes = max_message_bytes

    def served(self, env_id: str) -> None:
        """Raise ``UnknownEnv`` unless this service serves ``env_id``."""
        self.store.check_served(env_id)
        lookup_spec(env_id)

    def task_env(self, path: str) -> str:
        """The env id of a Task API route: ``{env_id}`` or OpenEnv's ``{env_id}/{env_name}`` (the same id)."""
        half = (len(path) - 1) // 2
        if len(path) % 2 == 1 and path[half] == "/" and path[:half].lower() == path[half + 1:].lower():
            path = path[:half]
        self.served(path)
        return path

    async def with_env(self, env_id: str, query: Any) -> Any:
        """``query`` over a fresh env made with default arguments, off the event loop."""
        def call() -> Any:
            with agentgym.make(env_id) as env:
                return query(env)

        return await self.store.run(None, call)


async def openenv_service(connection: HTTPConnection) -> OpenEnvService:
    """The ``OpenEnvService`` of the app serving a request or WebSocket (a FastAPI dependency; ``async`` so
    that FastAPI calls it on the event loop, not in a worker thread)."""
    return connection.app.state.openenv


OpenEnv = Annotated[OpenEnvService, Depends(openenv_service)]


async def openenv_envs(service: OpenEnv) -> Response:
    ids = service.store.allowed_env_ids or [s.id for s in agentgym.list_envs()]
    return json_response([{"env_id": i, "base_path": f"/openenv/{i}"} for i in ids])


async def openenv_health(env_id: str, service: OpenEnv) -> Response:
    service.served(env_id)
    return json_response({"status": "healthy"})


async def openenv_metadata(env_id: str, service: OpenEnv) -> Response:
    service.served(env_id)
    spec = lookup_spec(env_id)
    return json_response({"name": spec.id, "description": spec.description,
                          "version": agentgym.__version__, "readme_content": None, "author": None,
                          "documentation_url": None})


async def openenv_schema(env_id: str, service: OpenEnv) -> Response:
    service.served(env_id)
    return json_response({"action": OpenEnvAction.model_json_schema(),
                          "observation": OpenEnvObservation.model_json_schema(),
                          "state": OpenEnvState.model_json_schema()})


async def openenv_state(env_id: str, service: OpenEnv) -> Response:
    service.served(env_id)
    return json_response(OpenEnvState(env_id=env_id).model_dump())


async def openenv_reset(env_id: str, service: OpenEnv, body: OpenEnvReset | None = None) -> Response:
    body = body or OpenEnvReset()
    store = service.store
    session = await store.create(env_id, {}, None)
    try:
        async with session.lock:
            obs, info = await store.run(
                session, lambda: session.env.reset(seed=body.seed, options=body.reset_options()))
    finally:
        await store.delete(session.session_id)
    return json_response(_observation(obs, info, None, False, False, 0))


# --- OpenEnv's Task API -----------------------------------------------------------------------------


def _split_named(env: Any, name: str) -> Any:
    for split in env.task_splits():
        if split.name == name:
            return split
    valid = ", ".join(repr(s.name) for s in env.task_splits())
    raise ConfigError(f"{env.spec.id if env.spec else 'the env'} has no task split {name!r}; "
                      f"its splits: {valid}")


def _tasks_of(env: Any, name: str, start: int | None, stop: int | None) -> list[dict[str, Any]]:
    split = _split_named(env, name)
    start = start or 0
    if stop is None:
        if split.size is None:
            raise ConfigError(f"split {name!r} is procedural (unbounded): give task_range a stop")
        stop = split.size
    stop = min(stop, split.size) if split.size is not None else stop
    if stop - start > MAX_LISTED_TASKS:
        stop = start + MAX_LISTED_TASKS
    return [env.task(name, i) for i in range(start, max(start, stop))]


async def openenv_list_environments(env_id: str, service: OpenEnv) -> Response:
    return json_response([service.task_env(env_id)])


async def openenv_splits(env_id: str, service: OpenEnv) -> Response:
    env_id = service.task_env(env_id)
    splits = await service.with_env(env_id, lambda env: env.task_splits())
    return json_response([{"name": s.name, "type": _split_type(s.name), "size": s.size,
                           "description": s.description} for s in splits])


async def openenv_num_tasks(env_id: str, body: TaskQuery, service: OpenEnv) -> Response:
    env_id = service.task_env(env_id)
    split = await service.with_env(env_id, lambda env: _split_named(env, body.split))
    return json_response({"num_tasks": split.size})


async def openenv_task(env_id: str, body: TaskQuery, service: OpenEnv) -> Response:
    env_id = service.task_env(env_id)
    if body.index is None:
        raise ConfigError("a task request needs an index: {\"split\": ..., \"index\": i}")
    try:
        task = await service.with_env(env_id, lambda env: env.task(body.split, body.index))
    except ConfigError as exc:  # OpenEnv answers a bad index with 400
        return json_response(error_payload("ConfigError", str(exc)), status=400)
    return json_response({"task": task})


async def openenv_tasks(env_id: str, body: TaskQuery, service: OpenEnv) -> Response:
    env_id = service.task_env(env_id)

    def preview(env: Any) -> list[dict[str, Any]]:
        split = _split_named(env, body.split)
        return _tasks_of(env, body.split, 0, split.size if split.size is not None else MAX_LISTED_TASKS)

    return json_response({"tasks": await service.with_env(env_id, preview), "env_name": env_id})


async def openenv_task_range(env_id: str, body: TaskQuery, service: OpenEnv) -> Response:
    env_id = service.task_env(env_id)
    tasks = await service.with_env(env_id, lambda env: _tasks_of(env, body.split, body.start, body.stop))
    return json_response({"tasks": tasks})


async def openenv_step(env_id: str, service: OpenEnv) -> Response:
    service.served(env_id)
    raise EnvContractError("an episode needs a session: OpenEnv's HTTP /step acts on a fresh env that "
                           f"was never reset; open the WebSocket /openenv/{env_id}/ws (one session per "
                           "connection), or use agentgym's /sessions routes")


# --- the WebSocket session --------------------------------------------------------------------------


async def openenv_ws(websocket: WebSocket, env_id: str, service: OpenEnv) -> None:
    if service.expected is not None:
        given = dict(websocket.scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, service.expected):
            await websocket.close(code=1008, reason="missing or wrong bearer token")
            return
    await websocket.accept()
    store = service.store
    try:
        session = await store.create(env_id, {}, None)
    except AgentGymError as exc:
        # Answered to the client's first message (its reply is what a client reads), then closed.
        code = "CAPACITY_REACHED" if isinstance(exc, SessionCapacityError) else "FACTORY_ERROR"
        with contextlib.suppress(WebSocketDisconnect, asyncio.TimeoutError):
            await asyncio.wait_for(websocket.receive_text(), timeout=10.0)
            await websocket.send_text(_error(code, exc))
        await websocket.close()
        return
    try:
        await _serve_messages(websocket, service, session)
    except WebSocketDisconnect:
        pass
    finally:
        if store.sessions.get(session.session_id) is session:
            await store.delete(session.session_id)


async def _serve_messages(websocket: WebSocket, service: OpenEnvService, session: Session) -> None:
    """Answer the session's messages until the client sends ``close`` or goes away."""
    max_bytes = service.max_message_bytes
    episode_id: str | None = None
    while True:
        raw = await websocket.receive_text()
        if len(raw) > max_bytes:
            await websocket.send_text(_error("VALIDATION_ERROR", f"message of {len(raw)} characters "
                                                                 f"exceeds the limit of {max_bytes}"))
            continue
        try:
            message = json.loads(raw)
            kind = message.get("type") if isinstance(message, dict) else None
        except ValueError as exc:
            await websocket.send_text(_error("INVALID_JSON", f"invalid JSON: {exc}"))
            continue
        if kind == "close":
            return
        try:
            service.store.get(session.session_id)  # reaped or poisoned meanwhile: the error says so
            answer, episode_id = await _answer(service, session, kind, message.get("data") or {}, episode_id)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            await websocket.send_text(_error("VALIDATION_ERROR", f"malformed {kind} data: {problems}"))
            continue
        except AgentGymError as exc:
            await websocket.send_text(_error("EXECUTION_ERROR", exc))
            continue
        if answer is None:
            await websocket.send_text(_error("UNKNOWN_TYPE", f"unknown message type {kind!r}; "
                                                             "send reset, step, state or close"))
            continue
        await websocket.send_text(json.dumps(answer, separators=(",", ":")))  # ASCII: any text encodes


async def _answer(service: OpenEnvService, session: Session, kind: Any, data: Any,
                  episode_id: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The answer to one ``step``/``reset``/``state`` message (``None`` for another type) and the episode id
    from then on (a reset's ``episode_id``)."""
    if kind == "step":
        action = data.get("action") if isinstance(data, dict) and len(data) == 1 else None
        if not isinstance(action, str) or len(action) > MAX_ACTION_CHARS:
            action = OpenEnvAction.model_validate(data).action  # the exact validation error
        async with session.lock:
            obs, reward, terminated, truncated, info = await service.coalescer.run(
                session, lambda: session.env.step(action))
        return {"type": "observation",
                "data": _observation(obs, info, reward, terminated, truncated, session.env.turn)}, episode_id
    if kind == "reset":
        request = OpenEnvReset.model_validate(data)
        async with session.lock:
            obs, info = await service.store.run(
                session, lambda: session.env.reset(seed=request.seed, options=request.reset_options()))
        answer = {"type": "observation", "data": _observation(obs, info, None, False, False, 0)}
        return answer, request.episode_id
    if kind == "state":
        env = session.env
        return {"type": "state", "data": {"episode_id": episode_id, "step_count": env.turn,
                                          "env_id": session.env_id, "episode_seed": env.episode_seed,
                                          "episode_over": env.episode_over}}, episode_id
    return None, episode_id
