"""JSON responses and error answers shared by agentgym's HTTP services (env, retrieval, sandbox).

Every error body is ``{"error": {"type", "message"}}``; ``ErrorResponses`` installs the FastAPI
exception handlers that produce it and counts each error by type.
"""

from __future__ import annotations

import email.message
import inspect
import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import Counter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from agentgym.errors import AgentGymError
from agentgym.service_kit.wire import ErrorBody

JSON = "application/json"
BODY_NOT_JSON = "the request body must be a JSON object sent with 'Content-Type: application/json'"

#: FastAPI's native OpenTelemetry hooks off (FastAPI >= 0.165 has them; older versions lack the
#: argument). They cost a provider lookup per request even with no OpenTelemetry configured.
TELEMETRY_OFF: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters else {}
)


#: What each error status means on agentgym's services (the OpenAPI description of the answer).
ERROR_MEANINGS: dict[int, str] = {
    400: "A task index out of its split's range (OpenEnv's Task API answers that with 400).",
    401: "Missing or wrong bearer token (the service was started with a token).",
    404: "Unknown env or session.",
    409: "The env contract refused the call: step before reset, or after the episode ended.",
    413: "The request body is larger than the service's limit.",
    422: "Malformed request: bad JSON, a wrong type, a value out of range, an unknown field.",
    500: "The env crashed in this call (this session only), or its session was poisoned by a timeout.",
    503: "At capacity, or every worker is busy; nothing was done. Retry after Retry-After seconds.",
    504: "The env call ran past the service's step timeout; the session is poisoned.",
}
#: The Prometheus text format's content type, as the /metrics routes declare it.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for a route that may answer these error statuses (all ``ErrorBody``).

    Declaring 422 also replaces FastAPI's default validation-error schema, which is not what the
    services send.

    Example:
        >>> sorted(error_responses(401, 422))
        [401, 422]
    """
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


def text_responses(description: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` of a plain-text (Prometheus) 200 answer."""
    return {200: {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}}


_BOUNDS = ("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum")


def keep_integer_bounds(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI write integer bounds as integers (``9223372036854775808``, not ``9.22e18``).

    FastAPI passes the schema through its OpenAPI model, whose bounds are floats; every bound the
    services declare is an integer or a float of an integral value that is exact in binary.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _integral_bounds(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _integral_bounds(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if (key in _BOUNDS and isinstance(value, float) and value.is_integer()
                    and node.get("type") == "integer"):
                node[key] = int(value)
            else:
                _integral_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _integral_bounds(item)
    return node


def dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON (lone surrogates escaped rather than failing)."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from an action): escape it as \udXXX
        return json.dumps(payload, separators=(",", ":")).encode()


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON ``Response``."""
    return Response(dumps(payload), status_code=status, media_type=JSON, headers=headers)


def error_payload(kind: str, message: str) -> dict[str, Any]:
    """The error body every service answers with."""
    return {"error": {"type": kind, "message": message}}


def error_response(exc: AgentGymError) -> Response:
    """The response for an agentgym error: its HTTP status, and Retry-After on 503."""
    headers = {"Retry-After": "1"} if exc.http_status == 503 else None
    return json_response(error_payload(type(exc).__name__, str(exc)), exc.http_status, headers)


class ErrorResponses:
    """The error responses of the FastAPI exception handlers and of ``HotRoutes``: one
    implementation, so the two paths answer a bad request identically.

    Args:
        errors: the service's Prometheus counter of error responses, labelled by error type.
    """

    def __init__(self, errors: Counter) -> None:
        self.errors = errors

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
                return json_response(error_payload("NotFound", message[:1000]), 404)
            if exc.status_code == 405:
                allowed = allowed_methods(app, request)
                message = (f"{request.method} is not allowed on {request.url.path}; "
                           f"allowed: {', '.join(allowed)}")
                return json_response(error_payload("MethodNotAllowed", message[:1000]), 405,
                                     {"Allow": ", ".join(allowed)})
            return json_response(error_payload("HTTPError", str(exc.detail)), exc.status_code,
                                 getattr(exc, "headers", None))

        @app.exception_handler(Exception)
        async def on_unexpected(_request: Request, exc: Exception) -> Response:
            return self.unexpected(exc)

    def agentgym_error(self, exc: AgentGymError) -> Response:
        self.errors.labels(type(exc).__name__).inc()
        return error_response(exc)

    def unexpected(self, exc: Exception) -> Response:
        self.errors.labels("internal").inc()
        return json_response(error_payload("AgentGymError", f"internal error: {type(exc).__name__}: {exc}"),
                             500)

    def rejected(self, message: str) -> Response:
        self.errors.labels("RequestRejected").inc()
        return json_response(error_payload("RequestRejected", message), 422)

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


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of ``app`` serves at the request's path (for a 405's ``Allow``).

    Starlette's own 405 names only the first route that matched the path, and FastAPI declares one
    route per method, so ``/sessions/{id}`` (GET and DELETE) would say only ``GET``.
    """
    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    for route in app.router.routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods |= set(route_methods)
    return sorted(methods)


def declares_json(content_type: str | None) -> bool:
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
