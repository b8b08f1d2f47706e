"""What the pure-ASGI gates in front of the services share: ``AppGate`` (the wrapped app's attributes show
through), header look-up, the bearer-token check, reading a body within a size limit and handing it on,
and sending a whole answer.

The gates themselves differ in what they answer (the env service's error shape, OpenAI's, the viewer's
sign-in page): ``agentgym.service_kit.guard.GuardMiddleware``, ``agentgym.backends.openai_guard.PolicyGuard``,
``agentgym.eval.viewer.gate.TokenGate``. They are pure ASGI rather than Starlette middleware because a
body over the limit must be refused before it is read whole.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BodyTooLarge(Exception):
    """A streamed request body passed the gate's limit."""


class AppGate:
    """Base of a gate wrapping ``app``: attributes the gate does not have (``routes``, ``state``,
    ``openapi``...) are those of the wrapped app, so tests and servers can use the gate as the app."""

    app: Any

    def __getattr__(self, name: str) -> Any:
        app = self.__dict__.get("app")
        if app is None:
            raise AttributeError(name)
        return getattr(app, name)


def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case bytes), as Starlette reads it; None when absent.

    Example:
        >>> header({"headers": [(b"a", b"1"), (b"a", b"2")]}, b"a"), header({"headers": []}, b"a")
        (b'1', None)
    """
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def bearer_matches(authorization: bytes | None, token: bytes | None) -> bool:
    """``Authorization`` carries ``Bearer <token>`` (compared in constant time).

    Example:
        >>> bearer_matches(b"Bearer s3cret", b"s3cret"), bearer_matches(b"Bearer wrong", b"s3cret")
        (True, False)
        >>> bearer_matches(None, b"s3cret"), bearer_matches(b"Bearer x", None)
        (False, False)
    """
    return authorization is not None and token is not None and hmac.compare_digest(authorization,
                                                                                   b"Bearer " + token)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body read whole, at most ``limit`` bytes; None when the client went away first.

    Raises:
        BodyTooLarge: the body passed ``limit`` (nothing more is read).
    """
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        if not message.get("more_body", False):
            return bytes(body)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app ``body`` (already read by the gate), then what ``receive`` gives."""
    replayed = False

    async def replayed_receive() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed_receive


async def send_answer(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """Send a whole answer: ``headers`` plus its ``content-length``, then ``body``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
