"""The viewer's HTTP server (FastAPI): the page at ``/`` and a small read-only JSON API.

Routes: ``GET /`` (the page), ``GET /api/meta``, ``GET /api/episodes?env=&policy=&success=&iteration=&task_index=``
(episode summaries), ``GET /api/episode/{id}`` (one episode, every turn), ``GET /health``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from agentgym.eval.viewer.data import RunFolder


def page() -> str:
    """The viewer page (``index.html``, shipped in this package)."""
    return resources.files("agentgym.eval.viewer").joinpath("index.html").read_text(encoding="utf-8")


def create_viewer_app(folder: str | Path) -> FastAPI:
    """The viewer app over one evaluation or training-run folder.

    Raises:
        ConfigError: the folder is neither (see ``RunFolder``).

    Example:
        >>> import tempfile, json, pathlib
        >>> from fastapi.testclient import TestClient
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (pathlib.Path(d) / "plan.json").write_text(json.dumps({"envs": [], "policies": []}))
        ...     client = TestClient(create_viewer_app(d))
        ...     client.get("/api/meta").json()["kind"], client.get("/api/episode/nope").status_code
        ('eval', 404)
    """
    run = RunFolder(folder)
    app = FastAPI(title=f"agentgym viewer: {run.root}", docs_url=None, redoc_url=None)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page()

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "kind": run.kind}

    @app.get("/api/meta")
    def meta() -> dict[str, Any]:
        return run.meta()

    @app.get("/api/episodes")
    def episodes(env: str | None = None, policy: str | None = None, success: bool | None = None,
                 iteration: int | None = None, task_index: int | None = None) -> list[dict[str, Any]]:
        return run.episodes(env=env, policy=policy, success=success, iteration=iteration, task_index=task_index)

    @app.get("/api/episode/{eid:path}")
    def episode(eid: str) -> dict[str, Any]:
        found = run.episode(eid)
        if found is None:
            raise HTTPException(404, f"no episode {eid!r} in {run.root}")
        return found

    return app


def serve_viewer(folder: str | Path, *, host: str = "127.0.0.1", port: int = 8002, log_level: str = "warning") -> None:
    """Serve the viewer until interrupted."""
    import uvicorn

    uvicorn.run(create_viewer_app(folder), host=host, port=port, log_level=log_level, access_log=False)
