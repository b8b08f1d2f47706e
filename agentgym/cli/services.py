"""Service commands: ``sandbox serve``, ``retrieval index|synthetic|serve``."""

from __future__ import annotations

import typer

from agentgym.cli.app import app, console, fail
from agentgym.errors import AgentGymError

sandbox_app = typer.Typer(help="The code sandbox service (runs untrusted Python).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8100, help="TCP port."),
    backend: str = typer.Option("auto", help="auto | bwrap | docker | subprocess (subprocess is NOT a security boundary)."),
    pool_size: int = typer.Option(2, help="Pre-spawned sandboxed workers (each used once)."),
    max_concurrency: int = typer.Option(4, help="Runs at once; more get 503."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_SANDBOX_TOKEN", help="Require this bearer token."),
) -> None:
    """Serve the code sandbox over HTTP: POST /run {code, stdin?, limits?}."""
    from agentgym.sandbox.service import serve as serve_sandbox

    try:
        serve_sandbox(host, port, backend=backend, pool_size=pool_size, max_concurrency=max_concurrency, token=token)
    except AgentGymError as exc:
        fail(exc)


retrieval_app = typer.Typer(help="BM25 retrieval: build an index, serve it, write a synthetic corpus.", no_args_is_help=True)
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
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8001, help="TCP port."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_RETRIEVAL_TOKEN", help="Require this bearer token."),
    max_k: int = typer.Option(50, help="Largest k a request may ask for."),
) -> None:
    """Serve an index over HTTP: POST /retrieve {queries, k}."""
    from agentgym.retrieval.service import serve_index

    try:
        serve_index(index, host=host, port=port, token=token, max_k=max_k)
    except AgentGymError as exc:
        fail(exc)
