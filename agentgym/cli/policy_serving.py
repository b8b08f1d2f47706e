"""The ``serve-policy`` command: a model behind an OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path

import typer

from agentgym.cli.app import app, err_console, fail
from agentgym.cli.serving import bind, check_range
from agentgym.errors import AgentGymError, ConfigError


@app.command("serve-policy")
def serve_policy(
    model_dir: str = typer.Argument(..., help="A Hugging Face model directory, or an `agentgym train` run folder."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; 0.0.0.0 exposes the server to the network."),
    port: int = typer.Option(8001, help="TCP port, 1-65535."),
    name: str | None = typer.Option(None, help="Model name clients pass (default: the directory's name)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    max_new_tokens: int = typer.Option(512, help="Largest max_tokens a request may ask for."),
    seed: int = typer.Option(0, help="Seed of unseeded sampling."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."""
    try:
        from agentgym.backends.openai_server import serve_policy as serve
    except ImportError as exc:
        fail(ImportError(f"{exc}; install the server and train extras: pip install 'agentgym-rl[server,train]'"))
    folder = Path(model_dir)
    if (folder / "report.json").is_file() or (folder / "checkpoint.pt").is_file():  # a run folder
        if not (folder / "model" / "config.json").is_file():
            fail(ConfigError(f"run folder {folder} has no model/ yet (the run has not finished); serve a finished "
                             "run or a model directory, or evaluate the checkpoint with agentgym eval --policy "
                             f"{folder}/checkpoint.pt"))
        folder = folder / "model"
    served = name or Path(model_dir).resolve().name
    try:
        check_range("--max-new-tokens", max_new_tokens, 1)
        sock = bind(host, port)  # an occupied port is one line, before the model loads
    except AgentGymError as exc:
        fail(exc)
    err_console.print(f"serving {folder} as model {served!r} on http://{host}:{port}/v1")
    try:
        serve(str(folder), host=host, port=port, name=served, device=device, dtype=dtype, seed=seed,
              max_new_tokens=max_new_tokens, log_level=log_level, sock=sock)
    except AgentGymError as exc:
        fail(exc)
    finally:
        sock.close()
