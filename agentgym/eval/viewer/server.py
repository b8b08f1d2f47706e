"""The viewer's HTTP server (FastAPI): the page at ``/`` and a small read-only JSON API.

Routes: ``GET /`` (the page), ``GET /api/meta``, ``GET /api/episodes?env=&policy=&success=&iteration=
&task_index=&offset=&limit=`` (one page of episode summaries; ``X-Total-Count`` says how many
match), ``GET /api/tasks?env=`` (the tasks played), ``GET /api/episode/{id}?turn_offset=&turn_limit=``
(one episode with one page of its turns), ``GET /health``. With a token, every route but ``/health``
needs it (``agentgym.eval.viewer.gate``). Errors are ``{"error": {"type", "message"}}`` and never
name a path outside the folder.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CollectorRegistry, Counter

from agentgym.eval.viewer.data import MAX_LIST_PAGE, MAX_TURN_PAGE, EpisodeIndex
from agentgym.eval.viewer.gate import TokenGate
from agentgym.service_kit.responses import (
    TELEMETRY_OFF,
    ErrorResponses,
    error_payload,
    error_responses,
    json_response,
    keep_integer_bounds,
)
from agentgym.service_kit.wire import ErrorBody

_log = logging.getLogger(__name__)
#: OpenAPI ``responses=`` for the viewer's own 404 and 409.
_EPISODE_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No episode with that id in this folder."},
    409: {"model": ErrorBody, "description": "The episode's file changed on disk since the viewer started."},
}
#: The page's own headers: no framing by other sites, no address (with a ?token=) sent onwards.
_PAGE_HEADERS = {"x-frame-options": "DENY", "referrer-policy": "no-referrer", "cache-control": "no-store"}


def page() -> str:
    """The viewer page (``index.html``, shipped in this package)."""
    return resources.files("agentgym.eval.viewer").joinpath("index.html").read_text(encoding="utf-8")


def create_viewer_app(folder: str | Path, *, token: str | None = None) -> Any:
    """The viewer app over one evaluation or training-run folder (an ASGI app for uvicorn).

    Args:
        folder: an ``agentgym eval --out`` or ``agentgym train --out`` folder.
        token: when set, every route but ``/health`` needs it (a bearer header, or the cookie a
            browser gets by giving it once; see ``agentgym.eval.viewer.gate``).

    Raises:
        ConfigError: the folder is neither, or it is damaged (see ``EpisodeIndex``).

    Example:
        >>> import tempfile, json, pathlib
        >>> from fastapi.testclient import TestClient
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (pathlib.Path(d) / "plan.json").write_text(json.dumps({"envs": [], "policies": []}))
        ...     client = TestClient(create_viewer_app(d, token="s3cret"))
        ...     (client.get("/api/meta").status_code,
        ...      client.get("/api/meta", headers={"Authorization": "Bearer s3cret"}).json()["kind"],
        ...      client.get("/api/episode/nope", headers={"Authorization": "Bearer s3cret"}).status_code)
        (401, 'eval', 404)
    """
    run = EpisodeIndex(folder)
    registry = CollectorRegistry()
    answers = ErrorResponses(Counter("agentgym_viewer_errors", "Error responses by error type", ["type"],
                                     registry=registry))
    app = FastAPI(title="agentgym viewer", redoc_url=None, **TELEMETRY_OFF,
                  description="Read-only trajectories of one evaluation or training run. Every error body is "
                              "{\"error\": {\"type\", \"message\"}}.")
    keep_integer_bounds(app)
    answers.install(app)

    @app.exception_handler(Exception)
    async def on_unexpected(_request: Request, exc: Exception) -> Response:
        # The exception's text may name files of this machine: it goes to the log, not to the client.
        _log.exception("viewer: unexpected error")
        answers.errors.labels("internal").inc()
        return json_response(error_payload("AgentGymError", f"internal error ({type(exc).__name__}); the "
                                           "viewer's log has the details"), 500)

    @app.get("/", response_class=HTMLResponse, responses=error_responses(401))
    def index() -> HTMLResponse:
        return HTMLResponse(page(), headers=_PAGE_HEADERS)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "kind": run.kind}

    @app.get("/api/meta", responses=error_responses(401))
    def meta() -> dict[str, Any]:
        return run.meta()

    @app.get("/api/episodes", responses=error_responses(401, 422))
    def episodes(env: str | None = None, policy: str | None = None, success: bool | None = None,
                 iteration: int | None = None, task_index: int | None = None,
                 offset: int = Query(0, ge=0, le=2**62), limit: int = Query(100, ge=1, le=MAX_LIST_PAGE),
                 ) -> Response:
        total, found = run.episodes(env=env, policy=policy, success=success, iteration=iteration,
                                    task_index=task_index, offset=offset, limit=limit)
        return json_response(found, headers={"X-Total-Count": str(total)})

    @app.get("/api/tasks", responses=error_responses(401))
    def tasks(env: str | None = None) -> list[dict[str, Any]]:
        return run.tasks(env)

    @app.get("/api/episode/{eid:path}", responses={**error_responses(401, 422), **_EPISODE_ERRORS})
    def episode(eid: str, turn_offset: int = Query(0, ge=0, le=2**62),
                turn_limit: int = Query(50, ge=1, le=MAX_TURN_PAGE)) -> Response:
        # A folder rewritten under the viewer is FolderChanged: a 409 through the AgentGymError handler.
        found = run.episode(eid, turn_offset=turn_offset, turn_limit=turn_limit)
        if found is None:
            return json_response(error_payload("NotFound", f"no episode {eid[:200]!r} in this folder; "
                                               "GET /api/episodes lists them"), 404)
        return json_response(found)

    return TokenGate(app, token)


def serve_viewer(folder: str | Path, *, host: str = "127.0.0.1", port: int = 8002, token: str | None = None,
                 log_level: str = "warning") -> None:
    """Serve the viewer until interrupted."""
    import uvicorn

    uvicorn.run(create_viewer_app(folder, token=token), host=host, port=port, log_level=log_level,
                access_log=False)
