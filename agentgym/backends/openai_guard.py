"""OpenAI's error shape and ``PolicyGuard``, the pure-ASGI gate in front of ``serve-policy``'s app.

The gate checks the bearer token (every route but ``/health``), refuses bodies over the size limit with
413 before reading them whole, and has the last word on any exception that escapes the app (a logged
500 in OpenAI's shape, after which the connection stays usable).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi.responses import JSONResponse

from agentgym.backends.openai_wire import ErrorBody
from agentgym.service_kit.gate import (
    AppGate,
    BodyTooLarge,
    bearer_matches,
    header,
    read_body,
    replay,
    send_answer,
)

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request this server cannot serve; answered with ``status`` and OpenAI's error body."""

    def __init__(self, message: str, status: int = 400, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def error_body(message: str, status: int, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(message: str, status: int, code: str | None = None, param: str | None = None,
                    headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, code, param), status_code=status, headers=headers)


ERROR_MEANINGS = {
    400: "A request this server cannot serve: a value out of range, a prompt too long, too many sequences.",
    401: "Missing or wrong bearer token (the server was started with --token).",
    403: "The adapter path is outside the directories the server allows (--adapter-dir).",
    404: "Unknown model or adapter.",
    413: "The request body is larger than the server's limit.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody, "description": ERROR_MEANINGS[status]} for status in statuses}


TEXT_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {"description": "Done, in vLLM's words.", "content": {"text/plain": {"schema": {"type": "string"}}}}}


# --- the gate in front of the app ------------------------------------------------------------


class PolicyGuard(AppGate):
    """Pure-ASGI gate in front of the policy app: bearer token, request-size limit, escaped errors.

    Attributes it does not have (``routes``, ``state``, ``openapi``...) are those of the wrapped app.

    Args:
        app: the FastAPI app.
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413, streamed ones as soon as they pass the limit.
    """

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization, length = header(scope, b"authorization"), header(scope, b"content-length")
        guarded = self.token is not None and scope["path"] != "/health"
        if guarded and not bearer_matches(authorization, self.token):
            reason = "missing" if authorization is None else "wrong"
            await send_error(send, 401, f"{reason} bearer token; send 'Authorization: Bearer <token>' with "
                             "the token given to `agentgym serve-policy --token` (OpenAI clients send their "
                             "api_key; agentgym eval sends OPENAI_API_KEY)", "invalid_api_key",
                             [(b"www-authenticate", b"Bearer")])
            return
        limit = self.max_body_bytes
        if length is not None and length.isdigit():
            if int(length) > limit:
                await send_error(send, 413, f"request body of {int(length)} bytes exceeds this server's "
                                 f"limit of {limit} bytes (serve-policy --max-body-bytes)",
                                 "request_too_large")
                return
        elif scope["method"] not in ("GET", "HEAD"):
            # A streamed (chunked) body: read it here, up to the limit, then hand it on.
            try:
                body = await read_body(receive, limit)
            except BodyTooLarge:
                await send_error(send, 413, f"request body exceeds this server's limit of {limit} bytes "
                                 "(streamed without Content-Length; serve-policy --max-body-bytes)",
                                 "request_too_large")
                return
            if body is None:
                return  # the client went away
            receive = replay(body, receive)
        await self._forward(scope, receive, send)

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            # Starlette answers an unhandled exception and then re-raises it; uvicorn would then close
            # the connection, and the client's next request on it would be reset. Ending here keeps it.
            logger.exception("error serving %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await send_error(send, 500, "the server failed on this request; its log has the details",
                                 "internal_error")


async def send_error(send: Any, status: int, message: str, code: str,
                     extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``status`` with OpenAI's error body."""
    await send_answer(send, status, json.dumps(error_body(message, status, code)).encode(),
                      [(b"content-type", b"application/json"), *(extra_headers or [])])
