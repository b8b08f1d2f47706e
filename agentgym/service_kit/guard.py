"""``GuardMiddleware``: the bearer-token and request-size gate in front of the env, sandbox and retrieval
services (pure ASGI), which may hand exact matches of hot routes to a faster path (``HotPath``)."""

from __future__ import annotations

from typing import Any, Protocol

from agentgym.service_kit.gate import AppGate, BodyTooLarge, bearer_matches, read_body, replay, send_answer
from agentgym.service_kit.responses import JSON, dumps, error_payload


class HotPath(Protocol):
    """Routes served without the FastAPI stack (the env service's ``agentgym.http.fastpath.HotRoutes``).

    ``match(scope)`` is None for a request that is not one of them, else its route and session id (None for
    a route of no session); the gate then calls the path with them, the request's content type, ``scope``,
    ``receive`` and ``send``, and the call answers the request.
    """

    def match(self, scope: dict[str, Any]) -> tuple[Any, str | None] | None: ...

    async def __call__(self, route: Any, session_id: str | None, content_type: bytes | None,
                       scope: dict[str, Any], receive: Any, send: Any) -> None: ...


class GuardMiddleware(AppGate):
    """Pure-ASGI gate in front of the app: bearer token and request-size limit.

    Pure ASGI (not ``BaseHTTPMiddleware``) because it sits on the per-step hot path. Requests that
    pass go to ``hot_routes`` when they match one exactly, else to the FastAPI app. Attributes it
    does not have (``routes``, ``state``, ``openapi``...) are those of the wrapped FastAPI app.
    """

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int,
                 hot_routes: HotPath | None = None) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.hot_routes = hot_routes

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
        guarded = self.token is not None and scope["path"] != "/health"
        if guarded and not bearer_matches(authorization, self.token):
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
        try:
            body = await read_body(receive, limit)
        except BodyTooLarge:
            await self._reject(send, 413, "RequestRejected",
                               f"request body exceeds the limit of {limit} bytes (streamed without "
                               "Content-Length)")
            return
        if body is None:
            return  # the client went away
        await self._forward(scope, replay(body, receive), send, content_type)

    async def _forward(self, scope: dict[str, Any], receive: Any, send: Any,
                       content_type: bytes | None) -> None:
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
        await send_answer(send, status, dumps(error_payload(kind, message)),
                          [(b"content-type", JSON.encode()), *(extra_headers or [])])
