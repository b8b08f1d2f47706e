"""The ``agentgym`` command line: list, check, serve and play envs."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

import agentgym
from agentgym.errors import AgentGymError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="agentgym: text and tool environments and turn-level RL trainers for LLM agents.",
)
console = Console()
err_console = Console(stderr=True)


def _fail(exc: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
    raise typer.Exit(code=2)


@app.command()
def version() -> None:
    """Print the agentgym version."""
    console.print(agentgym.__version__)


@app.command()
def envs() -> None:
    """List registered envs with a one-line description."""
    table = Table(title="registered envs")
    table.add_column("id", style="bold cyan")
    table.add_column("max turns", justify="right")
    table.add_column("description")
    for spec in agentgym.list_envs():
        table.add_row(spec.id, "-" if spec.max_turns is None else str(spec.max_turns), spec.description)
    console.print(table)


@app.command()
def check(
    env_id: str = typer.Argument(..., help="Registered env id, e.g. maze-v0."),
    seed: int = typer.Option(0, help="First episode seed."),
    episodes: int = typer.Option(3, help="Episodes to drive."),
) -> None:
    """Run check_env (the env contract as code) over an env."""
    try:
        agentgym.check_env(env_id, seed=seed, num_episodes=episodes)
    except AgentGymError as exc:
        _fail(exc)
    console.print(f"[green]ok[/] {env_id} honours the env contract ({episodes} episodes from seed {seed})")


@app.command()
def serve(
    env_ids: list[str] = typer.Argument(None, help="Env ids to serve (default: every registered env)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; 0.0.0.0 exposes the service to the network."),
    port: int = typer.Option(8000, help="TCP port."),
    max_sessions: int = typer.Option(1024, help="Capacity; more sessions get 503."),
    ttl_s: float = typer.Option(600.0, "--ttl-s", help="Close sessions idle longer than this (seconds)."),
    step_timeout_s: float = typer.Option(60.0, "--step-timeout-s", help="Deadline of one env call (seconds)."),
    workers: int = typer.Option(8, help="Threads that run env code."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_TOKEN", help="Require this bearer token."),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, help="Larger request bodies get 413."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Serve envs over HTTP (FastAPI + uvicorn). Docs at http://HOST:PORT/docs."""
    try:
        import uvicorn

        from agentgym.http.server import create_app
    except ImportError as exc:
        _fail(ImportError(f"{exc}; install the server extra: pip install 'agentgym-rl[server]'"))
    try:
        service = create_app(
            env_ids or None, max_sessions=max_sessions, ttl_s=ttl_s, step_timeout_s=step_timeout_s,
            num_workers=workers, token=token, max_body_bytes=max_body_bytes,
        )
    except AgentGymError as exc:
        _fail(exc)
    served = ", ".join(env_ids) if env_ids else "all registered envs"
    err_console.print(f"serving {served} on http://{host}:{port} (docs: /docs)")
    uvicorn.run(service, host=host, port=port, log_level=log_level, access_log=False)


@app.command()
def play(
    env_id: str = typer.Argument(..., help="Registered env id, e.g. maze-v0."),
    seed: Optional[int] = typer.Option(None, help="Episode seed (default: random)."),
    url: Optional[str] = typer.Option(None, help="Play against a service at this URL instead of in-process."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_TOKEN", help="Bearer token for --url."),
    expert: bool = typer.Option(False, "--expert", help="Let the env's expert play and print the episode."),
    max_turns: Optional[int] = typer.Option(None, help="Override the turn budget."),
) -> None:
    """Play an env in the terminal: shows the observation, reward and admissible actions."""
    try:
        if url:
            from agentgym.http.client import RemoteEnv

            env = RemoteEnv(env_id, base_url=url, token=token, max_turns=max_turns)
        else:
            env = agentgym.make(env_id, max_turns=max_turns)
        _play(env, seed, expert)
    except AgentGymError as exc:
        _fail(exc)


def _play(env: agentgym.Env, seed: int | None, expert: bool) -> None:
    with env:
        obs, info = env.reset(seed=seed)
        if info.get("instructions"):
            console.rule("instructions")
            console.print(info["instructions"], markup=False)
        total, turn = 0.0, 0
        while True:
            console.rule(f"turn {turn}  ·  return {total:g}")
            console.print(obs, markup=False)
            if info.get("admissible_actions"):
                console.print(f"[dim]actions: {', '.join(info['admissible_actions'])}[/]")
            if expert:
                action = env.expert_action()
                if action is None:
                    console.print("[yellow]the expert has no move here[/]")
                    return
                console.print(f"[bold]> {action}[/]")
            else:
                try:
                    action = console.input("[bold]> [/]")
                except (EOFError, KeyboardInterrupt):
                    console.print()
                    return
                if action.strip() in (":q", ":quit"):
                    return
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            turn += 1
            if info.get("invalid_action"):
                console.print("[yellow]invalid action[/]")
            if terminated or truncated:
                console.rule("episode over")
                console.print(obs, markup=False)
                outcome = "success" if info.get("success") else ("truncated" if truncated else "terminated")
                console.print(f"[bold]{outcome}[/] after {turn} turns, return {total:g}")
                return


@app.command()
def train(
    config: Optional[str] = typer.Argument(None, help="YAML config (default: the embedded quickstart)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set rollout.group_size=4 (repeatable)."),
    out: Optional[str] = typer.Option(None, help="Run folder (default: runs/<env>-<algorithm>-<time>)."),
    resume: Optional[str] = typer.Option(None, help="Continue the run saved in this folder."),
) -> None:
    """Train a policy: SFT warm start (optional), then RL. Writes report.json and learning_curve.png."""
    import json
    import time
    from pathlib import Path

    from agentgym.config import config_from_dict, load_config

    try:
        if resume:
            saved = Path(resume) / "config.json"
            if not saved.is_file():
                raise AgentGymError(f"--resume {resume}: no config.json there; is it a run folder?")
            cfg = config_from_dict(json.loads(saved.read_text()))
            run_dir = Path(resume)
        else:
            cfg = load_config(config, set_)
            run_dir = Path(out or f"runs/{cfg.env.id.replace('/', '_')}-{cfg.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    except AgentGymError as exc:
        _fail(exc)
    from agentgym.trainer import train as run_training

    console.print(f"[bold]agentgym train[/] {config or '(embedded quickstart)'}: {cfg.algorithm.name} on "
                  f"{cfg.env.id}, {cfg.iterations} iterations, {cfg.rollout.num_tasks}×{cfg.rollout.group_size} "
                  f"episodes each → {run_dir}")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]RL"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console) as progress:
        task = progress.add_task("rl", total=cfg.iterations, status="SFT warm start + eval…",
                                 completed=0)

        def on_iteration(metrics: dict) -> None:
            progress.update(task, completed=metrics["iteration"],
                            status=f"success {metrics['rollout/success_rate']:.0%} · "
                                   f"turns {metrics['rollout/mean_turns']:.1f} · "
                                   f"{metrics['perf/iteration_s']:.1f}s/it")

        try:
            report = run_training(cfg, run_dir, resume=bool(resume), on_iteration=on_iteration)
        except AgentGymError as exc:
            _fail(exc)
    _print_report(report, run_dir)


def _print_report(report: dict, run_dir: object) -> None:
    before, after = report["eval"]["before"], report["eval"]["after"]
    table = Table(title=f"held-out evaluation ({after['episodes']} unseen tasks, greedy)")
    table.add_column("")
    table.add_column("success", justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("return", justify="right")
    table.add_column("turns", justify="right")
    table.add_column("invalid", justify="right")
    rows = [("before RL (after SFT)" if report.get("sft") else "before", before), ("after RL", after)]
    if report["eval"].get("before_sft"):
        rows.insert(0, ("before SFT", report["eval"]["before_sft"]))
    for name, e in rows:
        low, high = e["success_ci95"]
        table.add_row(name, f"{e['success_rate']:.0%}", f"{low:.0%}–{high:.0%}", f"{e['mean_return']:.2f}",
                      f"{e['mean_turns']:.1f}", f"{e['invalid_rate']:.0%}")
    console.print(table)
    delta = after["success_rate"] - before["success_rate"]
    console.print(f"{report['algorithm']} changed held-out success by [bold]{delta:+.0%}[/] in "
                  f"{report['wall_time_s'] / 60:.1f} min. Report: {run_dir}/report.json, "
                  f"curve: {run_dir}/learning_curve.png")


sandbox_app = typer.Typer(help="The code sandbox service (runs untrusted Python).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8100, help="TCP port."),
    backend: str = typer.Option("auto", help="auto | bwrap | docker | subprocess (subprocess is NOT a security boundary)."),
    pool_size: int = typer.Option(2, help="Pre-spawned sandboxed workers (each used once)."),
    max_concurrency: int = typer.Option(4, help="Runs at once; more get 503."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_SANDBOX_TOKEN", help="Require this bearer token."),
) -> None:
    """Serve the code sandbox over HTTP: POST /run {code, stdin?, limits?}."""
    from agentgym.sandbox.service import serve as serve_sandbox

    try:
        serve_sandbox(host, port, backend=backend, pool_size=pool_size, max_concurrency=max_concurrency, token=token)
    except AgentGymError as exc:
        _fail(exc)


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
        _fail(exc)
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
        _fail(exc)
    corpus, qa = write_jsonl(docs, questions, out)
    console.print(f"[green]ok[/] {len(docs)} documents in {corpus}, {len(questions)} questions in {qa}")


@retrieval_app.command("serve")
def retrieval_serve(
    index: str = typer.Argument(..., help="Index folder from `agentgym retrieval index`."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8001, help="TCP port."),
    token: Optional[str] = typer.Option(None, envvar="AGENTGYM_RETRIEVAL_TOKEN", help="Require this bearer token."),
    max_k: int = typer.Option(50, help="Largest k a request may ask for."),
) -> None:
    """Serve an index over HTTP: POST /retrieve {queries, k}."""
    from agentgym.retrieval.service import serve_index

    try:
        serve_index(index, host=host, port=port, token=token, max_k=max_k)
    except AgentGymError as exc:
        _fail(exc)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except AgentGymError as exc:  # pragma: no cover - commands catch their own
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
