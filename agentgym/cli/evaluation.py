"""The ``eval`` command: policies × envs → success rates, reports and trajectory logs."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from agentgym.cli.app import app, console, err_console, fail
from agentgym.errors import AgentGymError, ConfigError
from agentgym.eval.store import NO_SPACE, EvalStore


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: ``0-19``, ``1,5,9`` or a mix (``0-4,100``).

    Raises:
        ConfigError: a part that is not a seed or a range, a range that runs backwards, or no seed at all.

    Example:
        >>> parse_seeds("0-3,10")
        [0, 1, 2, 3, 10]
    """
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, sep, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if sep else (int(part), int(part))
        except ValueError:
            raise ConfigError(f"--seeds {text!r}: {part!r} is not a seed or a range like 0-19") from None
        if last < first:
            raise ConfigError(f"--seeds {text!r}: the range {part} runs backwards; "
                              f"write it low-high ({last}-{first})")
        seeds += range(first, last + 1)
    if not seeds:
        raise ConfigError(f"--seeds {text!r} lists no seed; give seeds like 0-19 or 1,5,9")
    return seeds


def parse_task_range(text: str) -> list[int]:
    """``--task-range START:END``: the task indices START..END-1 of the split (END excluded, as in Python).

    Raises:
        ConfigError: not two whole numbers around a colon, a negative START, or END not above START.

    Example:
        >>> parse_task_range("0:5"), parse_task_range(" 10:12 ")
        ([0, 1, 2, 3, 4], [10, 11])
    """
    low, sep, high = text.strip().partition(":")
    try:
        start, end = int(low), int(high)
    except ValueError:
        start = end = -1
    if not sep or start < 0 or end <= start:
        raise ConfigError(f"--task-range {text!r}: write START:END with 0 <= START < END, e.g. 0:50 for the "
                          "split's tasks 0..49")
    return list(range(start, end))


def read_judge(path: str) -> dict[str, Any]:
    """``--judge FILE``: judge settings from a JSON or YAML file, with ``JudgeSettings``' field names
    (``agentgym.sources.env_source.JUDGE_FIELDS``).

    Raises:
        ConfigError: the file is missing or unreadable, or its settings are not a judge's.
    """
    import yaml

    from agentgym.sources.env_source import check_judge_settings

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--judge {path}: cannot read it ({exc.strerror or exc}); give a JSON or YAML file "
                          "with base_url, model and rubric") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--judge {path}: not JSON or YAML ({str(exc).splitlines()[0]})") from None
    return check_judge_settings(data, f"--judge {path}")


def _yaml_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _made_with_defaults(env_id: str) -> bool:
    """The env can be made without arguments (``--envs all`` leaves out those that need some: mcp-v0's
    server and tasks)."""
    import agentgym

    try:
        agentgym.make(env_id).close()
    except ConfigError:
        return False
    return True


def env_entries(envs: str | None, env_args: list[str], env_urls: list[str], split: str | None,
                max_turns: int | None, policies: list[Any], harness: str | None = None,
                tasks: str | None = None, judge: dict[str, Any] | None = None) -> list[Any]:
    """The ``EnvEntry`` list of ``--envs``, ``--env-arg``, ``--env-url``, ``--split``, ``--max-turns``,
    ``--judge`` and ``--harness``/``--tasks`` (your agent on your tasks: ``harness-v0`` with those
    arguments).

    With no ``--envs``, the envs of the run folders among the policies (and of the runs that endpoints
    among them serve: ``agentgym serve-policy RUN``), with the kwargs, turn budget and judge
    (``env.judge``) they trained with. ``--envs all`` is every built-in env. ``--split``
    (a task split, which every env plays its tasks of) and ``--judge`` (settings checked by
    ``check_judge_settings``) go to every env.

    Raises:
        ConfigError: no envs and no run folder, a malformed ``--env-arg``/``--env-url``, or a run's
            ``env.judge`` that is not a judge's settings.
    """
    import agentgym
    from agentgym.eval.plan import EnvEntry
    from agentgym.sources.env_source import check_judge_settings

    runs = [p.run_config for p in policies if p.run_config is not None]  # run folders and served runs
    defaults: dict[str, tuple[dict[str, Any], int | None]] = {}
    judges: dict[str, dict[str, Any]] = {}
    if (harness is None) != (tasks is None):
        raise ConfigError("--harness and --tasks go together: the agent to run (module:function or a "
                          "command) and its JSONL tasks")
    if harness is not None:
        defaults["harness-v0"] = ({"harness": harness, "tasks": tasks}, None)
        envs = "harness-v0" if envs is None else f"{envs},harness-v0"
    if envs is None:
        if not runs:
            raise ConfigError("give the envs to evaluate: --envs ID[,ID...] (or --envs all); "
                              "`agentgym envs` lists them")
        for spec in (p for p in policies if p.run_config is not None):
            env = spec.run_config.get("env")
            if not isinstance(env, dict) or not isinstance(env.get("id"), str):
                raise ConfigError(f"policy {spec.text!r}: the run's config.json names no env (env.id); "
                                  "restore it, or give the envs with --envs ID[,ID...]")
        ids = list(dict.fromkeys(r["env"]["id"] for r in runs))
        for run in runs:  # the run's own env settings: what its held-out evaluation played
            own = {key: run["env"][key] for key in ("harness", "tasks") if run["env"].get(key)}
            defaults.setdefault(run["env"]["id"],
                                ({**(run["env"].get("kwargs") or {}), **own}, run["env"].get("max_turns")))
            if run["env"].get("judge") is not None:  # judged in training: judged here too, so numbers compare
                judges.setdefault(run["env"]["id"],
                                  check_judge_settings(run["env"]["judge"], "the run's env.judge"))
    elif envs.strip() == "all":
        ids = [spec.id for spec in agentgym.list_envs()
               if str(spec.entry_point).startswith("agentgym.envs.") and _made_with_defaults(spec.id)]
    else:
        ids = [e.strip() for e in envs.split(",") if e.strip()]
    kwargs: dict[str, dict[str, Any]] = {i: dict(defaults.get(i, ({}, None))[0]) for i in ids}
    for item in env_args:
        env_id, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or env_id not in kwargs:
            raise ConfigError(f"--env-arg {item!r}: write ENV_ID:KEY=VALUE with ENV_ID one of "
                              f"{', '.join(ids)}")
        kwargs[env_id][key] = _yaml_value(value)
    urls: dict[str, str] = {}
    for item in env_urls:
        env_id, eq, url = ("", "", item) if item.startswith(("http://", "https://")) else item.partition("=")
        if eq and env_id not in kwargs:
            raise ConfigError(f"--env-url {item!r}: {env_id!r} is not one of the envs evaluated "
                              f"({', '.join(ids)})")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--env-url {item!r}: give URL or ENV_ID=URL with an http(s):// URL")
        for target in ([env_id] if eq else ids):
            urls[target] = url
    return [EnvEntry(i, kwargs[i], max_turns if max_turns is not None else defaults.get(i, ({}, None))[1],
                     urls.get(i), split, judge if judge is not None else judges.get(i)) for i in ids]


def _runs_held_out_split(specs: list[Any]) -> str | None:
    """The ``eval.split`` the run folders among ``specs`` were evaluated on, when they share one: their
    envs are then played on its tasks, so numbers compare with report.json's; else None."""
    splits = {(s.run_config or {}).get("eval", {}).get("split") for s in specs if s.run_config is not None}
    return splits.pop() if len(splits) == 1 and None not in splits else None


def _task_seeds(specs: list[Any], seeds: str | None, episodes: int | None, split: str | None,
                task_range: str | None) -> list[int]:
    """The plan's tasks: indices of ``--split`` (``--task-range``, default ``0:--episodes``), else the
    ``--seeds``, else ``--episodes`` seeds from the held-out start (a run folder's ``eval.seed_offset``)."""
    from agentgym.eval.harness import DEFAULT_SEED_START

    count = 20 if episodes is None else episodes
    if split is not None:
        if seeds:
            raise ConfigError("--seeds picks reset seeds; with --split the tasks are indices of the split: "
                              "give --task-range START:END instead")
        chosen = parse_task_range(task_range) if task_range else list(range(count))
        if task_range and episodes is not None and episodes != len(chosen):
            raise ConfigError(f"--task-range gives {len(chosen)} tasks but --episodes says {episodes}; "
                              "drop one")
        return chosen
    if task_range is not None:
        raise ConfigError("--task-range picks tasks of a task split: give --split NAME too (`agentgym envs "
                          "--tasks ENV_ID` lists an env's splits)")
    # Run folders were evaluated from their own eval.seed_offset: start there, so numbers compare.
    offsets = {int((s.run_config or {}).get("eval", {}).get("seed_offset", DEFAULT_SEED_START))
               for s in specs if s.run_config is not None}
    start = offsets.pop() if len(offsets) == 1 else DEFAULT_SEED_START
    chosen = parse_seeds(seeds) if seeds else list(range(start, start + count))
    if seeds and episodes is not None and episodes != len(chosen):
        raise ConfigError(f"--seeds gives {len(chosen)} tasks but --episodes says {episodes}; drop one")
    return chosen


def served_run_notes(plan: Any, env_args: list[str], given: set[str]) -> list[str]:
    """One line per endpoint that serves a run (``agentgym serve-policy RUN``): the settings the plan took
    from that run, as it takes them from a run folder. ``given`` names the flags the user set (``envs``,
    ``max_turns``, ``seeds``, ``split``, ``judge``), which win over the run's settings, as do
    ``env_args`` and the policy's own options.
    """
    from dataclasses import fields

    from agentgym.rollout.prompt import PromptSettings

    defaults = PromptSettings()
    notes = []
    for spec in plan.policies:
        if spec.kind != "endpoint" or spec.run_config is None:
            continue
        run_env, run_eval = spec.run_config["env"], spec.run_config.get("eval") or {}
        taken: list[str] = []
        entry = next((e for e in plan.envs if e.id == run_env["id"]), None)
        if entry is not None and "envs" not in given:
            set_by_flag = {a.partition(":")[2].partition("=")[0] for a in env_args
                           if a.partition(":")[0] == entry.id}
            own = {**(run_env.get("kwargs") or {}),
                   **{k: run_env[k] for k in ("harness", "tasks") if k in run_env}}
            kwargs = [f"{k}={v}" for k, v in own.items() if k not in set_by_flag and entry.kwargs.get(k) == v]
            if "max_turns" not in given and run_env.get("max_turns") is not None \
                    and entry.max_turns == run_env["max_turns"]:
                kwargs.append(f"max_turns={entry.max_turns}")
            taken.append(f"env {entry.id}" + (f" ({', '.join(kwargs)})" if kwargs else ""))
            if "judge" not in given and entry.judge is not None and entry.judge == run_env.get("judge"):
                taken.append(f"judge {entry.judge.get('model')}")
            if "split" not in given and "seeds" not in given and entry.split is not None \
                    and entry.split == run_eval.get("split"):
                taken.append(f"split {entry.split!r} (its eval.split)")
        if "seeds" not in given and "split" not in given and all(e.split is None for e in plan.envs) \
                and run_eval.get("seed_offset") is not None and plan.seeds[0] == run_eval["seed_offset"]:
            taken.append(f"seeds {plan.seeds[0]}..{plan.seeds[-1]} (its eval.seed_offset)")
        options = spec.options
        prompt = [f"{f.name}={getattr(spec.prompt, f.name)}" for f in fields(PromptSettings)
                  if f.name not in options and getattr(spec.prompt, f.name) != getattr(defaults, f.name)]
        if prompt:
            taken.append(f"prompt settings ({', '.join(prompt)})")
        notes.append(f"policy {spec.name!r} serves an `agentgym train` run; from it: {'; '.join(taken)}"
                     if taken else f"policy {spec.name!r} serves an `agentgym train` run; the flags given "
                     "override all its settings")
    return notes


def _check_out(out: Path) -> None:
    """``--out`` must be a folder, or a path where one can be made."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = f"--out {out}" if path == out else f"--out {out}: {path}"
                raise ConfigError(f"{where} is a file, not a folder; give --out a folder (a new one, or an "
                                  "evaluation's folder with --resume)")
            return


def _saved_plan(out: Path, concurrency: int) -> Any:
    """The plan saved in ``out`` (``--resume`` without ``--policy``), run at ``concurrency``."""
    from agentgym.eval.plan import EvalPlan

    data = EvalStore(out).read_plan()
    plan = EvalPlan.from_json(data, source=str(out / "plan.json"))
    return EvalPlan(plan.policies, plan.envs, plan.seeds, plan.samples, plan.temperature, plan.sampling_seed,
                    concurrency)


def _print_results(results: dict[str, Any], out: Path) -> None:
    from agentgym.eval.report import plays_text, results_table

    rows = results_table(results)
    table = Table(title=f"evaluation (per env: {plays_text(results)})")
    for name in rows[0]:
        table.add_column(name, justify="left" if name in ("env", "policy") else "right")
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    for comparison in results["comparisons"]:
        style = "green" if comparison["significant"] else "dim"
        console.print(f"[{style}]{comparison['verdict']}[/]", markup=True, highlight=False)
    console.print(f"Report: {out}/report.md, {out}/report.html; results: {out}/results.json; "
                  f"trajectories: {out}/trajectories/ (agentgym view {out})")


def say_missing(results: dict[str, Any], out: Path) -> bool:
    """Print one line per (env, policy) whose saved episodes fall short of the plan; True if any does."""
    samples = int(results["config"]["samples"])
    short = [row for row in results["results"] if row.get("missing")]
    for row in short:
        seeds = ", ".join(str(m["seed"]) + (f" (sample {m['sample']})" if samples > 1 else "")
                          for m in row["missing"])
        which = "task seeds" if row.get("split") is None else f"task indices of split {row['split']}"
        err_console.print(f"[bold red]incomplete:[/] {row['env']} × {row['policy']}: "
                          f"{len(row['missing'])} of "
                          f"{len(results['seeds']) * samples} episodes missing, {which} {seeds}; "
                          f"`agentgym eval --out {out} --resume` plays them", soft_wrap=True, highlight=False)
    return bool(short)


def _print_early_ends(results: dict[str, Any], out: Path) -> None:
    """Say, per env and policy, how many episodes ended before their first action and why (their notes):
    a 0% from a model that never got to act must not pass for a score."""
    from collections import Counter

    store = EvalStore(out)
    for row in results["results"]:
        records = store.records(row["env"], row["policy"])
        reasons = Counter(str(r["note"]) for r in records if r.get("note") and not r.get("turns"))
        for reason, count in reasons.most_common():
            hint = (" (lower max_new_tokens or the prompt's length with the policy's options, or serve the "
                    "run folder itself so its prompt settings come along)" if "context" in reason else "")
            err_console.print(f"[bold yellow]warning:[/] {escape(row['env'])} × {escape(row['policy'])}: "
                              f"{count} of {len(records)} episodes ended before their first action: "
                              f"{escape(reason)}{hint}", soft_wrap=True, highlight=False)


@app.command("eval")
def evaluate(
    policy: list[str] = typer.Option([], "--policy", help="random | expert | MODEL_DIR | "
                                     "ORG/NAME[@REVISION] (a Hub id) | RUN[/checkpoint.pt] | "
                                     "http://HOST:PORT/v1[,model=NAME][,api=chat|completions] (repeatable; "
                                     "options ,name=LABEL,max_new_tokens=N,...)."),
    envs: str | None = typer.Option(None, "--envs", help="Env ids, comma-separated, or 'all' (default: "
                                    "the env of the run folders given as policies, on their eval.split "
                                    "if they name one)."),
    episodes: int | None = typer.Option(None, "--episodes", help="Tasks per env, each played --samples times "
                                        "per policy (default 20, or as many as --seeds lists)."),
    seeds: str | None = typer.Option(None, "--seeds", help="Task seeds, e.g. 0-19 or 1,5,9 (default: 1000000 "
                                     "onwards, the held-out range training's evaluations use, or a run "
                                     "folder's eval.seed_offset); not with --split."),
    split: str | None = typer.Option(None, "--split", help="Play the tasks of this task split of every env "
                                     "(`agentgym envs --tasks ENV_ID` lists them), task i as reset(options="
                                     "{split, index: i}); with --task-range."),
    task_range: str | None = typer.Option(None, "--task-range", help="With --split: the task indices "
                                          "START:END (END excluded; default 0:--episodes)."),
    samples: int = typer.Option(1, "--samples", help="Episodes per task and policy; K > 1 reports pass@k."),
    concurrency: int = typer.Option(32, "--concurrency", help="Episodes in flight at once."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature of model "
                                             "policies (default: 0, greedy, with one sample; 1 with more)."),
    sampling_seed: int = typer.Option(0, "--sampling-seed",
                                      help="Seeds model sampling and the random policy."),
    max_turns: int | None = typer.Option(None, "--max-turns", help="Override every env's turn budget."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env argument ENV_ID:KEY=VALUE (repeatable)."),
    harness: str | None = typer.Option(None, "--harness", help="Evaluate your own agent: module:function or "
                                       "a command line, run once per episode against each policy (with "
                                       "--tasks)."),
    tasks: str | None = typer.Option(None, "--tasks", help="With --harness: the JSONL tasks it runs on."),
    judge: str | None = typer.Option(None, "--judge", help="Judge every episode: a JSON or YAML file of "
                                     "judge settings (training's env.judge fields: base_url, model, rubric, "
                                     "mode, ...); rewards are then the judge's scores. A run folder trained "
                                     "with env.judge is judged the same way without it."),
    env_url: list[str] = typer.Option([], "--env-url", help="Play envs on an env service: URL (every env) or "
                                      "ENV_ID=URL (repeatable)."),
    env_token: str | None = typer.Option(None, "--env-token", envvar="AGENTGYM_TOKEN",
                                         help="Env service token."),
    out: str | None = typer.Option(None, "--out", help="Output folder (default: runs/eval-<time>)."),
    resume: bool = typer.Option(False, "--resume", help="Complete the evaluation saved in --out."),
) -> None:
    """Evaluate policies on envs: success (95% CI), return, turns, tokens, invalid actions, pass@k, paired
    comparisons. Writes results.json, report.md, report.html and every trajectory as JSONL."""
    flags = _EvalFlags(policy=policy, envs=envs, episodes=episodes, seeds=seeds, split=split,
                       task_range=task_range, samples=samples, concurrency=concurrency,
                       temperature=temperature, sampling_seed=sampling_seed, max_turns=max_turns,
                       env_arg=env_arg, harness=harness, tasks=tasks, judge=judge, env_url=env_url, out=out,
                       resume=resume)
    try:
        plan = flags.plan()
        out_dir = Path(out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    except AgentGymError as exc:
        fail(exc)
    _announce(plan, out_dir, flags)
    if resume:
        try:
            EvalStore(out_dir, on_notice=_note).mend()  # cut last lines set aside before anything is appended
        except AgentGymError as exc:
            fail(exc)
    results = _play(plan, out_dir, resume=resume, env_token=env_token)
    _print_results(results, out_dir)
    _print_early_ends(results, out_dir)
    if say_missing(results, out_dir):
        raise typer.Exit(code=1)


@dataclass(frozen=True)
class _EvalFlags:
    """The flags of one ``agentgym eval`` that choose what it plays (see ``evaluate`` for each)."""

    policy: list[str]
    envs: str | None
    episodes: int | None
    seeds: str | None
    split: str | None
    task_range: str | None
    samples: int
    concurrency: int
    temperature: float | None
    sampling_seed: int
    max_turns: int | None
    env_arg: list[str]
    harness: str | None
    tasks: str | None
    judge: str | None
    env_url: list[str]
    out: str | None
    resume: bool

    def given(self) -> set[str]:
        """The flags set on the command line whose settings win over a served run's (``served_run_notes``)."""
        flags = {"envs": self.envs, "max_turns": self.max_turns, "seeds": self.seeds, "split": self.split,
                 "judge": self.judge}
        return {k for k, v in flags.items() if v is not None}

    def plan(self) -> Any:
        """The ``EvalPlan`` to play: the one saved in ``--out`` (``--resume`` without ``--policy``), or the
        flags' own.

        Raises:
            AgentGymError: a flag, a policy, an env or a file it names is wrong (the message says which).
        """
        from agentgym.eval.plan import EvalPlan
        from agentgym.eval.policies import parse_policy

        if self.resume and self.out is None:
            raise ConfigError("--resume needs --out DIR, the folder of the evaluation to complete")
        if self.out is not None:
            _check_out(Path(self.out))
        if self.resume:  # checked even when --policy restates the plan: a damaged plan.json is named here
            saved_plan = _saved_plan(Path(self.out), self.concurrency)  # type: ignore[arg-type]
            if not self.policy:
                return saved_plan
        specs = [parse_policy(p) for p in self.policy]
        if not specs:
            raise ConfigError("give at least one --policy (random, expert, a model directory, a run "
                              "folder or an http://HOST:PORT/v1 endpoint)")
        split = self.split
        if split is None and self.envs is None and self.seeds is None:
            split = _runs_held_out_split(specs)
        task_seeds = _task_seeds(specs, self.seeds, self.episodes, split, self.task_range)
        judge_settings = read_judge(self.judge) if self.judge is not None else None
        entries = env_entries(self.envs, self.env_arg, self.env_url, split, self.max_turns, specs,
                              self.harness, self.tasks, judge_settings)
        temperature = self.temperature
        if temperature is None:  # greedy for one sample; several samples of a greedy policy would be one
            temperature = 0.0 if self.samples == 1 else 1.0
        return EvalPlan(tuple(specs), tuple(entries), tuple(task_seeds), self.samples, temperature,
                        self.sampling_seed, self.concurrency)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _note(text: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True, highlight=False)


def _announce(plan: Any, out_dir: Path, flags: _EvalFlags) -> None:
    """Say what the evaluation plays and where it writes, before it starts."""
    total = len(plan.seeds) * plan.samples
    err_console.print(f"[bold]agentgym eval[/] "
                      f"{_count(len(plan.policies), 'policy').replace('policys', 'policies')} × "
                      f"{_count(len(plan.envs), 'env')} × {_count(total, 'episode')} → {out_dir}")
    # A served run's settings are applied like a run folder's: say which, so none pass unseen.
    if flags.policy:
        for line in served_run_notes(plan, flags.env_arg, flags.given()):
            _note(line)


def _play(plan: Any, out_dir: Path, *, resume: bool, env_token: str | None) -> dict[str, Any]:
    """Play the plan's episodes (those not saved yet, with ``resume``) with a progress bar per env and
    policy, and return the results; an error, a full disk or Ctrl-C ends the command with one line."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from agentgym.eval.harness import Evaluation

    command = shlex.join(["agentgym", *sys.argv[1:]])
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console) as progress:
        bars: dict[tuple[str, str], Any] = {}

        def on_progress(env: str, name: str, done: int, all_: int) -> None:
            key = (env, name)
            if key not in bars:
                bars[key] = progress.add_task(f"{env} × {name}", total=all_, completed=done)
            progress.update(bars[key], completed=done)

        evaluation = Evaluation(plan, out_dir, resume=resume, env_token=env_token, on_progress=on_progress,
                                command=command)
        evaluation.store.on_notice = _note
        try:
            return evaluation.run()
        except AgentGymError as exc:
            progress.stop()
            fail(exc)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            progress.stop()  # a report file, written after the episodes, met the full disk
            fail(evaluation.store.write_error(Path(exc.filename) if exc.filename else None, exc))
        except KeyboardInterrupt:
            progress.stop()
            err_console.print(f"[yellow]interrupted[/]: finished episodes are saved in {out_dir}; "
                              f"`agentgym eval --out {out_dir} --resume` plays the rest")
            raise typer.Exit(code=130) from None
