"""Training commands: ``train`` and ``algorithms``."""

from __future__ import annotations

import typer
from rich.table import Table

from agentgym.cli.app import app, console, fail
from agentgym.errors import AgentGymError


@app.command()
def train(
    config: str | None = typer.Argument(None, help="YAML config (default: the embedded quickstart)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set rollout.group_size=4 (repeatable)."),
    out: str | None = typer.Option(None, help="Run folder (default: runs/<env>-<algorithm>-<time>)."),
    resume: str | None = typer.Option(None, help="Continue the run saved in this folder."),
) -> None:
    """Train a policy: SFT warm start (optional), then RL. Writes report.json and learning_curve.png."""
    import json
    import time
    from pathlib import Path

    from agentgym.training.loading import config_from_dict, load_config

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
        fail(exc)
    from agentgym.training.loop import train as run_training

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
            fail(exc)
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


@app.command()
def algorithms() -> None:
    """List the registered algorithms, policy losses, loss terms and rollout-hook options."""
    from agentgym.training.algorithm import list_algorithms
    from agentgym.training.losses import list_policy_losses
    from agentgym.training.options import HOOK_OPTIONS
    from agentgym.training.terms import LOSS_TERMS

    table = Table(title="registered algorithms (algorithm.name)")
    table.add_column("name", style="bold cyan")
    table.add_column("policy loss")
    table.add_column("min group", justify="right")
    table.add_column("description")
    for algo in list_algorithms():
        table.add_row(algo.name, algo.policy_loss, str(algo.min_group_size), algo.description)
    console.print(table)
    console.print(f"policy losses (loss.loss_mode): {', '.join(list_policy_losses())}")
    console.print("loss terms (loss.terms): " + ", ".join(
        f"{name} ({LOSS_TERMS.get(name).description})" if LOSS_TERMS.get(name).description else name
        for name in LOSS_TERMS.names()))
    console.print(f"rollout-hook options (algorithm.hooks): {', '.join(HOOK_OPTIONS.names()) or 'none'}")
