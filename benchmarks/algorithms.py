"""Every algorithm and option on the same tasks, seeds and budget: learning, speed and memory.

    python benchmarks/algorithms.py [--variants grpo hgpo ...] [--tasks maze maze3] [--seeds 0 1 2]
                                    [--iterations 60] [--jobs 2] [--set key=value ...] [--tag NAME]
    python benchmarks/algorithms.py --model smollm2 --tasks search-qa2 --variants grpo igpo arpo \
                                    --iterations 15
    python benchmarks/algorithms.py --model smollm2 --tasks maze3 --variants grpo gigpo hgpo graphgpo \
                                    --iterations 15 --jobs 2 --work DIR [--status]   # over several sittings
    python benchmarks/algorithms.py --update-cost --variants grpo seeupo   # the update step alone

A *variant* is a preset, ``configs/quickstart_maze_<variant>.yaml`` (``grpo``, ``rloo``, ``gigpo``,
``hgpo``, ``graphgpo``, ``ppo`` (a learned critic), ``seeupo``, and the options on top of GRPO:
``gspo``, ``dapo``, ``epo``, ``llds``); a *task* changes only the env (``maze``: the quickstart as is;
``maze3``: 3×3-cell mazes with 20 turns, a longer horizon; ``webshop``: ``webshop-v0``, trained on its
train goals and evaluated on its test goals), except the tool tasks ``search-qa``, ``search-qa2``
(questions of one or two hops) and ``code-math`` (the arithmetic drill: run the expression in the Python
tool, answer its value), whose presets are ``configs/search_qa_<variant>_tiny.yaml`` and
``configs/code_math_<variant>_tiny.yaml`` (``grpo``, ``gigpo``, ``igpo``, ``arpo``); a variant without a
preset for a task is skipped. On tool tasks a second table gives tool calls per episode (held-out) and run
per task (training: a branch's copied turns are not run again), tokens generated per task, and the time of
IGPO's scoring pass and of all rollout hooks as a fraction of generation time. ``--set`` adds overrides to
every run (e.g. a higher learning rate to provoke a collapse) and ``--tag`` names such an experiment.
``--model smollm2`` puts the packaged real model behind every preset (``MODELS``: its learning rates, an
instruct model's prompts, the cheaper-update options). Each run is its own process with one torch thread
(``--threads``), so peak memory is the run's own (``ru_maxrss``) and ``--jobs`` runs can share the machine.
The variants of a seed share one warm start (SFT and the evaluation before RL), made by the first of them
and cached (``shared_warm_start``); RL from it is exactly what each run would have done from its own, and
``wall_s`` then leaves it out. ``--own-warm-starts`` makes each run do its own.

Results accumulate in ``benchmarks/results/algorithms.json`` (``--results``) keyed by (model, tag, task,
variant, seed, iterations): a run already there is not repeated, so a grid can be filled over several
invocations, also at the same time. Each row holds ``started_commit`` (the checkout its run executed) and
``provenance`` (commit, command and machine when the row was saved). With ``--work DIR`` each run trains in
``DIR/<model>_<tag>_<task>_<variant>_seed<seed>``, checkpointed every iteration: a run whose process was
stopped or killed goes on from its last finished iteration when the command runs again (exactly the run
it would have been), and its row says after which iterations it ``resumed`` and the ``commits`` each
process started at; the folder goes once the row is saved. ``--status`` only prints, per run of the grid,
whether its row is in, how far its ``--work`` folder got, or that it is to run.
Prints one markdown table per task and writes ``results/algorithms_<tag>_<task>.png`` beside ``--results``
(training success and the sampled-token entropy estimate per iteration, mean over seeds). ``--update-cost``
times only the update step of each variant on one shared batch and counts its forward passes
(SeeUPO's extra cost: one phase per turn index, each with its own passes).

Columns: held-out success before and after RL (greedy, 64 episodes on seeds training never sees;
mean ± std over seeds), iterations until the training success (mean of 3 iterations) first reaches the
task's threshold, seconds per iteration, peak resident memory, update phases per iteration, and the
mean negative log-prob per sampled response token in the first and last 5 iterations (an estimate of
the sampling entropy: it falls towards 0 when the policy collapses onto deterministic answers).
A second table compares each variant with the first one listed, per seed, task by task on the held-out
tasks both played (``paired_table``: McNemar's exact test; rows keep each seed's outcome in
``after_by_task``, played on ``eval_seeds``, whose tasks ``eval_task_ids`` name: seeds that reset to the
same task are paired as one task).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from provenance import child_run, commit, provenance, run_child

from agentgym.rollout.episode_log import EpisodeLog, groups_of
from agentgym.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_FILE = RESULTS / "algorithms.json"
VARIANTS = ["grpo", "rloo", "gigpo", "hgpo", "graphgpo", "ppo", "seeupo", "gspo", "dapo", "epo", "llds",
            "igpo", "arpo"]
#: task name → (overrides on top of the variant's preset, training-success threshold)
TASKS: dict[str, tuple[list[str], float]] = {
    "maze": ([], 0.8),
    "maze3": (["env.kwargs.size=3", "env.max_turns=20"], 0.6),
    # Every variant at the igpo/arpo presets' learning rate (the GRPO preset's 5e-4 doubled): one budget for
    # all.
    "search-qa": (["optim.lr=0.001"], 0.5),
    # The code-math presets share one learning rate already.
    "code-math": ([], 0.6),
    # Questions of one or two hops (search an entity, then the entity its document names), four turns.
    "search-qa2": (["env.kwargs.max_hops=2", "env.max_turns=4"], 0.5),
    # WebShop-style shopping (search, open a product, choose its options, buy; the expert takes 4.5 turns):
    # trained on the catalog's train goals, evaluated on its test goals; 8 turns. Made for --model smollm2
    # (a whole search query is up to 30 of its tokens). Pages run to 1,600 bytes, so a tiny model gets the
    # positions they need (``model.tiny`` is inert with ``model.path`` set, but it is a field the warm start
    # reads: moving it would re-key the cached SmolLM2 warm starts).
    "webshop": (["env.id=webshop-v0", "env.kwargs={}", "env.max_turns=8", "env.train_split=train",
                 "eval.split=test", "model.tiny.max_position_embeddings=4096"], 0.5),
}
#: model name → overrides applied after the task's, putting that model behind every preset: the packaged
#: real model (SmolLM2-135M-Instruct) with the learning rates it needs, the prompts and reply lengths of an
#: instruct model (the protocol stated, no copy constraint), a few short SFT epochs, and the cheaper-update
#: options (docs/training.md, "Cheaper updates"). Each variant's algorithm settings stay as its preset has
#: them. ``configs/search_qa_grpo_smollm2.yaml`` is the GRPO row of ``search-qa2`` written out (it also
#: evaluates the untrained model).
MODELS: dict[str, list[str]] = {
    "tiny": [],
    "smollm2": [
        "model.path=smollm2", "rollout.num_tasks=4", "rollout.include_instructions=true",
        "rollout.constraint=null", "rollout.max_new_tokens=32", "rollout.max_prompt_tokens=1024",
        "optim.lr=1e-5", "optim.num_minibatches=1", "optim.micro_batch_tokens=4096",
        "optim.response_logits=true", "optim.share_prefixes=true", "optim.old_logprobs_from_update=true",
        "sft.num_episodes=16", "sft.num_epochs=3", "sft.lr=5e-5", "sft.batch_size=8", "eval.num_episodes=32",
        "eval.before_sft=false",  # the untrained model fails every episode slowly, its replies at the limit
    ],
}
#: (task, model) → overrides applied after the model's: what one task needs from one model alone.
TASK_MODEL: dict[tuple[str, str], list[str]] = {
    # The byte-level tiny model: a search query takes up to 150 bytes.
    ("webshop", "tiny"): ["rollout.max_new_tokens=160"],
}
#: task name → the variant's preset (a variant without a preset for a task is not run on it)
PRESETS: dict[str, str] = {
    "maze": "quickstart_maze_{variant}.yaml",
    "maze3": "quickstart_maze_{variant}.yaml",
    "search-qa": "search_qa_{variant}_tiny.yaml",
    "search-qa2": "search_qa_{variant}_tiny.yaml",
    "code-math": "code_math_{variant}_tiny.yaml",
    "webshop": "quickstart_maze_{variant}.yaml",
}


def preset(task: str, variant: str) -> Path:
    """The config file of ``variant`` on ``task``."""
    return ROOT / "configs" / PRESETS[task].format(variant=variant)


def first_reaching(history: list[dict], threshold: float, window: int = 3) -> int | None:
    """First iteration where the mean training success over the last ``window`` iterations ≥ threshold."""
    rates = [h["rollout/success_rate"] for h in history]
    for i in range(window - 1, len(rates)):
        if sum(rates[i - window + 1:i + 1]) / window >= threshold:
            return history[i]["iteration"]
    return None


def trajectory_statistics(out: Path, iterations: int) -> dict[str, Any]:
    """What a run's recorded trajectories say, in one pass over them.

    Per iteration: ``nll_per_token``, the mean −log-prob per sampled response token (all turns), and
    ``success_logprob_per_token``, the mean log-prob per token of the turns of successful trajectories (nan
    when none succeeded). Mean over iterations, per task: ``tool_calls_per_task``, the tool calls the env ran,
    and ``gen_tokens_per_task``, the tokens the policy generated; a fork's copied turns (before
    ``fork_turn``) were neither run nor generated again and are not counted there.
    """
    nll, success_lp = [], []
    calls = tokens = tasks = 0.0
    for iteration in range(1, iterations + 1):
        total = count = s_total = s_count = 0.0
        for group in groups_of(EpisodeLog(RunFolder(out).trajectory_file(iteration), iteration).read()):
            tasks += 1
            for trajectory in group.trajectories:
                for index, turn in enumerate(trajectory.turns):
                    logprobs = turn.response_logprobs
                    total -= sum(logprobs)
                    count += len(logprobs)
                    if trajectory.success:
                        s_total += sum(logprobs)
                        s_count += len(logprobs)
                    if index >= (trajectory.fork_turn or 0):
                        calls += turn.tool_calls
                        tokens += len(turn.response_ids)
        nll.append(total / count if count else float("nan"))
        success_lp.append(s_total / s_count if s_count else float("nan"))
    return {"nll_per_token": nll, "success_logprob_per_token": success_lp,
            "tool_calls_per_task": calls / max(tasks, 1.0), "gen_tokens_per_task": tokens / max(tasks, 1.0)}


def run_name(spec: dict) -> str:
    """The folder ``--keep`` gives a run: ``<model>_<tag>_<task>_<variant>_seed<seed>``."""
    return f"{spec.get('model', 'tiny')}_{spec['tag']}_{spec['task']}_{spec['variant']}_seed{spec['seed']}"


def run_one(spec: dict) -> dict:
    """One training run (in this process); returns its row of results."""
    import resource

    import torch

    from agentgym.training.config.loading import load_config
    from agentgym.training.run.loop import train

    torch.set_num_threads(spec.get("threads", 1))
    started_commit = commit()  # the code this run executes (the row's provenance is taken when it is saved)
    model = spec.get("model", "tiny")
    work = Path(spec["work"]) / run_name(spec) if spec.get("work") else None
    overrides = [*TASKS[spec["task"]][0], *MODELS[model], *TASK_MODEL.get((spec["task"], model), []),
                 f"seed={spec['seed']}", f"iterations={spec['iterations']}",
                 f"checkpoint_every={1 if work else 0}", *spec["set"]]
    cfg = load_config(preset(spec["task"], spec["variant"]), overrides)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if work:
            stack.enter_context(run_lock(work))
        if spec.get("shared_warm_start", True):
            cfg = replace(cfg, sft=replace(cfg.sft, from_run=str(shared_warm_start(cfg))))
        out = work or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        report, earlier = train_resuming(cfg, out, started_commit) if work else (train(cfg, out), {})
        if "stopped_after" in report:  # a signal stopped the run part-way: there is no row to make
            again = ("the same command goes on from there" if work
                     else "with --work DIR a stopped run goes on from its last iteration next time")
            raise SystemExit(f"{run_name(spec)} stopped after iteration {report['stopped_after']} "
                             f"({report.get('signal') or 'asked to'}); {again}")
        recorded = trajectory_statistics(out, spec["iterations"])
        if spec.get("keep"):  # the run folder without its weights: trajectories, metrics, config
            shutil.copytree(out, Path(spec["keep"]) / run_name(spec), ignore=shutil.ignore_patterns(*WEIGHTS),
                            dirs_exist_ok=True)
    history = report["history"]
    generate_s = sum(h["perf/generate_s"] for h in history)
    # Held-out outcome per task, in the order of the seeds they were played on: the variants of a seed play
    # the same ones, so they compare task by task (paired_table).
    held_out = report["eval"]["after"].get("per_task", [])
    return {
        # keep and work are local paths, not results
        **{field: value for field, value in spec.items() if field not in ("keep", "work")},
        "started_commit": (earlier.get("commits") or [started_commit])[0],
        # A --work run that several processes trained: the iterations each resumed after, their commits.
        **({"resumed": earlier["resumed"], "commits": earlier["commits"]} if earlier.get("resumed") else {}),
        "wall_s": earlier.get("wall_s", 0.0) + time.perf_counter() - started,
        "before": report["eval"]["before"]["success_rate"],
        "after": report["eval"]["after"]["success_rate"],
        "eval_seeds": [t["seed"] for t in held_out],
        "eval_task_ids": [t["task_id"] for t in held_out],
        "after_by_task": [t["success"] for t in held_out],
        "iters_to_threshold": first_reaching(history, TASKS[spec["task"]][1]),
        "s_per_iteration": statistics.mean(h["perf/iteration_s"] for h in history),
        "update_s_per_iteration": statistics.mean(h["perf/update_s"] for h in history),
        "update_phases": statistics.mean(h.get("perf/update_phases", 1.0) for h in history),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "curve": [h["rollout/success_rate"] for h in history],
        "nll_per_token": recorded["nll_per_token"],
        "success_logprob_per_token": recorded["success_logprob_per_token"],
        "eval_tool_calls_per_episode": report["eval"]["after"].get("tool_calls_per_episode", 0.0),
        "tool_calls_per_task": recorded["tool_calls_per_task"],
        "gen_tokens_per_task": recorded["gen_tokens_per_task"],
        "generate_s_per_iteration": generate_s / len(history),
        "score_frac": sum(h.get("igpo/score_s", 0.0) for h in history) / generate_s if generate_s else 0.0,
        "hooks_frac": sum(h["perf/hooks_s"] for h in history) / generate_s if generate_s else 0.0,
    }


@contextlib.contextmanager
def run_lock(work: Path):
    """Hold ``work``'s lock (the cache's entry lock, across threads and processes) while this process trains
    there: two invocations of one grid must not train the same run into one folder."""
    from agentgym.cache import entry_lock

    with entry_lock(work, wait=False) as got:
        if not got:
            raise RuntimeError(f"{work} is being trained by another process; its row comes from that one")
        yield


def training_now(work: Path) -> bool:
    """Whether some process holds ``work``'s lock (``run_lock``)."""
    from agentgym.cache import entry_lock

    with entry_lock(work, wait=False) as got:
        return not got


#: Weight files ``--keep`` leaves out of a kept run folder: checkpoints, and the final model's weights (its
#: config and tokenizer stay); 538 MB a run for SmolLM2.
WEIGHTS = ("*.pt", "*.safetensors", "*.bin")

#: In a ``--work`` run folder: what the processes that trained it before this one did (``train_resuming``).
LEDGER = "benchmark.json"


def train_resuming(cfg, out: Path, started_commit: str) -> tuple[dict, dict]:
    """Train ``cfg`` in ``out`` (``--work``: checkpointed every iteration), going on from the checkpoint an
    earlier process left there, or reading the report of a run that finished before its row was saved.

    Returns the report and the ledger (``LEDGER``) of the processes that trained the run before this one:
    their wall seconds, the commits they and this one started at, and the iterations this and earlier
    processes resumed after (empty for a run trained in one go). This process adds its seconds to the file
    at every iteration, so one killed at any point leaves it right for the next.
    """
    from agentgym.training.run.checkpoint import checkpoint_iteration
    from agentgym.training.run.loop import train

    folder = RunFolder(out)
    ledger_file = out / LEDGER
    saved = json.loads(ledger_file.read_text()) if ledger_file.is_file() else {}
    earlier = {"wall_s": saved.get("wall_s", 0.0), "commits": saved.get("commits", []),
               "resumed": saved.get("resumed", [])}
    if folder.report.is_file():  # finished, but its process went before the row was saved
        return json.loads(folder.report.read_text()), earlier
    resume = folder.has_checkpoint()
    earlier["commits"].append(started_commit)
    if resume:
        earlier["resumed"].append(checkpoint_iteration(out))
        print(f"{out.name}: resuming after iteration {earlier['resumed'][-1]}", file=sys.stderr, flush=True)
    started = time.perf_counter()

    def record(_metrics: dict | None = None) -> None:
        tmp = ledger_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**earlier, "wall_s": earlier["wall_s"] + time.perf_counter() - started}))
        tmp.replace(ledger_file)

    out.mkdir(parents=True, exist_ok=True)
    # A folder without a checkpoint holds the start of a process that saved nothing yet: it starts again.
    report = train(cfg, out, resume=resume, overwrite=not resume, on_iteration=record)
    record()
    return report, earlier


def shared_warm_start(cfg) -> Path:
    """The folder of the warm start ``cfg`` would make (SFT and the evaluation before RL), made once and
    cached (``$AGENTGYM_CACHE/warm_starts``, keyed by every config field the warm start reads): the variants
    of a seed share it, and RL from it is exactly the run that made it (``sft.from_run``; tested in
    ``tests/training/run/test_warm_start.py``). Concurrent runs wait for the one that makes it."""
    import hashlib

    from agentgym.cache import build_entry, cache_dir, entry_present
    from agentgym.training.config.schema import TrainConfig, config_to_dict
    from agentgym.training.run.loop import train
    from agentgym.training.run.warm_start import warm_start_fields

    fields = warm_start_fields(config_to_dict(cfg), config_to_dict(TrainConfig()))
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]
    entry = cache_dir("warm_starts") / digest

    def build(tmp: Path) -> tuple[list[str], dict]:
        train(cfg, tmp / "run", stop_after=0)
        return ["run/checkpoint.pt", "run/config.json"], {"fields": fields}

    build_entry(entry, build, complete=entry_present)
    return entry / "run"


def update_cost(variants: list[str], repeats: int) -> str:
    """The update step alone, on one batch: phases, forward passes and time per iteration.

    One quickstart batch (SFT warm start, 8 tasks × 8 episodes) is collected once; every variant then
    updates a copy of the same weights on the same turns with its own estimator, plan and loss, while
    a forward hook counts the model's forward passes and the rows they carried.
    """
    import copy

    import numpy as np
    import torch

    from agentgym.training.api import TurnTable
    from agentgym.training.config.loading import load_config
    from agentgym.training.run.loop import Trainer, flatten

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        source = Trainer(load_config(ROOT / "configs" / "quickstart_maze_grpo.yaml"), out)
        source.warm_start()
        groups = source.collector.collect(list(range(8)), 8, source.sampling(0.6, 0))
        weights = copy.deepcopy(source.model.state_dict())
        source.close()
    turns, table = flatten(groups), TurnTable.of(groups)
    lines = [f"{len(turns)} turns, longest trajectory {int(table.step.max()) + 1} turns, {repeats} repeats",
             "", ("| variant | phases | forward passes: log-probs + training + reference | rows forwarded "
                  "| update s (best) | × first |"), "|---|---:|---:|---:|---:|---:|"]
    baseline = None
    for variant in [v for v in variants if preset("maze", v).is_file()]:
        with tempfile.TemporaryDirectory() as out:
            run = Trainer(load_config(ROOT / "configs" / f"quickstart_maze_{variant}.yaml",
                                      ["sft.enabled=false"]), out)
            if run.plugins.needs_reference:
                torch.save(weights, RunFolder(out).reference)
                run.freeze_reference()
            advantages = run.plugins.algorithm.estimator(groups, run.plugins.args)
            counts = {"grad": 0, "no_grad": 0, "reference": 0, "rows": 0}

            def counter(kind: str, counts: dict = counts):
                def count(module, args, kwargs, output):
                    counts[kind if kind == "reference" or torch.is_grad_enabled() else "no_grad"] += 1
                    counts["rows"] += int(kwargs["input_ids"].shape[0])
                return count

            handles = [run.model.register_forward_hook(counter("grad"), with_kwargs=True)]
            if run.update.ref_model is not None:
                handles.append(run.update.ref_model.register_forward_hook(counter("reference"),
                                                                          with_kwargs=True))
            times = []
            for _ in range(repeats):
                run.model.load_state_dict(weights)
                counts.update(grad=0, no_grad=0, reference=0, rows=0)
                started = time.perf_counter()
                metrics = run.update(turns, np.asarray(advantages), table, 1)
                times.append(time.perf_counter() - started)
            for handle in handles:
                handle.remove()
            run.close()
        best = min(times)
        baseline = baseline or best
        lines.append(f"| {variant} | {metrics.get('perf/update_phases', 1):.0f} | {counts['no_grad']} + "
                     f"{counts['grad']} + {counts['reference']} "
                     f"| {counts['rows']} | {best:.2f} | {best / baseline:.1f} |")
    return "\n".join(lines)


def key(run: dict) -> tuple:
    return run.get("model", "tiny"), run["tag"], run["task"], run["variant"], run["seed"], run["iterations"]


def save(path: Path, run: dict) -> None:
    """Add ``run`` to the results file, re-reading it under a lock so concurrent invocations keep
    each other's rows."""
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read()
        stored = [r for r in (json.loads(text) if text.strip() else [])
                  if "variant" in r and key(r) != key(run)]
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps([*stored, {**run, "provenance": provenance()}], indent=1))


def grid_status(specs: list[dict], stored: list[dict]) -> str:
    """One line per run of the grid: its row (held-out before → after), how far its ``--work`` folder got
    (and whether a process trains it now), or that it is still to run."""
    from agentgym.training.run.checkpoint import checkpoint_iteration

    rows = {key(r): r for r in stored}
    lines = []
    for spec in specs:
        name = run_name(spec)
        row = rows.get(key(spec))
        if row is not None:
            lines.append(f"{name}: done, {row['before']:.0%} -> {row['after']:.0%}")
            continue
        work = Path(spec["work"]) / name if spec.get("work") else None
        training = work is not None and training_now(work)
        if work is None or not RunFolder(work).has_checkpoint():  # not started, in its warm start, or died
            lines.append(f"{name}: " + ("starting now (warm start)" if training else "to run"))
            continue
        now = "training now" if training else "stopped; the same command goes on from there"
        reached = checkpoint_iteration(work)
        lines.append(f"{name}: {reached} of {spec['iterations']} iterations in {work} ({now})")
    return "\n".join(lines)


def launch(spec: dict) -> dict:
    """Run ``spec`` in a child process (fresh memory accounting, one thread)."""
    return run_child(__file__, spec)


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.0%} ± {std:.0%}"


def edge_mean(values: list[float], first: bool, width: int = 5) -> float:
    part = values[:width] if first else values[-width:]
    part = [v for v in part if not math.isnan(v)]
    return statistics.mean(part) if part else float("nan")


def table(runs: list[dict], task: str, variants: list[str]) -> str:
    threshold = TASKS[task][1]
    lines = [(f"| variant | seeds | held-out before RL | after RL (mean ± std) | iterations to "
              f"{threshold:.0%} (train) | s / iteration | peak MB | phases "
              "| −logp/token first → last 5 it |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant and r["task"] == task]
        if not mine:
            continue
        reached = [r["iters_to_threshold"] for r in mine if r["iters_to_threshold"] is not None]
        reach = (f"{statistics.mean(reached):.0f} ({len(reached)}/{len(mine)})" if reached
                 else f"not reached (0/{len(mine)})")
        nll_first = statistics.mean(edge_mean(r["nll_per_token"], True) for r in mine)
        nll_last = statistics.mean(edge_mean(r["nll_per_token"], False) for r in mine)
        lines.append(
            f"| {variant} | {len(mine)} | {mean_std([r['before'] for r in mine])} "
            f"| {mean_std([r['after'] for r in mine])} "
            f"| {reach} | {statistics.mean(r['s_per_iteration'] for r in mine):.1f} "
            f"| {max(r['peak_rss_mb'] for r in mine):.0f} "
            f"| {statistics.mean(r['update_phases'] for r in mine):.1f} "
            f"| {nll_first:.3f} → {nll_last:.3f} |")
    return "\n".join(lines)


def tool_table(runs: list[dict], task: str, variants: list[str]) -> str:
    """What the runs cost in tool calls, tokens and extra passes (tool tasks)."""
    header = ("| variant | tool calls / episode (held-out, after) | tool calls run / task (train) "
              "| tokens generated / task | generate s / iteration | scoring / generate | hooks / generate |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for variant in variants:
        mine = [r for r in runs
                if r["variant"] == variant and r["task"] == task and "tool_calls_per_task" in r]
        if not mine:
            continue
        fields = ("eval_tool_calls_per_episode", "tool_calls_per_task", "gen_tokens_per_task",
                  "generate_s_per_iteration", "score_frac", "hooks_frac")
        calls, ran, tokens, generate, score, hooks = (statistics.mean(r[f] for r in mine) for f in fields)
        lines.append(f"| {variant} | {calls:.2f} | {ran:.1f} | {tokens:.0f} | {generate:.2f} | {score:.0%} "
                     f"| {hooks:.0%} |")
    return "\n".join(lines)


def paired_table(runs: list[dict], task: str, variants: list[str]) -> str:
    """Each variant against the first one listed, per seed, on the held-out tasks both played: the paired
    difference in success (McNemar's exact test, a bootstrap interval), more sensitive than comparing the two
    success rates when the tasks that are hard for one run are hard for the other. Seeds that reset to the
    same task are one task (``scores_by_task``; older rows without ``eval_task_ids`` pair by seed), and the
    success columns are means over tasks, each task weighing the same. Rows
    without per-task outcomes (older ones) are left out."""
    from agentgym.eval.statistics import compare_paired, scores_by_task

    lines = ["| seed | variant | vs | success (vs → variant) | difference, 95% CI | exact p "
             "| tasks better / worse |", "|---:|---|---|---:|---:|---:|---:|"]
    paired_rows = {(r["variant"], r["seed"]): r for r in runs if r["task"] == task and r.get("after_by_task")}
    reference = variants[0]
    for seed in sorted({seed for _, seed in paired_rows}):
        base = paired_rows.get((reference, seed))
        for variant in variants[1:]:
            other = paired_rows.get((variant, seed))
            if base is None or other is None or other["eval_seeds"] != base["eval_seeds"]:
                continue
            # Same seeds reset to the same tasks; rows saved before task ids were kept pair by seed.
            same = base.get("eval_task_ids") == other.get("eval_task_ids")
            units = (same and base.get("eval_task_ids")) or [str(s) for s in base["eval_seeds"]]
            a_scores = scores_by_task(units, base["after_by_task"])
            b_scores = scores_by_task(units, other["after_by_task"])
            c = compare_paired(task, reference, variant, list(a_scores.values()), list(b_scores.values()),
                               seed=seed)
            low, high = (100 * bound for bound in c.ci95)
            lines.append(f"| {seed} | {variant} | {reference} | {c.a_mean:.0%} → {c.b_mean:.0%} "
                         f"| {100 * c.difference:+.0f} points ({low:+.0f} to {high:+.0f}) "
                         f"| {c.p_value:.2g} | {c.b_better} / {c.a_better} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(runs: list[dict], task: str, variants: list[str], tag: str, folder: Path = RESULTS) -> None:
    """``folder/algorithms_<tag>_<task>.png``: training success and the entropy estimate per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4))
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant and r["task"] == task]
        if not mine:
            continue
        for axis, field in ((ax, "curve"), (bx, "nll_per_token")):
            curves = [r[field] for r in mine]
            mean = [statistics.mean(c[i] for c in curves) for i in range(min(map(len, curves)))]
            axis.plot(range(1, len(mean) + 1), mean, label=variant)
    ax.set_ylabel("training success (mean over seeds)")
    ax.set_ylim(0, 1)
    bx.set_ylabel("−log-prob per sampled token (entropy estimate)")
    for axis in (ax, bx):
        axis.set_xlabel("iteration")
        axis.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{task} ({tag})")
    fig.tight_layout()
    fig.savefig(folder / f"algorithms_{tag}_{task}.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--tasks", nargs="+", default=["maze", "maze3"], choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (one torch thread each)")
    parser.add_argument("--set", action="append", default=[], help="extra override for every run (key=value)")
    parser.add_argument("--tag", default="default", help="names the experiment (required with --set)")
    parser.add_argument("--model", default="tiny", choices=list(MODELS),
                        help="the policy behind every preset (smollm2: the packaged real model)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--own-warm-starts", action="store_true",
                        help="each run makes its own warm start (default: the variants of a seed share one)")
    parser.add_argument("--results", default=str(RESULTS_FILE), help="JSON file the runs accumulate in")
    parser.add_argument("--keep", default=None, help="keep each run's folder, weights left out, in "
                                                      "KEEP/<model>_<tag>_<task>_<variant>_seed<seed> "
                                                      "(benchmarks/replay_advantages.py reads it)")
    parser.add_argument("--work", default=None,
                        help="train each run in WORK/<model>_<tag>_<task>_<variant>_seed<seed>, checkpointed "
                             "every iteration: a run stopped or killed goes on from its last iteration when "
                             "the same command runs again (the folder goes once the row is saved)")
    parser.add_argument("--status", action="store_true",
                        help="only say, per run of the grid, whether its row is in, how far its --work "
                             "folder got, or that it is to run")
    parser.add_argument("--update-cost", action="store_true",
                        help="only time the update step of each variant on one shared batch (grpo first)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each timed update (--update-cost)")
    args = child_run(parser, None, run_one)
    if args is None:
        return
    if args.update_cost:
        print(update_cost(args.variants, args.repeats))
        return
    if args.set and args.tag == "default":
        parser.error("--set changes the runs: name the experiment with --tag")
    RESULTS.mkdir(exist_ok=True)
    results = Path(args.results)
    stored = json.loads(results.read_text()) if results.is_file() else []
    stored = [r for r in stored if "variant" in r]  # rows of the older GRPO/RLOO/GiGPO-only script go
    done = {key(r) for r in stored}
    specs = [{"model": args.model, "tag": args.tag, "task": task, "variant": variant, "seed": seed,
              "iterations": args.iterations, "set": args.set, "threads": args.threads,
              "shared_warm_start": not args.own_warm_starts,
              "keep": str(Path(args.keep).resolve()) if args.keep else None,
              "work": str(Path(args.work).resolve()) if args.work else None}
             for task in args.tasks for variant in args.variants for seed in args.seeds
             if preset(task, variant).is_file()]
    todo = [s for s in specs if key(s) not in done]
    if args.status:
        print(grid_status(specs, stored))
        return
    print(f"{len(specs) - len(todo)} of {len(specs)} runs already in {results.name}; running {len(todo)}",
          flush=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(launch, spec): spec for spec in todo}
        for future in as_completed(futures):
            try:
                run = future.result()
            except RuntimeError as exc:  # one failed run is reported; the others still count
                print(exc, file=sys.stderr, flush=True)
                continue
            stored.append(run)
            save(results, run)
            if args.work:  # its row is saved: the checkpoints can go
                shutil.rmtree(Path(args.work) / run_name(futures[future]), ignore_errors=True)
            print(f"{run['task']} {run['variant']} seed {run['seed']}: {run['before']:.0%} -> "
                  f"{run['after']:.0%} "
                  f"({run['wall_s']:.0f} s, {run['s_per_iteration']:.1f} s/it)", flush=True)
    wanted = {key(s) for s in specs}
    runs = [r for r in stored if key(r) in wanted]
    for task in args.tasks:
        print(f"\n### {task} ({args.model}, {args.tag}, {args.iterations} iterations)\n")
        print(table(runs, task, args.variants))
        if any(r.get("tool_calls_per_task") for r in runs if r["task"] == task):
            print()
            print(tool_table(runs, task, args.variants))
        paired = paired_table(runs, task, args.variants)
        if paired:
            print(f"\nPaired, per seed, against {args.variants[0]} (the held-out tasks both played):\n")
            print(paired)
        if any(r["task"] == task for r in runs):  # a grid stopped before its first row has nothing to draw
            plot(runs, task, args.variants, args.tag if args.model == "tiny" else f"{args.model}_{args.tag}",
                 results.parent)  # beside the rows they show


if __name__ == "__main__":
    main()
