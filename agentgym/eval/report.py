"""An evaluation's results (``results.json``, machine-readable) and ``report.md``.

``build_results`` reads the saved episodes back and computes, per env and policy, the summary of
``agentgym.rollout.summary.summarize`` (the same function training's held-out evaluations use) plus
wall time, and for every env and pair of policies a paired comparison on the tasks both played
(``agentgym.eval.statistics``). A task is a distinct ``task_id``: seeds that reset to the same task count
as one task played several times, in the counts, the success interval and the paired comparisons.
"""

from __future__ import annotations

import platform
import sys
import time
from typing import TYPE_CHECKING, Any

import agentgym
from agentgym.eval.statistics import compare_paired, scores_by_task
from agentgym.eval.store import EvalStore
from agentgym.rollout.episode_log import groups_of
from agentgym.rollout.summary import counts, interval_text, summarize

if TYPE_CHECKING:
    from agentgym.eval.plan import EnvInfo, EvalPlan


def _task_scores(records: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Per task (``task_id``), the mean of ``key`` (``success`` or ``return``) over its episodes: the
    samples of its seed, and of any other seed that reset to the same task (one pair, not two)."""
    return scores_by_task([str(r["task_id"]) for r in records], [float(r[key]) for r in records])


def _missing(plan: EvalPlan, records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(task index, sample) of the planned episodes ``records`` lacks (it holds only planned ones)."""
    saved = {(int(r["task_index"]), int(r["sample"])) for r in records}
    return [(t, k) for t in range(len(plan.seeds)) for k in range(plan.samples) if (t, k) not in saved]


def build_results(plan: EvalPlan, store: EvalStore, infos: dict[str, EnvInfo], *,
                  command: str | None = None) -> dict[str, Any]:
    """The results dict (what ``results.json`` holds).

    Each row counts only the episodes the plan asks for; ``complete`` says whether all of them are
    there and ``missing`` lists the rest (task index, seed, sample), so results never silently count
    fewer episodes than planned. ``split`` names the task split the env was played on (its ``seeds``
    are then task indices of it) and ``judge_model`` the judge whose scores were the rewards (None:
    the env's own rewards).
    """
    rows, comparisons = [], []
    for entry in plan.envs:
        scores: dict[str, dict[int, float]] = {}
        returns: dict[str, dict[int, float]] = {}
        # Where the return is just the success indicator, comparing it again would say nothing new.
        return_differs = False
        for spec in plan.policies:
            records = store.records(entry.id, spec.name)
            wall = store.wall_s(entry.id, spec.name)
            summary = summarize(groups_of(records))
            # Tool calls are counted from info["tool_calls"]; an env that never reports them shows "—", not 0.
            reported = any("tool_calls" in (t.get("info") or {}) for r in records for t in r["turns"])
            missing = [{"task_index": task, "seed": plan.seeds[task], "sample": sample}
                       for task, sample in _missing(plan, records)]
            rows.append({"env": entry.id, "policy": spec.name, "split": entry.split,
                         "judge_model": (entry.judge or {}).get("model"), **summary, "wall_s": wall,
                         "episodes_per_s": summary["episodes"] / wall if wall > 0 else None,
                         "has_tools": infos[entry.id].has_tools if entry.id in infos else None,
                         "tool_calls_reported": reported,
                         "complete": not missing, "missing": missing})
            scores[spec.name] = _task_scores(records, "success")
            returns[spec.name] = _task_scores(records, "return")
            return_differs |= any(float(r["return"]) != float(bool(r["success"])) for r in records)
        names = [p.name for p in plan.policies]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                tasks = sorted(set(scores[a]) & set(scores[b]))
                if not tasks:
                    continue
                for metric, table in (("success", scores), ("return", returns)):
                    if metric == "return" and not return_differs:
                        continue
                    comparisons.append(compare_paired(entry.id, a, b, [table[a][t] for t in tasks],
                                                      [table[b][t] for t in tasks], metric=metric,
                                                      seed=plan.sampling_seed).to_json())
    return {
        "agentgym_version": agentgym.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "config": plan.to_json(),
        "seeds": list(plan.seeds),
        "results": rows,
        "comparisons": comparisons,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "—" if value is None else format(value, fmt)


def plays_text(results: dict[str, Any]) -> str:
    """What every policy plays on each env, as the plan asks: ``20 seeds, 1 episode each``. Seeds (and
    task indices) are not distinct tasks: an env may reset two seeds to the same task.

    Example:
        >>> plays_text({"seeds": [3, 4], "config": {"samples": 2, "envs": [{"split": "test"}]}})
        '2 task indices, 2 episodes each'
    """
    config = results["config"]
    split = any(env.get("split") for env in config["envs"])
    samples = config["samples"]
    return (f"{len(results['seeds'])} {'task indices' if split else 'seeds'}, {samples} "
            f"episode{'' if samples == 1 else 's'} each")


def results_table(results: dict[str, Any]) -> list[list[str]]:
    """Header + one row per (env, policy): the numbers report.md and report.html show. ``tasks ×
    episodes`` counts distinct tasks (``task_id``) and the episodes of each (``summary.counts``)."""
    rows = results["results"]
    ks = sorted({k for r in rows for k in r if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    tools = any(r.get("has_tools") for r in rows)
    header = ["env", "policy", "tasks × episodes", "success", "95% CI", "return", "turns", "tokens",
              "invalid", *(["tool calls/ep"] if tools else []), *ks, "wall s"]
    table = [header]
    for r in rows:
        line = [r["env"], r["policy"], counts(r, short=True) + ("" if r["complete"] else " (incomplete)"),
                _pct(r["success_rate"]), interval_text(r), f"{r['mean_return']:.2f}",
                f"{r['mean_turns']:.1f}", str(r["tokens_generated"]), _pct(r["invalid_rate"])]
        if tools:
            line.append(f"{r['tool_calls_per_episode']:.2f}"
                        if r.get("has_tools") and r.get("tool_calls_reported") else "—")
        line += [_pct(r[k]) if k in r else "—" for k in ks]
        line.append(_cell(r, "wall_s", ".2f"))
        table.append(line)
    return table


def markdown_report(results: dict[str, Any]) -> str:
    """report.md: what was run, the table, and the paired comparisons in words."""
    config = results["config"]
    seeds = results["seeds"]
    span = (f"{seeds[0]}..{seeds[-1]}" if seeds == list(range(seeds[0], seeds[0] + len(seeds)))
            else ", ".join(map(str, seeds)))
    splits = {env.get("split") for env in config["envs"]}
    if splits == {None}:
        which = f"seeds {span}"
    elif len(splits) == 1:
        which = f"task indices {span} of split {splits.pop()!r}"
    else:
        which = f"seeds, or task indices of each env's split, {span}"
    judged = [f"{env['id']} by {env['judge']['model']}" for env in config["envs"] if env.get("judge")]
    lines = ["# Evaluation report", "",
             (f"agentgym {results['agentgym_version']}, {results['created']}. "
              f"Per env, every policy plays the same {plays_text(results)} ({which}), temperature "
              f"{config['temperature']:g}, sampling seed {config['sampling_seed']}. The table counts "
              "distinct tasks: seeds that reset to the same task are one task."), ""]
    if judged:
        lines += [f"Judged rewards (an LLM judge's score from a rubric): {'; '.join(judged)}.", ""]
    if results.get("command"):
        lines += [f"Command: `{results['command']}`", ""]
    lines += ["Policies: " + "; ".join(f"`{p['name']}` = `{p['text']}`" for p in config["policies"]), ""]
    table = results_table(results)
    lines += ["| " + " | ".join(table[0]) + " |", "|" + "|".join("---" for _ in table[0]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    for r in results["results"]:
        if r.get("missing"):
            listed = ", ".join(str(m["seed"]) + (f" (sample {m['sample']})" if config["samples"] > 1 else "")
                               for m in r["missing"])
            lines += ["", (f"**Incomplete:** {r['env']} × {r['policy']} lacks {len(r['missing'])} of "
                           f"{len(seeds) * config['samples']} episodes (task seeds {listed}); "
                           "`agentgym eval --out DIR --resume` plays them.")]
    lines += ["", ("Tasks × episodes: distinct tasks (by task id) and the episodes each has. Success: share "
                   "of episodes the env marked solved, with a 95% interval over tasks (episodes of one task "
                   "are not independent: a Wilson interval at the effective number of episodes, from the "
                   "between-task variance, corrected for few tasks; one task gives 0–100%). Return: "
                   "mean episode return. Turns: mean turns per episode. Tokens: generated tokens, all "
                   "episodes. Invalid: share of turns whose action could not be parsed or applied. Tool "
                   "calls/ep: tools the env ran per episode, as it reports them in info['tool_calls'] "
                   "(— where it does not). pass@k: unbiased estimate over the samples of each task. Wall: "
                   "seconds spent on that env and policy.")]
    if results["comparisons"]:
        lines += ["", "## Paired comparisons", "",
                  ("Per task, the difference in success (in percentage points), and in mean return where the "
                   "return says more than success, second policy minus first; 95% interval from a paired "
                   "bootstrap over tasks; p from an exact paired test (McNemar for 0/1 outcomes, sign-flip "
                   "permutation otherwise). Significant means both the interval excludes 0 and "
                   "p < 0.05."), ""]
        lines += [f"- {c['verdict']}" for c in results["comparisons"]]
    return "\n".join(lines) + "\n"
