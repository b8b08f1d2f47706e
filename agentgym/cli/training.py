"""Training commands: ``train`` and ``algorithms``."""

from __future__ import annotations

import errno
import os
import time
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.table import Table

from agentgym.cli.app import app, console, err_console, fail
from agentgym.errors import AgentGymError, ConfigError
from agentgym.run_folder import CURVE, REPORT, RunFolder
from agentgym.training.config.loading import list_presets

if TYPE_CHECKING:
    from agentgym.training.config.schema import TrainConfig

#: ``errno`` values of a failed write of the run folder (a full disk, a quota, a file-size limit...).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})

TRAIN_HELP = [
    f"Train a policy: SFT warm start (optional), then RL. Writes {REPORT} and {CURVE}.",
    "Ctrl-C stops after the current iteration and saves a checkpoint (a second Ctrl-C, or SIGTERM, stops at "
    "once); --resume DIR continues the run, and with --set iterations=N extends a finished one.",
]


def _train_help() -> str:
    presets = list_presets()
    shipped = ([f"Shipped presets (give the name, from any folder): {', '.join(presets)}"]
               if presets else [])
    return "\n\n".join(TRAIN_HELP + shipped)


@app.command(help=_train_help())
def train(
    config: str | None = typer.Argument(None, help="YAML config or preset name (default: the embedded "
                                                   "quickstart)."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set rollout.group_size=4 "
                                                     "(repeatable)."),
    out: str | None = typer.Option(None, help="New run folder (default: runs/<env>-<algorithm>-<time>)."),
    resume: str | None = typer.Option(None, help="Continue the run saved in this folder."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete the run already in --out first."),
    warm_start_only: bool = typer.Option(False, "--warm-start-only",
                                         help="Stop after the warm start (SFT and the evaluation before RL): "
                                              "runs with --set sft.from_run=DIR start RL from it."),
) -> None:
    from agentgym.training.run.loop import Trainer
    from agentgym.training.run.progress import make_progress, quiet_third_party_bars

    notes: list[str] = []
    # Under `accelerate launch` / torchrun every process runs this command; the main one talks.
    other_process = int(os.environ.get("RANK", "0")) > 0
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and out is None and resume is None:
            raise ConfigError("several training processes share one run folder: pass --out DIR "
                              "(a folder every process, on every node, can reach)")
        with quiet_third_party_bars():
            if warm_start_only and resume:
                raise ConfigError("--warm-start-only makes a new run's warm start; --resume continues a run "
                                  "past it: give one of them")
            cfg, folder = _config_and_folder(config, set_, out, resume, overwrite, notes)
            # Everything that can be checked is, before the folder is touched.
            trainer = Trainer(cfg, folder.path)
    except AgentGymError as exc:
        fail(exc)
    except KeyboardInterrupt:
        err_console.print("interrupted before the run started; nothing was written")
        raise typer.Exit(code=130) from None
    if other_process:
        try:
            trainer.run(resume=bool(resume), overwrite=overwrite, stop_after=0 if warm_start_only else None)
        except AgentGymError as exc:
            fail(exc)
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            _write_failed(exc, folder)
        finally:
            trainer.close()
        return
    for note in notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False, highlight=False)
    what = f"{cfg.algorithm.name} on {cfg.env.id}, {cfg.iterations} iterations of " \
           f"{cfg.rollout.num_tasks}×{cfg.rollout.group_size} episodes"
    console.print(f"agentgym train --resume {folder.path}: continuing {what}" if resume else
                  f"agentgym train {config or '(embedded quickstart)'}: {what} → {folder.path}",
                  soft_wrap=True, markup=False, highlight=False)
    try:
        with quiet_third_party_bars(), make_progress(console) as progress:
            report = trainer.run(resume=bool(resume), overwrite=overwrite, progress=progress,
                                 stop_after=0 if warm_start_only else None)
    except AgentGymError as exc:
        fail(exc)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        _write_failed(exc, folder)
    finally:
        trainer.close()
    if warm_start_only and report.get("stopped_after") == 0 and report["signal"] is None:
        console.print(f"Warm start saved in {folder.path}. Train from it with --set "
                      f"sft.from_run={folder.path} (any algorithm), or continue this run with: "
                      f"{folder.resume_command()}",
                      soft_wrap=True, markup=False, highlight=False)
        return
    if "stopped_after" in report:
        _print_stop(report, folder, cfg)
        raise typer.Exit(code=143 if report["signal"] == "SIGTERM" else 130)
    _print_report(report, folder)


def _config_and_folder(config: str | None, overrides: list[str], out: str | None, resume: str | None,
                       overwrite: bool, notes: list[str]) -> tuple[TrainConfig, RunFolder]:
    """The checked config and the run folder it may go into (nothing is written)."""
    from agentgym.training.config.loading import load_config
    from agentgym.training.config.schema import TrainConfig, config_to_dict
    from agentgym.training.run.checkpoint import checkpoint_iteration

    if resume:
        if out or overwrite:
            raise ConfigError("--resume DIR continues the run in DIR: leave out --out and --overwrite")
        folder = RunFolder(resume)
        folder.saved_config()  # says so when there is no run
        cfg = load_config(config or folder.config, overrides, on_note=notes.append)
        folder.check_resume(config_to_dict(cfg), checkpoint_iteration(folder.path),
                            defaults=config_to_dict(TrainConfig()))
        return cfg, folder
    cfg = load_config(config, overrides, on_note=notes.append)
    default = f"runs/{cfg.env.id.replace('/', '_')}-{cfg.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = RunFolder(out or default)
    folder.check_new(overwrite=overwrite)
    return cfg, folder


def _write_failed(exc: OSError, folder: RunFolder) -> NoReturn:
    """A file of the run could not be written (a full disk): say which, and how to go on, in one line."""
    where = exc.filename or folder.path
    then = (f"resume from the last checkpoint with: {folder.resume_command()}" if folder.has_checkpoint() else
            f"start the run again with: {folder.restart_command()}")
    err_console.print(f"error: writing {where} failed: {exc.strerror or exc}. Free some space, then {then}",
                      soft_wrap=True, markup=False, highlight=False)
    raise typer.Exit(code=1)


def _print_stop(report: dict[str, Any], folder: RunFolder, cfg: TrainConfig) -> None:
    signal, iteration = report["signal"], report["stopped_after"]
    if iteration is None:
        text = (f"Stopped ({signal}) before the first checkpoint: there is no checkpoint to resume. "
                f"Start the run again with: {folder.restart_command()}")
    elif report.get("abandoned") is not None:
        text = (f"Stopped ({signal}) during iteration {report['abandoned']} of {cfg.iterations}; the last "
                f"checkpoint, {folder.checkpoint}, holds iteration {iteration} (a resumed run does "
                f"iterations {iteration + 1}-{report['abandoned']} again; checkpoint_every=1 saves every "
                f"iteration). Resume with: {folder.resume_command()}")
    elif iteration == 0:
        text = (f"Stopped ({signal}) in iteration 1 of {cfg.iterations}; the warm start is saved in "
                f"{folder.checkpoint}. Resume with: {folder.resume_command()}")
    elif iteration >= cfg.iterations:
        text = (f"Stopped ({signal}) during the final evaluation; all {iteration} iterations are saved in "
                f"{folder.checkpoint}. Finish the run with: {folder.resume_command()}")
    else:
        text = (f"Stopped ({signal}) after iteration {iteration} of {cfg.iterations}; checkpoint saved in "
                f"{folder.checkpoint}. Resume with: {folder.resume_command()}")
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def _print_report(report: dict[str, Any], folder: RunFolder) -> None:
    from agentgym.rollout.summary import counts, interval_text

    before, after = report["eval"]["before"], report["eval"]["after"]
    table = Table(title=f"held-out evaluation ({counts(after)}, greedy)")
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
        table.add_row(name, f"{e['success_rate']:.0%}", interval_text(e), f"{e['mean_return']:.2f}",
                      f"{e['mean_turns']:.1f}", f"{e['invalid_rate']:.0%}")
    console.print(table)
    # Percentage points between the two rates as printed, not a relative change.
    points = round(after["success_rate"] * 100) - round(before["success_rate"] * 100)
    console.print(f"{report['algorithm']} took held-out success from {before['success_rate']:.0%} to "
                  f"{after['success_rate']:.0%} ([bold]{points:+d} points[/]) in "
                  f"{report['wall_time_s'] / 60:.1f} min.",
                  soft_wrap=True, highlight=False)
    console.print(f"Report: {folder.report}, curve: {folder.curve}", soft_wrap=True,
                  markup=False, highlight=False)


@app.command()
def algorithms() -> None:
    """List the registered algorithms, policy losses, loss terms and rollout-hook options."""
    from agentgym.training.api.algorithm import list_algorithms
    from agentgym.training.api.options import HOOK_OPTIONS
    from agentgym.training.api.terms import LOSS_TERMS
    from agentgym.training.engine.losses import list_policy_losses

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
