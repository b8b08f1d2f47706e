"""Service commands: ``sandbox serve``, ``retrieval index|synthetic|serve``, ``serve-mcp``."""

from __future__ import annotations

import typer

from agentgym.cli.app import app, console, err_console, fail
from agentgym.cli.serving import MAX_PORT, MIN_PORT, bind, check_exposure, check_range, run_uvicorn
from agentgym.errors import AgentGymError, ConfigError
from agentgym.http.mcp_tools import build_mcp_server

sandbox_app = typer.Typer(help="The code sandbox service (runs untrusted Python).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8100, help="TCP port, 1-65535."),
    backend: str = typer.Option("auto", help="auto | bwrap | docker | subprocess "
                                             "(subprocess is NOT a security boundary)."),
    pool_size: int = typer.Option(2, help="Pre-spawned sandboxed workers, each used once (>= 0)."),
    max_concurrency: int = typer.Option(4, help="Runs at once (>= 1); more get 503."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_SANDBOX_TOKEN",
                                     help="Require this bearer token."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token: anyone who can "
                                             "reach it can run code on this machine."),
) -> None:
    """Serve the code sandbox over HTTP: POST /run {code, stdin?, limits?}."""
    from agentgym.sandbox.backends import default_backend
    from agentgym.sandbox.service import create_sandbox_app

    try:
        check_range("--port", port, MIN_PORT, MAX_PORT)
        check_range("--pool-size", pool_size, 0)
        check_range("--max-concurrency", max_concurrency, 1)
        check_exposure(host, token, allow_no_token, "run arbitrary code on this machine",
                       variable="AGENTGYM_SANDBOX_TOKEN")
        service = create_sandbox_app(default_backend(backend), pool_size=pool_size,  # type: ignore[arg-type]
                                     max_concurrency=max_concurrency, token=token)
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    console.print(f"sandbox ({backend}) serving on http://{host}:{port} (docs: /docs)")
    run_uvicorn(service, sock, log_level="info")


retrieval_app = typer.Typer(help="BM25 retrieval: build an index, serve it, write a synthetic corpus.",
                            no_args_is_help=True)
app.add_typer(retrieval_app, name="retrieval")


@retrieval_app.command("index")
def retrieval_index(
    corpus: str = typer.Argument(..., help="JSONL corpus, one {id, title, text} per line."),
    out: str = typer.Option(..., "--out", help="Index folder to write."),
    k1: float = typer.Option(1.5, help="BM25 k1."),
    b: float = typer.Option(0.75, help="BM25 b."),
) -> None:
    """Build a BM25 index over a JSONL corpus."""
    from agentgym.retrieval import build_index

    try:
        build_index(corpus, out, k1=k1, b=b)
    except AgentGymError as exc:
        fail(exc)
    except UnicodeDecodeError as exc:
        fail(ConfigError(f"{corpus}: not UTF-8 text (byte {exc.start}); the corpus must be a JSONL file"))
    except OSError as exc:  # the corpus cannot be read, or --out cannot be created (a file on its path...)
        fail(ConfigError(f"{exc.filename or out}: {exc.strerror or exc}"))
    console.print(f"[green]ok[/] index written to {out}")


@retrieval_app.command("synthetic")
def retrieval_synthetic(
    out: str = typer.Argument(..., help="Folder to write corpus.jsonl and questions.jsonl into."),
    entities: int = typer.Option(500, help="Entities (documents) in the corpus."),
    seed: int = typer.Option(0, help="Generator seed; the same seed gives the same files."),
) -> None:
    """Write the synthetic multi-hop corpus and its questions (search-qa-v0's default data) as JSONL."""
    from agentgym.retrieval.synthetic import generate_corpus, write_jsonl

    try:
        docs, questions = generate_corpus(entities, seed)
    except AgentGymError as exc:
        fail(exc)
    corpus, qa = write_jsonl(docs, questions, out)
    console.print(f"[green]ok[/] {len(docs)} documents in {corpus}, {len(questions)} questions in {qa}")


@retrieval_app.command("serve")
def retrieval_serve(
    index: str = typer.Argument(..., help="Index folder from `agentgym retrieval index`."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8001, help="TCP port, 1-65535."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_RETRIEVAL_TOKEN",
                                     help="Require this bearer token."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token."),
    max_k: int = typer.Option(50, help="Largest k a request may ask for (>= 1)."),
) -> None:
    """Serve an index over HTTP: POST /retrieve {queries, k}."""
    from agentgym.retrieval.service import create_retrieval_app

    try:
        check_range("--port", port, MIN_PORT, MAX_PORT)
        check_range("--max-k", max_k, 1)
        check_exposure(host, token, allow_no_token, "query this index", variable="AGENTGYM_RETRIEVAL_TOKEN")
        service = create_retrieval_app(index, token=token, max_k=max_k)
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    console.print(f"retrieval serving {index} on http://{host}:{port}")
    run_uvicorn(service, sock)


# --- serve-mcp: an env's tools for MCP-speaking agents ----------------------------------------------

@app.command("serve-mcp")
def serve_mcp(
    env_id: str = typer.Argument(..., help="A registered tool env, e.g. tools-v0."),
    http: bool = typer.Option(False, "--http/--stdio",
                              help="Serve streamable HTTP (at /mcp) instead of stdio (the default, for "
                                   "agents that spawn the server)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind with --http; any other than loopback needs "
                                               "--allow-no-token (the MCP endpoint has no token)."),
    port: int = typer.Option(8200, help="TCP port with --http, 1-65535."),
    seed: int = typer.Option(0, help="Seed of each session's first task (new_task picks others)."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host: anyone who can reach it can "
                                             "use the env's tools."),
) -> None:
    """Serve a tool env's tools over MCP (stdio, or streamable HTTP with --http) for MCP-speaking agents."""
    try:
        server = build_mcp_server(env_id, seed=seed)
        sock = None
        if http:
            check_exposure(host, None, allow_no_token, "use this env's tools", has_token=False)
            sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    if sock is None:
        server.run(show_banner=False, log_level="warning")  # stdout is the MCP stream: print nothing else
        return
    err_console.print(f"{env_id} tools served over MCP at http://{host}:{port}/mcp")
    server.run(transport="http", show_banner=False, host=host, port=port, path="/mcp", log_level="warning",
               sockets=[sock])
