"""The env service: ``create_app`` builds the FastAPI app that serves registered envs over HTTP.

Routes (all bodies JSON; every error is ``{"error": {"type", "message"}}``):

    GET    /health                    liveness + capacity
    GET    /envs                      registered (or served) env ids
    GET    /envs/{env_id}             spec and request/response JSON schemas
    GET    /envs/{env_id}/tasks       its task splits (the env made with default arguments)
    GET    /envs/{env_id}/tasks/{split}/{index}   one task of a split, described (``Env.task``)
    POST   /sessions                  create a session → session_id
    GET    /sessions/{id}             session state
    DELETE /sessions/{id}             close it
    POST   /sessions/{id}/reset       {seed?, options?} → observation, info, episode_seed
    POST   /sessions/{id}/step        {action} → observation, reward, terminated, truncated, info
    POST   /sessions/{id}/fork        {mode?} → a new session in the same state
    POST   /sessions/{id}/expert      the expert's action in the current state
    GET    /sessions/{id}/tasks[/{split}/{index}]   the same for a session's env (made with its kwargs)
    POST   /batch/step                many sessions' steps in one request (per-item results)
    POST   /batch/reset               many sessions' resets in one request
    POST   /batch/fork                fork many sessions in one request (a new session each)
    GET    /metrics                   Prometheus text
    GET    /docs, /openapi.json       from FastAPI
    *      /openenv/{env_id}/...      OpenEnv's protocol (WebSocket /ws sessions; agentgym.http.openenv)

Status codes: 401 bad token, 404 unknown env/session, 409 step before reset / after the end,
413 body too large, 422 malformed request, 500 the env crashed (that session only), 503 at
capacity or no env worker free within the step timeout (with Retry-After; nothing was done), 504 a
step outlived the step timeout (counted from when it started; the session is then poisoned).
``/health`` answers 200 ``ok`` or ``degraded`` (some worker threads stuck), 503 ``unavailable``
(every worker thread stuck).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from pydantic import TypeAdapter

import agentgym
from agentgym.errors import (
    AgentGymError,
    ConfigError,
    EnvCrashed,
    RemoteTimeout,
    RequestRejected,
    ResetNeeded,
    SessionCapacityError,
)
from agentgym.guard import EpisodeGuard
from agentgym.http import wire
from agentgym.http.fastpath import HotRoute, HotRoutes
from agentgym.http.metrics import ServiceMetrics
from agentgym.http.openenv import install_openenv
from agentgym.http.sessions import Session, SessionStore
from agentgym.registry import list_envs, load_env_creator
from agentgym.registry import spec as lookup_spec
from agentgym.service_kit.guard import GuardMiddleware
from agentgym.service_kit.responses import (
    TELEMETRY_OFF,
    ErrorResponses,
    error_payload,
    error_responses,
    json_response,
    keep_integer_bounds,
    text_responses,
)

logger = logging.getLogger(__name__)

def create_app(
    env_ids: list[str] | None = None,
    *,
    max_sessions: int = 1024,
    ttl_s: float = 600.0,
    step_timeout_s: float | None = 60.0,
    num_workers: int = 8,
    token: str | None = None,
    max_body_bytes: int = 8 * 1024 * 1024,
    max_spare_workers: int | None = None,
) -> GuardMiddleware:
    """Build the env service app.

    Args:
        env_ids: envs this service serves (``None`` or empty: every registered env). Unknown ids,
            and ids whose module fails to import, raise here rather than on the first request.
        max_sessions: capacity; creating one more answers 503 with ``Retry-After``.
        ttl_s: sessions idle longer than this are closed by the reaper.
        step_timeout_s: deadline for one reset/step/fork; past it the request gets 504 and the
            session is poisoned. ``None`` disables it.
        num_workers: threads that run env code.
        max_spare_workers: threads that may stand in for ones stuck in calls past the step timeout
            (default ``num_workers``).
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413.

    Returns:
        The ASGI app to give uvicorn: the FastAPI app behind ``GuardMiddleware``, which passes
        attribute access (``routes``, ``state.store``...) through to the FastAPI app.

    Raises:
        UnknownEnv, VersionNotFound, RegistryError: an id in ``env_ids`` cannot be served.
        ConfigError: a limit is out of range (the message names it).

    Example:
        >>> app = create_app(["maze-v0"], max_sessions=8)
        >>> sorted(r.path for r in app.routes if r.path.startswith("/sessions/{"))[:2]
        ['/sessions/{session_id}', '/sessions/{session_id}']
    """
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be an integer >= 1, got {max_body_bytes!r}")
    env_ids = list(env_ids) if env_ids else None
    if env_ids is not None:
        for env_id in env_ids:
            # Fail at start-up, with suggestions, not on the first request.
            load_env_creator(lookup_spec(env_id))
    store = SessionStore(
        max_sessions=max_sessions, ttl_s=ttl_s, step_timeout_s=step_timeout_s,
        num_workers=num_workers, allowed_env_ids=env_ids, max_spare_workers=max_spare_workers,
    )
    service = EnvService(store, ServiceMetrics(store), env_ids)
    app = FastAPI(
        title="agentgym env service",
        version=agentgym.__version__,
        description="Text environments over HTTP. Every error body is {\"error\": {\"type\", \"message\"}}.",
        lifespan=_lifespan,
        **TELEMETRY_OFF,
    )
    app.state.store = store
    keep_integer_bounds(app)
    app.state.metrics = service.metrics
    app.state.service = service
    answers = ErrorResponses(service.metrics.errors)
    answers.install(app)
    _add_routes(app)
    install_openenv(app, store, token=token, max_message_bytes=max_body_bytes)  # OpenEnv's protocol too
    hot = service.hot_routes(answers)
    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes, hot_routes=hot)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    store: SessionStore = app.state.store
    store.start()
    yield
    await store.stop()


class EnvService:
    """What the env service's routes share: the session store, the metrics and the served env ids
    (``None``: every registered env). The app keeps it as ``app.state.service``; routes reach it through
    ``Depends(env_service)``, and the hot routes (``HotRoutes``) call its ``reset``/``step``/``batch_*``."""

    def __init__(self, store: SessionStore, metrics: ServiceMetrics, env_ids: list[str] | None) -> None:
        self.store, self.metrics, self.env_ids = store, metrics, env_ids

    def hot_routes(self, answers: ErrorResponses) -> HotRoutes:
        """The plain-ASGI fast path of the step and reset routes, answering as their FastAPI routes do."""
        return HotRoutes(
            session_routes={
                "step": HotRoute(TypeAdapter(wire.StepRequest), True, self.step),
                "reset": HotRoute(TypeAdapter(wire.ResetRequest | None), False, self.reset),
            },
            batch_routes={
                "/batch/step": HotRoute(TypeAdapter(wire.BatchStepRequest), True, self.batch_step),
                "/batch/reset": HotRoute(TypeAdapter(wire.BatchResetRequest), True, self.batch_reset),
            },
            errors=answers,
        )

    # --- the hot routes' work, shared by their FastAPI endpoints and HotRoutes ----------------------

    async def reset(self, session_id: str, body: wire.ResetRequest | None) -> Response:
        seed, options = (body.seed, body.options) if body is not None else (None, None)
        session = self.store.get(session_id)
        async with session.lock:
            self.store.check_live(session)
            payload = await self.store.run(session, lambda: _reset(session, seed, options))
        self.metrics.resets.inc()
        return json_response(payload)

    async def step(self, session_id: str, body: wire.StepRequest) -> Response:
        session = self.store.get(session_id)
        started = time.perf_counter()
        async with session.lock:
            self.store.check_live(session)
            payload = await self.store.run(session, lambda: _step(session, body.action))
        self.metrics.observe_steps(1, time.perf_counter() - started)
        return json_response(payload)

    async def batch_step(self, body: wire.BatchStepRequest) -> Response:
        items = [(item.session_id, item.action) for item in body.steps]
        started = time.perf_counter()
        results = await _run_batch(self.store, items, _step)
        stepped = sum(1 for r in results if "error" not in r)
        self.metrics.observe_steps(stepped, time.perf_counter() - started, batched=True)
        return json_response({"results": results})

    async def batch_reset(self, body: wire.BatchResetRequest) -> Response:
        items = [(item.session_id, (item.seed, item.options)) for item in body.resets]
        results = await _run_batch(self.store, items, lambda s, arg: _reset(s, *arg))
        self.metrics.resets.inc(sum(1 for r in results if "error" not in r))
        return json_response({"results": results})

    # --- env queries -------------------------------------------------------------------------------

    async def with_default_env(self, env_id: str, query: Callable[[EpisodeGuard], Any]) -> Any:
        """``query`` over a fresh env of ``env_id`` made with its default arguments, off the event loop."""
        self.store.check_served(env_id)

        def call() -> Any:
            with agentgym.make(env_id) as env:
                return query(env)

        return await self.store.run(None, call)

    async def with_session_env(self, session_id: str, query: Callable[[EpisodeGuard], Any]) -> Any:
        """``query`` over a session's env (made with the session's kwargs), between its other calls."""
        session = self.store.get(session_id)
        async with session.lock:
            self.store.check_live(session)
            return await self.store.run(session, lambda: query(session.env))

    async def call_env(self, session: Session, what: str, call: Callable[[Session], Any]) -> Any:
        """``call(session)`` (the env's ``what``: fork, expert_action) between the session's other calls."""
        async with session.lock:
            self.store.check_live(session)
            return await self.store.run(session, lambda: _env_call(session, what, lambda: call(session)))


async def env_service(request: Request) -> EnvService:
    """The ``EnvService`` of the app serving ``request`` (a FastAPI dependency; ``async`` so that FastAPI
    calls it on the event loop, not in a worker thread)."""
    return request.app.state.service


Service = Annotated[EnvService, Depends(env_service)]


def _add_routes(app: FastAPI) -> None:
    """The routes, in the order the app matches them and ``/openapi.json`` lists them.

    The task routes come before ``/envs/{env_id:path}``, whose path parameter would swallow them. The
    routes are added to the app itself, not through an included ``APIRouter``: recent FastAPI keeps an
    included router as one nested route, and the 405 answer's ``Allow`` reads each route's methods.
    """
    some = error_responses
    app.get("/health", response_model=wire.Health,
            responses={503: {"model": wire.Health, "description": "Every worker is stuck."}})(health)
    app.get("/metrics", response_class=Response,
            responses={**text_responses("Prometheus text"), **some(401)})(prometheus)
    app.get("/envs", response_model=list[wire.EnvSummary], responses=some(401))(envs)
    app.get("/envs/{env_id:path}/tasks/{split}/{index}", responses=some(401, 404, 422, 503, 504))(env_task)
    app.get("/envs/{env_id:path}/tasks", responses=some(401, 404, 422, 503, 504))(env_task_splits)
    app.get("/sessions/{session_id}/tasks/{split}/{index}",
            responses=some(401, 404, 422, 503, 504))(session_task)
    app.get("/sessions/{session_id}/tasks", responses=some(401, 404, 503, 504))(session_task_splits)
    app.get("/envs/{env_id:path}", response_model=wire.EnvDetail, responses=some(401, 404))(env_detail)
    app.post("/sessions", status_code=201, response_model=wire.SessionInfo,
             responses=some(401, 404, 413, 422, 500, 503, 504))(create_session)
    app.get("/sessions/{session_id}", response_model=wire.SessionInfo,
            responses=some(401, 404, 500))(get_session)
    app.delete("/sessions/{session_id}", status_code=204, responses=some(401, 404))(delete_session)
    app.post("/sessions/{session_id}/reset", response_model=wire.ResetResponse,
             responses=some(401, 404, 409, 413, 422, 500, 503, 504))(reset)
    app.post("/sessions/{session_id}/step", response_model=wire.StepResponse,
             responses=some(401, 404, 409, 413, 422, 500, 503, 504))(step)
    app.post("/sessions/{session_id}/fork", status_code=201, response_model=wire.SessionInfo,
             responses=some(401, 404, 409, 413, 422, 500, 503, 504))(fork)
    app.post("/sessions/{session_id}/expert", response_model=wire.ExpertResponse,
             responses=some(401, 404, 409, 413, 500, 503, 504))(expert)
    app.post("/batch/step", response_model=wire.BatchStepResponse,
             responses=some(401, 413, 422, 503))(batch_step)
    app.post("/batch/reset", response_model=wire.BatchResetResponse,
             responses=some(401, 413, 422, 503))(batch_reset)
    app.post("/batch/fork", response_model=wire.BatchForkResponse,
             responses=some(401, 413, 422, 503))(batch_fork)


# --- service ---------------------------------------------------------------------------------------


async def health(service: Service) -> Response:
    store = service.store
    stuck, available = store.stuck_workers, store.available_workers
    status = "ok" if stuck == 0 else ("degraded" if available > 0 else "unavailable")
    return json_response({
        "status": status, "version": agentgym.__version__, "active_sessions": len(store.sessions),
        "max_sessions": store.max_sessions, "envs": service.env_ids or [s.id for s in list_envs()],
        "workers": store.executor.num_workers, "stuck_workers": stuck, "available_workers": available,
        "queued_calls": store.executor.queued,
    }, 503 if status == "unavailable" else 200)


async def prometheus(service: Service) -> Response:
    body, content_type = service.metrics.render()
    return Response(body, media_type=content_type)


async def envs(service: Service) -> Response:
    env_ids = service.env_ids
    specs = [lookup_spec(i) for i in env_ids] if env_ids is not None else list_envs()
    return json_response([{"id": s.id, "description": s.description, "max_turns": s.max_turns}
                          for s in specs])


async def env_task(env_id: str, split: str, index: int, service: Service) -> Response:
    """Task ``index`` of ``split`` of the env made with its default arguments (``Env.task``)."""
    return json_response(await service.with_default_env(env_id, lambda env: env.task(split, index)))


async def env_task_splits(env_id: str, service: Service) -> Response:
    """The task splits of the env made with its default arguments (``Env.task_splits``)."""
    return json_response({"splits": await service.with_default_env(env_id, _splits_json)})


async def session_task(session_id: str, split: str, index: int, service: Service) -> Response:
    """Task ``index`` of ``split`` of a session's env (its kwargs may change its tasks)."""
    return json_response(await service.with_session_env(session_id, lambda env: env.task(split, index)))


async def session_task_splits(session_id: str, service: Service) -> Response:
    """The task splits of a session's env."""
    return json_response({"splits": await service.with_session_env(session_id, _splits_json)})


async def env_detail(env_id: str, service: Service) -> Response:
    service.store.check_served(env_id)
    detail = lookup_spec(env_id).to_json()
    detail["schemas"] = {
        name: model.model_json_schema()
        for name, model in (("reset_request", wire.ResetRequest), ("reset_response", wire.ResetResponse),
                            ("step_request", wire.StepRequest), ("step_response", wire.StepResponse))
    }
    return json_response(detail)


# --- sessions --------------------------------------------------------------------------------------


async def create_session(body: wire.CreateSessionRequest, service: Service) -> Response:
    service.store.start()
    session = await service.store.create(body.env_id, body.kwargs, body.max_turns)
    service.metrics.sessions_created.inc()
    return json_response(session.describe(), 201)


async def get_session(session_id: str, service: Service) -> Response:
    return json_response(service.store.get(session_id).describe())


async def delete_session(session_id: str, service: Service) -> Response:
    await service.store.delete(session_id)
    return Response(status_code=204)


async def reset(session_id: str, service: Service, body: wire.ResetRequest | None = None) -> Response:
    return await service.reset(session_id, body)  # served by HotRoutes; declared for /docs and direct use


async def step(session_id: str, body: wire.StepRequest, service: Service) -> Response:
    return await service.step(session_id, body)  # served by HotRoutes; declared for /docs and direct use


async def fork(session_id: str, service: Service, body: wire.ForkRequest | None = None) -> Response:
    mode = body.mode if body is not None else "auto"
    store = service.store
    session = store.get(session_id)
    with store.reserve():  # capacity is held while the fork runs, so concurrent forks cannot overshoot
        child_env = await service.call_env(session, "fork", lambda s: s.env.fork(mode))
        child = store.add(session.env_id, child_env)
    service.metrics.sessions_created.inc()
    return json_response(child.describe(), 201)


async def expert(session_id: str, service: Service) -> Response:
    session = service.store.get(session_id)
    action = await service.call_env(session, "expert_action", lambda s: s.env.expert_action())
    return json_response({"action": action})


# --- batched ---------------------------------------------------------------------------------------


async def batch_step(body: wire.BatchStepRequest, service: Service) -> Response:
    return await service.batch_step(body)  # served by HotRoutes; declared for /docs and direct use


async def batch_reset(body: wire.BatchResetRequest, service: Service) -> Response:
    return await service.batch_reset(body)  # served by HotRoutes; declared for /docs and direct use


async def batch_fork(body: wire.BatchForkRequest, service: Service) -> Response:
    results = await _run_batch_fork(service.store, [(item.session_id, item.mode) for item in body.forks])
    service.metrics.sessions_created.inc(sum(1 for r in results if "error" not in r))
    return json_response({"results": results})


def _reset(session: Session, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """Reset the session's env. A reset the env rejects ends the episode that was running (the env
    may be half reset), and the answer says so; until a reset succeeds, steps say why they cannot run."""
    running = not session.env.episode_over
    turn = session.env.turn
    try:
        obs, info = session.env.reset(seed=seed, options=options)
    except AgentGymError as exc:
        ended = (f"the episode that was running (turn {turn}) has ended" if running
                 else "no episode is running")
        session.reset_failure = f"{type(exc).__name__}: {exc}"
        raise _with_message(exc, f"reset rejected: {exc} -- {ended}; send a reset with valid seed and "
                                 "options to start a new one") from exc
    session.reset_failure = None
    return {"observation": obs, "info": info, "episode_seed": session.env.episode_seed}


def _with_message(exc: AgentGymError, message: str) -> AgentGymError:
    """``exc``'s class with ``message`` (the class is what the client maps back to an exception)."""
    try:
        return type(exc)(message)
    except TypeError:  # a class with a different constructor: keep the original
        return exc


def _env_call(session: Session, what: str, fn: Any) -> Any:
    """Report env code that raises outside ``EpisodeGuard``'s own wrapping (expert, fork) as
    ``EnvCrashed``."""
    try:
        return fn()
    except AgentGymError:
        raise
    except Exception as exc:
        raise EnvCrashed(
            f"{type(session.env.unwrapped).__name__}.{what}() raised {type(exc).__name__}: {exc}"
        ) from exc


def _step(session: Session, action: str) -> dict[str, Any]:
    try:
        obs, reward, terminated, truncated, info = session.env.step(action)
    except ResetNeeded as exc:
        if session.reset_failure is None:
            raise
        raise ResetNeeded(f"step() called before a successful reset(): the last reset was rejected "
                          f"({session.reset_failure}); call reset() with valid options") from exc
    return {"observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
            "info": info, "turn": session.env.turn}


async def _run_batch(store: SessionStore, items: list[tuple[str, Any]], fn: Any) -> list[dict[str, Any]]:
    """Run ``fn(session, arg)`` for every item in one trip to the thread pool.

    Per-item failures (unknown session, episode over, env crash) become per-item error bodies; the
    other items still run. A session may appear only once per batch (its steps are ordered).
    """
    seen: set[str] = set()
    for index, (session_id, _) in enumerate(items):
        if session_id in seen:
            raise RequestRejected(
                f"malformed request: item {index}: session {session_id!r} appears twice in one batch; "
                "send its steps in separate requests"
            )
        seen.add(session_id)
    results: list[dict[str, Any] | None] = [None] * len(items)
    candidates: list[tuple[int, Session, Any]] = []
    for index, (session_id, arg) in enumerate(items):
        try:
            candidates.append((index, store.get(session_id), arg))
        except AgentGymError as exc:
            results[index] = error_payload(type(exc).__name__, str(exc))
    # Locks in one global order (by id): two batches naming the same sessions in opposite orders
    # would otherwise each hold one lock and wait for the other's forever.
    locks = [session.lock for _, session, _ in sorted(candidates, key=lambda c: c[1].session_id)]
    acquired = 0
    try:
        for lock in locks:
            await lock.acquire()
            acquired += 1
        ready: list[tuple[int, Session, Any]] = []
        for index, session, arg in candidates:
            try:
                store.check_live(session)  # poisoned or deleted while this batch waited for its lock
                ready.append((index, session, arg))
            except AgentGymError as exc:
                results[index] = error_payload(type(exc).__name__, str(exc))
        if ready:
            results = await _run_ready(store, ready, fn, results)
    finally:
        for lock in locks[:acquired]:
            lock.release()
    return results  # type: ignore[return-value]


async def _run_batch_fork(store: SessionStore, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Fork every item's session (one trip to the pool); each result is the new session or an error.

    Capacity is reserved for all forks before any runs; items past the capacity answer
    ``SessionCapacityError`` and are not forked.
    """
    with contextlib.ExitStack() as held:
        reserved = 0
        try:
            for _ in items:
                held.enter_context(store.reserve())
                reserved += 1
        except SessionCapacityError:
            pass

        def fork(session: Session, mode: str) -> dict[str, Any]:
            return {"env": _env_call(session, "fork", lambda: session.env.fork(mode)),
                    "env_id": session.env_id}

        results = await _run_batch(store, items[:reserved], fork) if reserved else []
        answers = []
        for result in results:
            if "error" in result:
                answers.append(result)
            else:
                answers.append(store.add(result["env_id"], result["env"]).describe())
    over = [error_payload("SessionCapacityError",
                          f"the service holds its maximum of {store.max_sessions} sessions; "
                          "this fork was not made")
            for _ in items[reserved:]]
    return answers + over


async def _run_ready(store: SessionStore, ready: list[tuple[int, Session, Any]], fn: Any,
                     results: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """Step the ready items in one pool thread under one shared deadline.

    Past the deadline only the item being stepped is poisoned; the items not yet started are
    skipped (their sessions untouched) and answered with ``RemoteTimeout``.
    """
    gate = threading.Lock()
    timed_out = False
    started: set[int] = set()

    def run_all() -> None:
        for index, session, arg in ready:
            with gate:
                if timed_out:
                    return
                started.add(index)
            try:
                results[index] = fn(session, arg)
            except AgentGymError as exc:
                results[index] = error_payload(type(exc).__name__, str(exc))
            except Exception as exc:  # noqa: BLE001 - one item's failure must not sink the others
                results[index] = error_payload("AgentGymError",
                                               f"internal error: {type(exc).__name__}: {exc}")

    def unfinished() -> list[Session]:
        nonlocal timed_out
        with gate:
            timed_out = True
        return [session for index, session, _ in ready if index in started and results[index] is None]

    try:
        await store.run(None, run_all, unfinished=unfinished)
        return results
    except RemoteTimeout as exc:
        final = list(results)  # the stuck thread may still write into ``results``; answer from a copy
        for index, session, _ in ready:
            if session.poisoned is not None:
                final[index] = error_payload("RemoteTimeout", f"{exc}; {session.poisoned}")
            elif final[index] is None:
                final[index] = error_payload(
                    "RemoteTimeout", f"{exc} at an earlier item of this batch; this item was not run")
        return final


def _splits_json(env: EpisodeGuard) -> list[dict[str, Any]]:
    """An env's ``TaskSplit``s as JSON objects (``RemoteEnv.task_splits`` reads them back)."""
    return [dataclasses.asdict(split) for split in env.task_splits()]
