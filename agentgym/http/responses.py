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

from agentgym.errors import AgentGymError

JSON = "application/json"
BODY_NOT_JSON = "the request body must be a JSON object sent with 'Content-Type: application/json'"

#: FastAPI's native OpenTelemetry hooks off (FastAPI >= 0.165 has them; older versions lack the
#: argument). They cost a provider lookup per request even with no OpenTelemetry configured.
TELEMETRY_OFF: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters else {}
)


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
            kind = {405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
            return json_response(error_payload(kind, str(exc.detail)), exc.status_code, getattr(exc, "headers", None))

        @app.exception_handler(Exception)
        async def on_unexpected(_request: Request, exc: Exception) -> Response:
            return self.unexpected(exc)

    def agentgym_error(self, exc: AgentGymError) -> Response:
        self.errors.labels(type(exc).__name__).inc()
        return error_response(exc)

    def unexpected(self, exc: Exception) -> Response:
        self.errors.labels("internal").inc()
        return json_response(error_payload("AgentGymError", f"internal error: {type(exc).__name__}: {exc}"), 500)

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
