"""The env service: ``create_app`` builds the FastAPI app that serves registered envs over HTTP.

Routes (all bodies JSON; every error is ``{"error": {"type", "message"}}``):

    GET    /health                    liveness + capacity
    GET    /envs                      registered (or served) env ids
    GET    /envs/{env_id}             spec and request/response JSON schemas
    POST   /sessions                  create a session → session_id
    GET    /sessions/{id}             session state
    DELETE /sessions/{id}             close it
    POST   /sessions/{id}/reset       {seed?, options?} → observation, info, episode_seed
    POST   /sessions/{id}/step        {action} → observation, reward, terminated, truncated, info
    POST   /sessions/{id}/fork        {mode?} → a new session in the same state
    POST   /sessions/{id}/expert      the expert's action in the current state
    POST   /batch/step                many sessions' steps in one request (per-item results)
    POST   /batch/reset               many sessions' resets in one request
    GET    /metrics                   Prometheus text
    GET    /docs, /openapi.json       from FastAPI

Status codes: 401 bad token, 404 unknown env/session, 409 step before reset / after the end,
413 body too large, 422 malformed request, 500 the env crashed (that session only), 503 at
capacity (with Retry-After), 504 a step outlived the step timeout.
"""

from __future__ import annotations

import email.message
import hmac
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import agentgym
from agentgym.errors import AgentGymError, EnvCrashed, RemoteTimeout, RequestRejected
from agentgym.http import wire
from agentgym.http.metrics import ServiceMetrics
from agentgym.http.sessions import Session, SessionStore
from agentgym.registry import list_envs
from agentgym.registry import spec as lookup_spec

JSON = "application/json"
BODY_NOT_JSON = "the request body must be a JSON object sent with 'Content-Type: application/json'"

logger = logging.getLogger(__name__)

#: FastAPI's native OpenTelemetry hooks off (FastAPI >= 0.165 has them; older versions lack the
#: argument). They cost a provider lookup per request even with no OpenTelemetry configured.
_TELEMETRY_OFF: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters else {}
)


def _dumps(payload: Any) -> bytes:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from an action): escape it as \udXXX
        return json.dumps(payload, separators=(",", ":")).encode()


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(payload), status_code=status, media_type=JSON, headers=headers)


def error_payload(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def _error(exc: AgentGymError) -> Response:
    headers = {"Retry-After": "1"} if exc.http_status == 503 else None
    return _json(error_payload(type(exc).__name__, str(exc)), exc.http_status, headers)


class ErrorResponses:
    """The error responses (and their ``agentgym_errors`` counts) of the FastAPI exception handlers
    and of ``HotRoutes``: one implementation, so the two paths answer a bad request identically."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def install(self, app: FastAPI) -> None:
        """Register the exception handlers every agentgym service answers errors with."""

        @app.exception_handler(AgentGymError)
        async def on_agentgym_error(_request: Request, exc: AgentGymError) -> Response:
            return self.agentgym_error(exc)

        @app.exception_handler(RequestValidationError)
        async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
            return self.invalid(exc.errors(), request.headers.get("content-type"))

        @app.exception_handler(StarletteHTTPException)
        async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
            if exc.status_code == 400:  # FastAPI could not read the body as JSON (bad encoding, too deep...)
                return self.unreadable(exc.__cause__)
            if exc.status_code == 404:
                message = f"no route {request.method} {request.url.path}; GET /docs lists the routes"
                return _json(error_payload("NotFound", message[:1000]), 404)
            kind = {405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
            return _json(error_payload(kind, str(exc.detail)), exc.status_code, getattr(exc, "headers", None))

        @app.exception_handler(Exception)
        async def on_unexpected(_request: Request, exc: Exception) -> Response:
            return self.unexpected(exc)

    def agentgym_error(self, exc: AgentGymError) -> Response:
        self.metrics.errors.labels(type(exc).__name__).inc()
        return _error(exc)

    def unexpected(self, exc: Exception) -> Response:
        self.metrics.errors.labels("internal").inc()
        return _json(error_payload("AgentGymError", f"internal error: {type(exc).__name__}: {exc}"), 500)

    def rejected(self, message: str) -> Response:
        self.metrics.errors.labels("RequestRejected").inc()
        return _json(error_payload("RequestRejected", message), 422)

    def invalid(self, errors: Sequence[dict[str, Any]], content_type: str | None) -> Response:
        """422 for FastAPI-style validation errors (``loc`` starting with ``"body"``)."""
        problems = []
        for err in errors[:10]:
            loc = tuple(err.get("loc", ()))
            if err.get("type") == "json_invalid":
                where = f" at character {loc[-1]}" if len(loc) > 1 else ""
                reason = (err.get("ctx") or {}).get("error", "JSON decode error")
                return self.rejected(f"the request body is not valid JSON ({reason}{where})")
            if loc == ("body",) and isinstance(err.get("input"), (bytes, bytearray)):
                got = f"got Content-Type {content_type!r}" if content_type else "got no Content-Type"
                return self.rejected(f"{BODY_NOT_JSON} ({got})")
            if loc == ("body",) and err.get("type") == "model_attributes_type":
                return self.rejected(f"{BODY_NOT_JSON}; got {type(err.get('input')).__name__}")
            where = ".".join(str(p) for p in loc if p != "body") or "body"
            problems.append(f"{where}: {err.get('msg')}")
        return self.rejected("malformed request: " + "; ".join(problems))

    def unreadable(self, cause: BaseException | None) -> Response:
        """422 for a body that could not be read as JSON at all (FastAPI's 400: bad encoding, too deep...)."""
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return self.rejected(f"the request body is not valid JSON{detail}"[:1000])


_MISSING: Any = object()


def _declares_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body with this Content-Type as JSON (``application/json`` or ``*/*+json``)."""
    if not content_type:
        return False
    if content_type == JSON:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


class HotRoute(NamedTuple):
    """A route ``HotRoutes`` serves: how to read its body and the coroutine its FastAPI endpoint runs too."""

    adapter: TypeAdapter[Any]
    """Validates the body, typed as the FastAPI endpoint's body parameter."""
    required: bool
    """An empty body is a 422 (else the endpoint's default, ``None``)."""
    run: Callable[..., Awaitable[Response]]
    """``run(session_id, body)`` for per-session routes, ``run(body)`` for batch routes."""


class HotRoutes:
    """``POST /sessions/{id}/step|reset`` and ``POST /batch/step|reset`` served as plain ASGI.

    The FastAPI stack around an endpoint (its middleware layers, routing over every route, dependency
    solving, request objects) costs several times the endpoint itself on these per-step routes.
    ``GuardMiddleware`` hands them here instead; everything else, and any path that does not match
    exactly, goes to FastAPI. The FastAPI routes stay declared (``/docs``, ``/openapi.json``) and run
    the same ``run`` coroutines, ``ErrorResponses`` and body rules, so both paths give the same
    answers; the tests compare them byte for byte.
    """

    def __init__(self, session_routes: dict[str, HotRoute], batch_routes: dict[str, HotRoute],
                 errors: ErrorResponses) -> None:
        self.session_routes = session_routes  # by the last path segment: "step", "reset"
        self.batch_routes = batch_routes  # by path: "/batch/step"...
        self.errors = errors

    def match(self, scope: dict[str, Any]) -> tuple[HotRoute, str | None] | None:
        """The route and session id for an exact match of a hot route, else ``None``."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        path = scope["path"]
        if path.startswith("/sessions/"):
            session_id, slash, verb = path[10:].partition("/")
            route = self.session_routes.get(verb) if slash and session_id else None
            return None if route is None else (route, session_id)
        route = self.batch_routes.get(path)
        return None if route is None else (route, None)

    async def __call__(self, route: HotRoute, session_id: str | None, content_type: bytes | None,
                       scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            message = await receive()
            body = message.get("body", b"")
            if message.get("more_body", False):
                chunks = [body]
                while message["type"] == "http.request" and message.get("more_body", False):
                    message = await receive()
                    chunks.append(message.get("body", b""))
                body = b"".join(chunks)
            if message["type"] != "http.request":
                response = self.errors.unreadable(ClientDisconnect())  # as FastAPI answers (no one hears it)
            else:
                value = self._parse(route, body, content_type.decode("latin-1") if content_type else None)
                if isinstance(value, Response):
                    response = value
                elif session_id is None:
                    response = await route.run(value)
                else:
                    response = await route.run(session_id, value)
        except AgentGymError as exc:
            response = self.errors.agentgym_error(exc)
        except Exception as exc:  # answered like FastAPI answers it, and the connection lives on
            logger.exception("%s %s failed", scope["method"], scope["path"])
            response = self.errors.unexpected(exc)
        await response(scope, receive, send)

    def _parse(self, route: HotRoute, body: bytes, content_type: str | None) -> Any:
        """The body as the endpoint's parameter, or the 422 ``Response`` FastAPI would give.

        The rules are FastAPI's: an empty body is missing; a body not declared JSON stays bytes (which
        validation refuses); ``json.loads`` errors are ``json_invalid`` or, for the rest (bad
        encoding, too deep), an unreadable body; validation errors are located under ``body``.
        """
        is_json = _declares_json(content_type)
        if body and is_json:
            try:
                return route.adapter.validate_json(body)  # one pass, no intermediate dicts
            except ValidationError:
                pass  # json.loads accepts a few bodies pydantic's parser refuses: FastAPI's way decides
        if not body:
            value = _MISSING
        elif is_json:
            try:
                value = json.loads(body)
            except json.JSONDecodeError as exc:
                error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                         "input": {}, "ctx": {"error": exc.msg}}
                return self.errors.invalid([error], content_type)
            except Exception as exc:  # noqa: BLE001 - FastAPI's 400 for any other failure to read the body
                return self.errors.unreadable(exc)
        else:
            value = body
        if value is _MISSING:
            if route.required:
                return self.errors.invalid([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                             "input": None}], content_type)
            return None
        try:
            return route.adapter.validate_python(value, from_attributes=True)
        except ValidationError as exc:
            errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors(include_url=False)]
            return self.errors.invalid(errors, content_type)


class GuardMiddleware:
    """Pure-ASGI gate in front of the app: bearer token and request-size limit.

    Pure ASGI (not ``BaseHTTPMiddleware``) because it sits on the per-step hot path. Requests that
    pass go to ``hot_routes`` when they match one exactly, else to the FastAPI app. Attributes it
    does not have (``routes``, ``state``, ``openapi``...) are those of the wrapped FastAPI app.
    """

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int,
                 hot_routes: HotRoutes | None = None) -> None:
        self.app = app
        self.token = b"Bearer " + token.encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.hot_routes = hot_routes

    def __getattr__(self, name: str) -> Any:
        app = self.__dict__.get("app")
        if app is None:
            raise AttributeError(name)
        return getattr(app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = length = content_type = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value
            elif key == b"authorization":
                authorization = value
            elif key == b"content-type" and content_type is None:  # the first, as Starlette reads it
                content_type = value
        if (self.token is not None and scope["path"] != "/health"
                and (authorization is None or not hmac.compare_digest(authorization, self.token))):
            reason = "missing" if authorization is None else "wrong"
            await self._reject(send, 401, "AuthenticationError",
                               f"{reason} bearer token; send 'Authorization: Bearer <token>' with the token "
                               "given to `agentgym serve --token`", [(b"www-authenticate", b"Bearer")])
            return
        limit = self.max_body_bytes
        if length is not None and length.isdigit():
            if int(length) > limit:
                await self._reject(send, 413, "RequestRejected",
                                   f"request body of {int(length)} bytes exceeds the limit of {limit} bytes")
                return
            # The server delivers at most Content-Length bytes: nothing more to police.
            await self._forward(scope, receive, send, content_type)
            return
        # No Content-Length: a streamed (chunked) body. Read it here, up to the limit, then hand it on.
        # (Raising from inside the app's receive would not work: FastAPI turns body-read errors into 400.)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > limit:
                await self._reject(send, 413, "RequestRejected",
                                   f"request body exceeds the limit of {limit} bytes (streamed without "
                                   "Content-Length)")
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self._forward(scope, replay, send, content_type)

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any, content_type: bytes | None) -> None:
        hot = self.hot_routes
        if hot is not None:
            matched = hot.match(scope)
            if matched is not None:
                await hot(*matched, content_type, scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _reject(send: Any, status: int, kind: str, message: str,
                      extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = _dumps(error_payload(kind, message))
        headers = [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
        await send({"type": "http.response.body", "body": body})


def create_app(
    env_ids: list[str] | None = None,
    *,
    max_sessions: int = 1024,
    ttl_s: float = 600.0,
    step_timeout_s: float | None = 60.0,
    num_workers: int = 8,
    token: str | None = None,
    max_body_bytes: int = 8 * 1024 * 1024,
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
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413.

    Returns:
        The ASGI app to give uvicorn: the FastAPI app behind ``GuardMiddleware``, which passes
        attribute access (``routes``, ``state.store``...) through to the FastAPI app.

    Raises:
        UnknownEnv, VersionNotFound, RegistryError: an id in ``env_ids`` cannot be served.

    Example:
        >>> app = create_app(["maze-v0"], max_sessions=8)
        >>> sorted(r.path for r in app.routes if r.path.startswith("/sessions/{"))[:2]
        ['/sessions/{session_id}', '/sessions/{session_id}']
    """
    env_ids = list(env_ids) if env_ids else None
    if env_ids is not None:
        for env_id in env_ids:
            # Fail at start-up, with suggestions, not on the first request.
            lookup_spec(env_id).load_creator()
    store = SessionStore(
        max_sessions=max_sessions, ttl_s=ttl_s, step_timeout_s=step_timeout_s,
        num_workers=num_workers, allowed_env_ids=env_ids,
    )
    metrics = ServiceMetrics(store)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        store.start()
        yield
        await store.stop()

    app = FastAPI(
        title="agentgym env service",
        version=agentgym.__version__,
        description="Text environments over HTTP. Every error body is {\"error\": {\"type\", \"message\"}}.",
        lifespan=lifespan,
        **_TELEMETRY_OFF,
    )
    app.state.store = store
    app.state.metrics = metrics
    errors = {"model": wire.ErrorBody}
    answers = ErrorResponses(metrics)

    # --- error model --------------------------------------------------------------------------

    answers.install(app)

    # --- the hot routes' work, shared by their FastAPI endpoints and HotRoutes ------------------

    async def run_reset(session_id: str, body: wire.ResetRequest | None) -> Response:
        seed, options = (body.seed, body.options) if body is not None else (None, None)
        session = store.get(session_id)
        async with session.lock:
            store.check_live(session)
            payload = await store.run(session, lambda: _reset(session, seed, options))
        metrics.resets.inc()
        return _json(payload)

    async def run_step(session_id: str, body: wire.StepRequest) -> Response:
        session = store.get(session_id)
        started = time.perf_counter()
        async with session.lock:
            store.check_live(session)
            payload = await store.run(session, lambda: _step(session, body.action))
        metrics.observe_steps(1, time.perf_counter() - started)
        return _json(payload)

    async def run_batch_step(body: wire.BatchStepRequest) -> Response:
        items = [(item.session_id, item.action) for item in body.steps]
        started = time.perf_counter()
        results = await _run_batch(store, items, _step)
        stepped = sum(1 for r in results if "error" not in r)
        metrics.observe_steps(stepped, time.perf_counter() - started, batched=True)
        return _json({"results": results})

    async def run_batch_reset(body: wire.BatchResetRequest) -> Response:
        items = [(item.session_id, (item.seed, item.options)) for item in body.resets]
        results = await _run_batch(store, items, lambda s, arg: _reset(s, *arg))
        metrics.resets.inc(sum(1 for r in results if "error" not in r))
        return _json({"results": results})

    hot = HotRoutes(
        session_routes={
            "step": HotRoute(TypeAdapter(wire.StepRequest), True, run_step),
            "reset": HotRoute(TypeAdapter(wire.ResetRequest | None), False, run_reset),
        },
        batch_routes={
            "/batch/step": HotRoute(TypeAdapter(wire.BatchStepRequest), True, run_batch_step),
            "/batch/reset": HotRoute(TypeAdapter(wire.BatchResetRequest), True, run_batch_reset),
        },
        errors=answers,
    )

    # --- service ------------------------------------------------------------------------------

    @app.get("/health", response_model=wire.Health)
    async def health() -> Response:
        return _json({
            "status": "ok", "version": agentgym.__version__, "active_sessions": len(store.sessions),
            "max_sessions": store.max_sessions, "envs": env_ids or [s.id for s in list_envs()],
        })

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/envs", response_model=list[wire.EnvSummary])
    async def envs() -> Response:
        specs = [lookup_spec(i) for i in env_ids] if env_ids is not None else list_envs()
        return _json([{"id": s.id, "description": s.description, "max_turns": s.max_turns} for s in specs])

    @app.get("/envs/{env_id:path}", response_model=wire.EnvDetail, responses={404: errors})
    async def env_detail(env_id: str) -> Response:
        store.check_served(env_id)
        detail = lookup_spec(env_id).to_json()
        detail["schemas"] = {
            name: model.model_json_schema()
            for name, model in (("reset_request", wire.ResetRequest), ("reset_response", wire.ResetResponse),
                                ("step_request", wire.StepRequest), ("step_response", wire.StepResponse))
        }
        return _json(detail)

    # --- sessions -----------------------------------------------------------------------------

    @app.post("/sessions", status_code=201, response_model=wire.SessionInfo,
              responses={404: errors, 422: errors, 503: errors})
    async def create_session(body: wire.CreateSessionRequest) -> Response:
        store.start()
        session = await store.create(body.env_id, body.kwargs, body.max_turns)
        metrics.sessions_created.inc()
        return _json(session.describe(), 201)

    @app.get("/sessions/{session_id}", response_model=wire.SessionInfo, responses={404: errors})
    async def get_session(session_id: str) -> Response:
        return _json(store.get(session_id).describe())

    @app.delete("/sessions/{session_id}", status_code=204, responses={404: errors})
    async def delete_session(session_id: str) -> Response:
        await store.delete(session_id)
        return Response(status_code=204)

    @app.post("/sessions/{session_id}/reset", response_model=wire.ResetResponse,
              responses={404: errors, 422: errors, 500: errors, 504: errors})
    async def reset(session_id: str, body: wire.ResetRequest | None = None) -> Response:
        return await run_reset(session_id, body)  # served by HotRoutes; declared for /docs and direct use

    @app.post("/sessions/{session_id}/step", response_model=wire.StepResponse,
              responses={404: errors, 409: errors, 422: errors, 500: errors, 504: errors})
    async def step(session_id: str, body: wire.StepRequest) -> Response:
        return await run_step(session_id, body)  # served by HotRoutes; declared for /docs and direct use

    @app.post("/sessions/{session_id}/fork", status_code=201, response_model=wire.SessionInfo,
              responses={404: errors, 409: errors, 503: errors, 504: errors})
    async def fork(session_id: str, body: wire.ForkRequest | None = None) -> Response:
        mode = body.mode if body is not None else "auto"
        session = store.get(session_id)
        with store.reserve():  # capacity is held while the fork runs, so concurrent forks cannot overshoot
            async with session.lock:
                store.check_live(session)
                child_env = await store.run(session, lambda: _env_call(session, "fork", lambda: session.env.fork(mode)))
            child = store.add(session.env_id, child_env)
        metrics.sessions_created.inc()
        return _json(child.describe(), 201)

    @app.post("/sessions/{session_id}/expert", response_model=wire.ExpertResponse,
              responses={404: errors, 409: errors})
    async def expert(session_id: str) -> Response:
        session = store.get(session_id)
        async with session.lock:
            store.check_live(session)
            action = await store.run(session, lambda: _env_call(session, "expert_action", session.env.expert_action))
        return _json({"action": action})

    # --- batched ------------------------------------------------------------------------------

    @app.post("/batch/step", response_model=wire.BatchStepResponse, responses={422: errors})
    async def batch_step(body: wire.BatchStepRequest) -> Response:
        return await run_batch_step(body)  # served by HotRoutes; declared for /docs and direct use

    @app.post("/batch/reset", response_model=wire.BatchResetResponse, responses={422: errors})
    async def batch_reset(body: wire.BatchResetRequest) -> Response:
        return await run_batch_reset(body)  # served by HotRoutes; declared for /docs and direct use

    return GuardMiddleware(app, token=token, max_body_bytes=max_body_bytes, hot_routes=hot)


def _reset(session: Session, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    obs, info = session.env.reset(seed=seed, options=options)
    return {"observation": obs, "info": info, "episode_seed": session.env.episode_seed}


def _env_call(session: Session, what: str, fn: Any) -> Any:
    """Report env code that raises outside ``EpisodeGuard``'s own wrapping (expert, fork) as ``EnvCrashed``."""
    try:
        return fn()
    except AgentGymError:
        raise
    except Exception as exc:
        raise EnvCrashed(
            f"{type(session.env.unwrapped).__name__}.{what}() raised {type(exc).__name__}: {exc}"
        ) from exc


def _step(session: Session, action: str) -> dict[str, Any]:
    obs, reward, terminated, truncated, info = session.env.step(action)
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
                results[index] = error_payload("AgentGymError", f"internal error: {type(exc).__name__}: {exc}")

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
