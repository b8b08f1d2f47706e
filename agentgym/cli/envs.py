"""Env commands: ``version``, ``envs``, ``check``, ``serve``, ``play``."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

import agentgym
from agentgym.cli.app import app, console, err_console, fail
from agentgym.cli.serving import MAX_PORT, MIN_PORT, bind, check_exposure, check_range, run_uvicorn
from agentgym.errors import AgentGymError
from agentgym.gates import EnvGrade, grade_env


@app.command()
def version() -> None:
    """Print the agentgym version."""
    console.print(agentgym.__version__)


@app.command()
def envs(
    env_id: str | None = typer.Argument(None, help="Show this env's task splits and the first tasks of each "
                                        "(implies --tasks)."),
    tasks: bool = typer.Option(False, "--tasks", help="List each env's task splits and their sizes instead "
                               "(makes every env with its default arguments)."),
    first: int = typer.Option(3, "--first", help="With ENV_ID: how many tasks of each split to show (>= 0)."),
) -> None:
    """List registered envs with a one-line description, or their task splits (--tasks)."""
    if env_id is not None:
        _show_tasks(env_id, first)
        return
    if tasks:
        _list_task_splits()
        return
    table = Table(title="registered envs")
    table.add_column("id", style="bold cyan")
    table.add_column("max turns", justify="right")
    table.add_column("description")
    for spec in agentgym.list_envs():
        turns = "-" if spec.max_turns is None else str(spec.max_turns)
        table.add_row(spec.id, turns, escape(spec.description))
    console.print(table)


def _split_size(split: agentgym.TaskSplit) -> str:
    return "procedural" if split.size is None else str(split.size)


def _list_task_splits() -> None:
    """One row per split of every registered env; an env its defaults cannot make says why instead."""
    table = Table(title="task splits (agentgym envs --tasks ENV_ID shows the first tasks)")
    table.add_column("env", style="bold cyan")
    table.add_column("split")
    table.add_column("tasks", justify="right")
    table.add_column("description")
    for spec in agentgym.list_envs():
        try:
            with agentgym.make(spec.id) as env:
                splits = env.task_splits()
        except AgentGymError as exc:  # e.g. an env that needs arguments (harness-v0 needs harness=)
            table.add_row(spec.id, "-", "-", escape(f"not made with default arguments: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - a broken registered env gets its row, not the whole listing
            table.add_row(spec.id, "-", "-", escape(f"making it raised {type(exc).__name__}: {exc}"))
            continue
        for split in splits:
            table.add_row(spec.id, split.name, _split_size(split), escape(split.description))
    console.print(table)


def _show_tasks(env_id: str, first: int) -> None:
    """The splits of one env, each followed by its first ``first`` tasks (``Env.task``)."""
    try:
        check_range("--first", first, 0)
        with agentgym.make(env_id) as env:
            for split in env.task_splits():
                console.print(f"[bold cyan]{escape(split.name)}[/]  {_split_size(split)} tasks  "
                              f"{escape(split.description)}", highlight=False)
                shown = first if split.size is None else min(first, split.size)
                for index in range(shown):
                    task = env.task(split.name, index)
                    line = f"  {index}  {task.get('task_id')}"
                    if task.get("description"):
                        line += f"  {task['description']}"
                    console.print(line, markup=False, highlight=False)
    except AgentGymError as exc:
        fail(exc)


@app.command()
def check(
    env_id: str = typer.Argument(..., help="Registered env id, e.g. maze-v0."),
    seed: int = typer.Option(0, help="First episode seed."),
    episodes: int = typer.Option(3, help="Episodes to drive (the gates play the same seeds)."),
    gates: bool = typer.Option(True, "--gates/--no-gates",
                               help="Also run the quality gates (expert solves, baselines score lower, "
                                    "answer hidden, seed picks the task, rewards in range)."),
) -> None:
    """Run check_env (the env contract as code) over an env, then its quality gates.

    Exit status: 0 when everything holds, 1 when the contract breaks or a gate fails, 2 when the id
    is unknown.
    """
    try:
        grade = grade_env(env_id, seed=seed, num_episodes=episodes) if gates else None
        if grade is None:
            agentgym.check_env(env_id, seed=seed, num_episodes=episodes, gates=())
    except AgentGymError as exc:
        fail(exc)
    console.print(f"[green]ok[/] {env_id} honours the env contract ({episodes} episodes from seed {seed})")
    if grade is None:
        return
    table = Table(title=f"quality gates of {env_id}")
    table.add_column("gate", style="bold cyan")
    table.add_column("result")
    table.add_column("detail")
    for result in grade.results:
        verdict = ("[yellow]skipped[/]" if result.skipped else "[green]pass[/]" if result.passed
                   else "[bold red]FAIL[/]")
        table.add_row(result.gate, verdict, escape(result.message.removeprefix("skipped: ")))
    console.print(table)
    returns = ", ".join(f"{name} {value:.3g}" for name, value in grade.mean_returns.items())
    console.print(f"mean return over seeds {seed}..{seed + episodes - 1}: {returns}", highlight=False)
    _print_gate_counts(grade)
    if not grade.passed:
        raise typer.Exit(code=1)


def _print_gate_counts(grade: EnvGrade) -> None:
    """How many gates passed, failed and were skipped; then each reason for skipping, with its gates: a gate
    that did not apply is not a gate passed."""
    passed = sum(result.passed for result in grade.results)
    console.print(f"gates: {passed} passed, {len(grade.failed)} failed, {len(grade.skipped)} skipped (of "
                  f"{len(grade.results)})", highlight=False)
    reasons: dict[str, list[str]] = {}
    for result in grade.skipped:
        reasons.setdefault(result.message.removeprefix("skipped: "), []).append(result.gate)
    for reason, names in reasons.items():
        console.print(f"[yellow]skipped[/] {', '.join(names)}: {escape(reason)}", highlight=False)


@app.command()
def serve(
    env_ids: list[str] = typer.Argument(None, help="Env ids to serve (default: every registered env)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8000, help="TCP port, 1-65535."),
    max_sessions: int = typer.Option(1024, help="Capacity (>= 1); more sessions get 503."),
    ttl_s: float = typer.Option(600.0, "--ttl-s",
                                help="Close sessions idle longer than this (seconds, > 0)."),
    step_timeout_s: float = typer.Option(60.0, "--step-timeout-s",
                                         help="Deadline of one env call from its start (seconds, > 0)."),
    threads: int = typer.Option(8, help="Threads that run env code, per worker process (>= 1)."),
    workers: int = typer.Option(1, help="Env-worker processes behind this one address (sessions stay in the "
                                "process that made them; a dead one is replaced). Use up to the number of "
                                "cores."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_TOKEN", help="Require this bearer token."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token (anyone who can "
                                             "reach it can create sessions and run env code)."),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, help="Larger request bodies get 413 (>= 1)."),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
) -> None:
    """Serve envs over HTTP (FastAPI + uvicorn). Docs at http://HOST:PORT/docs."""
    try:
        from agentgym.http.server import create_app
    except ImportError as exc:
        fail(ImportError(f"{exc}; install the server extra: pip install 'agentgym-rl[server]'"))
    try:
        check_range("--port", port, MIN_PORT, MAX_PORT)
        check_range("--threads", threads, 1)
        check_range("--workers", workers, 1)
        check_range("--max-sessions", max_sessions, 1)
        check_range("--ttl-s", ttl_s, 0, low_open=True)
        check_range("--step-timeout-s", step_timeout_s, 0, low_open=True)
        check_range("--max-body-bytes", max_body_bytes, 1)
        check_exposure(host, token, allow_no_token, "create sessions and run env code",
                       variable="AGENTGYM_TOKEN")
        sock = bind(host, port)  # before any worker process starts: an occupied port costs nothing
        service = create_app(
            env_ids or None, max_sessions=max_sessions, ttl_s=ttl_s, step_timeout_s=step_timeout_s,
            num_workers=threads, token=token, max_body_bytes=max_body_bytes,
        )
        if workers != 1:
            from agentgym.http.router import WorkerRouter
            from agentgym.http.workers import WorkerSet

            service = WorkerRouter(WorkerSet(workers, {
                "env_ids": env_ids or None, "max_sessions": max_sessions, "ttl_s": ttl_s,
                "step_timeout_s": step_timeout_s, "num_workers": threads, "token": token,
                "max_body_bytes": max_body_bytes}), max_body_bytes=max_body_bytes,
                timeout_s=(step_timeout_s if step_timeout_s > 0 else 600.0) + 60.0)
    except AgentGymError as exc:
        fail(exc)
    served = ", ".join(env_ids) if env_ids else "all registered envs"
    processes = f" in {workers} env-worker processes" if workers != 1 else ""
    err_console.print(f"serving {served} on http://{host}:{port}{processes} (docs: /docs)")
    run_uvicorn(service, sock, log_level=log_level)


@app.command()
def play(
    env_id: str = typer.Argument(..., help="Registered env id, e.g. maze-v0."),
    seed: int | None = typer.Option(None, help="Episode seed (default: random)."),
    url: str | None = typer.Option(None, help="Play against a service at this URL instead of in-process."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_TOKEN", help="Bearer token for --url."),
    expert: bool = typer.Option(False, "--expert", help="Let the env's expert play and print the episode."),
    max_turns: int | None = typer.Option(None, help="Override the turn budget."),
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
        fail(exc)


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
