"""The viewer's token gate (pure ASGI): every route but ``/health`` needs the token, from a script
as ``Authorization: Bearer <token>``, from a browser as a session cookie it gets by giving the token once.

A browser gives the token either on the sign-in page ``/`` shows (a form posted to ``/login``, so
the token stays out of the address bar and history) or as ``/?token=<token>`` in a link; either way
the answer is a redirect to ``/`` that sets an HttpOnly cookie. The cookie holds a random session
value made when the viewer started, never the token, and lasts until the browser or the viewer is
closed.
"""

from __future__ import annotations

import hmac
import html
import secrets
from typing import Any
from urllib.parse import parse_qs

from agentgym.service_kit.gate import AppGate, BodyTooLarge, bearer_matches, header, read_body, send_answer

#: The largest sign-in form body read; a token is far shorter.
MAX_LOGIN_BYTES = 4096

_SIGN_IN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentgym viewer: sign in</title>
<style>body {{ font: 14px system-ui, sans-serif; margin: 15vh auto; max-width: 420px; color: #222; }}
input {{ font: inherit; padding: 4px 6px; width: 100%; margin: 6px 0; }} .bad {{ color: #c0392b; }}</style>
</head><body><h1>agentgym viewer</h1>
<p>This viewer was started with <code>--token</code>. Enter the token to open it.</p>
<form method="post" action="/login"><input id="token" name="token" type="password" \
autocomplete="off" autofocus
 aria-label="token"><button type="submit">Open</button></form>
<p class="bad" id="problem">{problem}</p></body></html>
"""


class TokenGate(AppGate):
    """Answers 401 to any request without the token, except ``GET /health``; serves sign-in.

    Args:
        app: the viewer's ASGI app.
        token: the token; with None the gate lets everything through.
    """

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.session = secrets.token_urlsafe(32).encode()
        # A name of this viewer's own: cookies ignore ports, so two viewers on one host must not
        # overwrite each other's.
        self.cookie = f"agentgym_viewer_{secrets.token_hex(4)}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.token is None or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if self._signed_in(scope) and path != "/login":
            await self.app(scope, receive, send)
            return
        if path == "/" and method in ("GET", "HEAD"):
            given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
            if given is None:
                await self._sign_in_page(send, "")
            elif self._is_token(given[0].encode()):
                await self._open(send)
            else:
                await self._sign_in_page(send, "That token is wrong.")
            return
        if path == "/login" and method == "POST":
            try:
                body = await read_body(receive, MAX_LOGIN_BYTES)
            except BodyTooLarge:
                await self._sign_in_page(send, "That token is too long.", 413)
                return
            if body is None:
                return  # the browser went away
            given = parse_qs(body.decode("utf-8", "replace")).get("token")
            if given and self._is_token(given[0].encode()):
                await self._open(send)
            else:
                await self._sign_in_page(send, "That token is wrong.")
            return
        authorization = header(scope, b"authorization")
        reason = "missing" if authorization is None else "wrong"
        await send_answer(send, 401, b'{"error":{"type":"AuthenticationError","message":"' + reason.encode()
                          + b" bearer token; send 'Authorization: Bearer <token>' with the token given to "
                          b"`agentgym view --token`, or open / in a browser and enter it\"}}",
                          [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")])

    def _is_token(self, given: bytes) -> bool:
        return hmac.compare_digest(given, self.token or b"")

    def _signed_in(self, scope: dict[str, Any]) -> bool:
        if bearer_matches(header(scope, b"authorization"), self.token):
            return True
        cookies = header(scope, b"cookie")
        if cookies is None:
            return False
        for part in cookies.split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == self.cookie.encode() and hmac.compare_digest(value, self.session):
                return True
        return False

    async def _open(self, send: Any) -> None:
        # SameSite=Lax, not Strict: a /?token= link opened from another site must still carry the
        # cookie on the redirect that follows; every route it opens is a read-only GET.
        cookie = f"{self.cookie}={self.session.decode()}; HttpOnly; SameSite=Lax; Path=/"
        await send_answer(send, 303, b"", [(b"location", b"/"), (b"set-cookie", cookie.encode()),
                                           (b"cache-control", b"no-store"),
                                           (b"referrer-policy", b"no-referrer")])

    async def _sign_in_page(self, send: Any, problem: str, status: int = 401) -> None:
        page = _SIGN_IN.format(problem=html.escape(problem)).encode()
        await send_answer(send, status, page, [(b"content-type", b"text/html; charset=utf-8"),
                                               (b"cache-control", b"no-store"),
                                               (b"referrer-policy", b"no-referrer"),
                                               (b"x-frame-options", b"DENY")])
