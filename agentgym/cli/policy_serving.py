"""The ``serve-policy`` command: a model behind an OpenAI-compatible API."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from agentgym.backends.hub import as_hub_id
from agentgym.cli.app import app, err_console, fail
from agentgym.cli.serving import bind, check_exposure, check_range, run_uvicorn
from agentgym.errors import AgentGymError, ConfigError
from agentgym.run_folder import RunFolder

DTYPES = ("float32", "bfloat16", "float16")


def _run_folder(folder: Path) -> tuple[Path, dict[str, Any] | None, dict[str, Any] | None]:
    """The model directory to serve and, for an ``agentgym train`` run folder, its prompt settings and its
    env and held-out task settings (``run_settings``), which clients such as ``agentgym eval`` read.

    Raises:
        ConfigError: a run folder without ``model/`` yet, or with an unreadable ``config.json``.
    """
    run = RunFolder(folder)
    if not (run.report.is_file() or run.checkpoint.is_file()):
        return folder, None, None
    if not run.has_model():
        raise ConfigError(f"run folder {folder} has no model/ yet (the run has not finished); serve a "
                          "finished run or a model directory, or evaluate the checkpoint with agentgym eval "
                          f"--policy {run.checkpoint}")
    from agentgym.eval.policies import run_prompt_settings, run_settings

    if not run.config.is_file():
        return run.model, None, None
    try:
        config = json.loads(run.config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{run.config} is not valid JSON ({exc}); serve {run.model} to go without the "
                          "run's prompt and env settings") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{run.config} is not a run config (not a JSON object); restore it, or serve "
                          f"{run.model} to go without the run's prompt and env settings")
    settings = run_settings(config)
    env_id = (settings.get("env") or {}).get("id")  # a config without an env: nothing for eval to play
    return run.model, asdict(run_prompt_settings(config)), settings if isinstance(env_id, str) else None


def _env_note(settings: dict[str, Any] | None) -> str:
    """What the banner says of the env settings clients get: ``its env maze-v0 (size=2, max_turns=10)``."""
    env = (settings or {}).get("env") or {}
    details = [f"{k}={v}" for k, v in (env.get("kwargs") or {}).items()]
    details += [f"{k}={env[k]}" for k in ("max_turns", "harness", "tasks") if env.get(k) is not None]
    details += [f"eval.{k}={v}" for k, v in ((settings or {}).get("eval") or {}).items()]
    return f"its env {env.get('id')}" + (f" ({', '.join(details)})" if details else "")


@app.command("serve-policy")
def serve_policy(
    model_dir: str = typer.Argument(..., help="A Hugging Face model directory, a Hub id (org/name or "
                                               "org/name@revision, through the Hugging Face cache), an "
                                               "`agentgym train` run folder, a .gguf file or a packaged "
                                               "model (smollm2)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8001, help="TCP port, 1-65535."),
    name: str | None = typer.Option(None, help="Model name clients pass (default: the directory's name)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda, cuda:N."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    max_new_tokens: int = typer.Option(512, help="Largest max_tokens a request may ask for."),
    seed: int = typer.Option(0, help="Seed of unseeded sampling."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_POLICY_TOKEN",
                                     help="Require this bearer token (clients pass it as their API key)."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token (anyone who can "
                                             "reach it can generate with the model)."),
    adapter_dir: list[str] = typer.Option([], "--adapter-dir",
                                          help="A directory LoRA adapters may be loaded from "
                                               "(/v1/load_lora_adapter; repeatable); without one, loading is "
                                               "off."),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, help="Larger request bodies get 413 (>= 1)."),
    max_request_rows: int = typer.Option(256, help="Most sequences (prompts x n) one request may ask for "
                                         "(>= 1)."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Serve a model over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."""
    try:
        from agentgym.backends.openai_server import load_policy_app
    except ImportError as exc:
        fail(ImportError(f"{exc}; install the server and train extras: pip install "
                         "'agentgym-rl[server,train]'"))
    hub = as_hub_id(model_dir)  # org/name[@revision], no local path: served under its Hub id, as vLLM does
    served = name or (hub.repo_id if hub is not None else Path(model_dir).resolve().name)
    try:
        folder, prompt_settings, env_settings = _run_folder(Path(model_dir))
        check_range("--max-new-tokens", max_new_tokens, 1)
        check_range("--max-body-bytes", max_body_bytes, 1)
        check_range("--max-request-rows", max_request_rows, 1)
        if dtype not in DTYPES:
            raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        for allowed in adapter_dir:
            if not Path(allowed).is_dir():
                raise ConfigError(f"--adapter-dir {allowed}: not a directory; create it or name the "
                                  "directory the trainer saves adapters under")
        check_exposure(host, token, allow_no_token, "generate with this model"
                       + (" and load adapters from --adapter-dir" if adapter_dir else ""),
                       variable="AGENTGYM_POLICY_TOKEN")
        sock = bind(host, port)  # an occupied port is one line, before the model loads
    except AgentGymError as exc:
        fail(exc)
    try:
        service = load_policy_app(str(folder), name=served, device=device, dtype=dtype, seed=seed,
                                  max_new_tokens=max_new_tokens, token=token, max_body_bytes=max_body_bytes,
                                  max_request_rows=max_request_rows,
                                  adapter_dirs=[str(Path(d).resolve()) for d in adapter_dir],
                                  prompt_settings=prompt_settings, run_settings=env_settings)
    except AgentGymError as exc:
        sock.close()
        fail(exc)
    shown = (("token required", token), ("the run's prompt settings", prompt_settings),
             (_env_note(env_settings), env_settings),
             (f"adapters from {', '.join(adapter_dir)}", adapter_dir))
    notes = [note for note, given in shown if given]
    err_console.print(f"serving {folder} as model {served!r} on http://{host}:{port}/v1"
                      + (f" ({'; '.join(notes)})" if notes else ""), highlight=False)
    run_uvicorn(service, sock, log_level=log_level)
