"""What a run's algorithm rewarded, iteration by iteration, replayed from its recorded trajectories.

    python benchmarks/replay_advantages.py RUN [--iterations 1 5 9] [--by action|first-word]
                                           [--algorithm NAME] [--arg KEY=VALUE ...]

``RUN`` is a run folder (``agentgym train --out RUN``, or one that ``benchmarks/algorithms.py --keep`` kept).
Every iteration's groups (``trajectories/iter_*.jsonl``) go back through the run's own advantage estimator,
with the run's algorithm arguments (its ``config.json``); estimators are pure functions of the records, so
these are the advantages the update used. Per iteration it prints how many episodes of each group reached
the goal, the share of invalid actions, and per action (or its first word, for tool calls and queries),
valid and invalid apart: how often it was taken, its mean advantage and the share of its turns with a
positive one. A collapse shows here as the actions that kept getting positive advantages while success fell.
``--arg KEY=VALUE`` changes one of the run's algorithm arguments and ``--algorithm NAME`` puts the groups
through another registered estimator (its default arguments, then ``--arg``): what the update would have paid
for the same episodes (the episodes themselves came from the run's policy, so this is one step, not a run).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def action_label(action: str | None, by: str) -> str:
    """The row an action counts in: the action itself (cut to 40 characters), or its first word."""
    text = (action or "").strip()
    if by == "first-word":
        text = re.split(r"[\s\[(:{]", text, maxsplit=1)[0]
    return text[:40] or "(none)"


def replay(run: Path, iterations: list[int] | None, by: str, *, algorithm_name: str | None = None,
           changes: dict[str, object] | None = None) -> str:
    """The report for ``run`` (every recorded iteration when ``iterations`` is None), with the run's
    estimator and arguments, or ``algorithm_name``'s estimator at its defaults, either with ``changes``."""
    from agentgym.rollout.episode_log import EpisodeLog, groups_of
    from agentgym.training.api import get_algorithm

    config = json.loads((run / "config.json").read_text())
    own = algorithm_name in (None, config["algorithm"]["name"])
    algorithm = get_algorithm(config["algorithm"]["name"] if own else algorithm_name)
    recorded = (config["algorithm"].get("args") or {}) if own else {}
    args = algorithm.make_args({**recorded, **(changes or {})})
    files = {int(p.stem.split("_")[-1]): p for p in (run / "trajectories").glob("iter_*.jsonl")}
    if not files:
        raise SystemExit(f"{run} holds no trajectories/iter_*.jsonl: pass a run folder")
    missing = sorted(set(iterations or []) - set(files))
    if missing:
        raise SystemExit(f"{run} has no iteration {missing[0]}; it has {min(files)}..{max(files)}")
    lines = [f"{run.name}: {algorithm.name} {args}"]
    for iteration in iterations or sorted(files):
        groups = groups_of(EpisodeLog(files[iteration], iteration).read())
        advantages = np.asarray(algorithm.estimator(groups, args), dtype=np.float64)
        turns = [turn for group in groups for trajectory in group.trajectories for turn in trajectory.turns]
        wins = [sum(t.success for t in group.trajectories) for group in groups]
        episodes = [len(group.trajectories) for group in groups]
        invalid = statistics.mean(float(turn.invalid) for turn in turns) if turns else 0.0
        lines += ["", f"iteration {iteration}: goal reached per group {wins} of {episodes}, "
                      f"{len(turns)} turns, {invalid:.0%} invalid",
                  "| action | valid | turns | share | mean advantage | advantage > 0 |",
                  "|---|---|---:|---:|---:|---:|"]
        rows: dict[tuple[str, bool], list[float]] = defaultdict(list)
        for turn, advantage in zip(turns, advantages.tolist(), strict=True):
            rows[(action_label(turn.action, by), not turn.invalid)].append(advantage)
        for (label, valid), values in sorted(rows.items(), key=lambda item: -len(item[1])):
            positive, share = sum(v > 0 for v in values) / len(values), len(values) / len(turns)
            lines.append(f"| {label} | {'yes' if valid else 'no'} | {len(values)} | {share:.0%} | "
                         f"{statistics.mean(values):+.3f} | {positive:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder (with config.json and trajectories/)")
    parser.add_argument("--iterations", type=int, nargs="+", default=None, help="which (default: all)")
    parser.add_argument("--by", choices=["action", "first-word"], default="action",
                        help="count actions whole, or by their first word (tool calls, search queries)")
    parser.add_argument("--algorithm", default=None, help="another registered estimator (default: the run's)")
    parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                        help="change one algorithm argument (repeat for more), e.g. --arg mode=mean_norm")
    args = parser.parse_args()
    if not (args.run / "config.json").is_file():
        sys.exit(f"{args.run} is not a run folder (no config.json): pass what --out or --keep wrote")
    for item in args.arg:
        if item.partition("=")[0].strip() == "" or "=" not in item:
            sys.exit(f"--arg {item!r} is not KEY=VALUE: write e.g. --arg mode=mean_norm")
    from agentgym.errors import AgentGymError
    from agentgym.training.config.schema import apply_overrides

    try:
        changes = apply_overrides({}, args.arg)  # values read as config overrides read them (YAML, 1e-3)
        print(replay(args.run, args.iterations, args.by, algorithm_name=args.algorithm, changes=changes))
    except AgentGymError as exc:  # an unknown algorithm or argument, a value of the wrong type
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
