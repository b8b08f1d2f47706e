"""The ``view`` command: the trajectory viewer in the browser."""

from __future__ import annotations

import typer

from agentgym.cli.app import app, err_console, fail
from agentgym.cli.serving import bind, check_exposure, check_range, run_uvicorn
from agentgym.errors import AgentGymError, ConfigError


@app.command()
def view(
    folder: str = typer.Argument(..., help="An `agentgym eval --out` or `agentgym train --out` folder."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8002, help="TCP port, 1-65535."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_VIEWER_TOKEN",
                                     help="Require this token: scripts send it as a bearer token, a browser "
                                          "enters it once on the page (or opens /?token=TOKEN)."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token: anyone who can "
                                             "reach it can read every prompt and response in the folder."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Replay trajectories in the browser: turn by turn, filters, side-by-side comparison, learning curves."""
    try:
        from agentgym.eval.viewer.server import create_viewer_app
    except ImportError as exc:
        fail(ImportError(f"{exc}; install the server extra: pip install 'agentgym-rl[server]'"))
    try:
        check_range("--port", port, 1, 65535)
        check_exposure(host, token, allow_no_token, "read every prompt and response in this folder",
                       variable="AGENTGYM_VIEWER_TOKEN")
        try:
            service = create_viewer_app(folder, token=token)
        except OSError as exc:  # a file of the folder that cannot be read (permissions, a vanished disk)
            raise ConfigError(f"{exc.filename or folder}: cannot be read ({exc.strerror or exc})") from None
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    gated = " (token required: enter it on the page, or open /?token=TOKEN once)" if token else ""
    err_console.print(f"viewer of {folder} on http://{host}:{port}/{gated}", soft_wrap=True, highlight=False,
                      markup=False)
    run_uvicorn(service, sock, log_level=log_level)
