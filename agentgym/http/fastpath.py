"""The per-step fast path of the env service: ``HotRoutes`` (step/reset routes served without the FastAPI
stack, same answers), which ``agentgym.service_kit.guard.GuardMiddleware`` hands matching requests to."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from fastapi.responses import Response
from pydantic import TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect

from agentgym.errors import AgentGymError
from agentgym.service_kit.responses import ErrorResponses, declares_json

logger = logging.getLogger(__name__)
_MISSING: Any = object()


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
        is_json = declares_json(content_type)
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
