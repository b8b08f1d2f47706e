"""The ``view`` command: the trajectory viewer in the browser."""

from __future__ import annotations

import typer

from agentgym.cli.app import app, err_console, fail
from agentgym.cli.serving import bind, check_range, run_uvicorn
from agentgym.errors import AgentGymError


@app.command()
def view(
    folder: str = typer.Argument(..., help="An `agentgym eval --out` or `agentgym train --out` folder."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8002, help="TCP port, 1-65535."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Replay trajectories in the browser: turn by turn, filters, side-by-side comparison, learning curves."""
    try:
        from agentgym.eval.viewer.server import create_viewer_app
    except ImportError as exc:
        fail(ImportError(f"{exc}; install the server extra: pip install 'agentgym-rl[server]'"))
    try:
        check_range("--port", port, 1, 65535)
        service = create_viewer_app(folder)
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    err_console.print(f"viewer of {folder} on http://{host}:{port}/")
    run_uvicorn(service, sock, log_level=log_level)
