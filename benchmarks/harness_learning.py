"""Does RL through the rollout proxy make a real model's agent better? Held-out success of a harness preset,
per seed: before SFT, after SFT (where RL starts) and after RL.

    python benchmarks/harness_learning.py                    # the calculator agent on SmolLM2, seeds 0-2
    python benchmarks/harness_learning.py --seeds 3 --jobs 1 # one more seed
    python benchmarks/harness_learning.py --table            # the table of the runs recorded so far
    python benchmarks/harness_learning.py --tag top6 --set model.train_top_layers=6   # a variant of it

Each seed is ``agentgym train PRESET --set seed=S --out RUNS/seedS``, a separate process with one torch
thread (``--jobs`` of them at a time); seeds already in the results file, or whose run folder already has
a ``report.json``, are not run again, so the grid fills in across sessions. ``--set`` adds overrides to
every run and ``--tag`` names that variant (its rows and run folders are kept apart from the preset's own).
``benchmarks/results/harness_learning.json`` keeps a row per preset and seed with the commit, command and
machine of the run that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from provenance import REPO, provenance

RESULTS = Path(__file__).resolve().parent / "results" / "harness_learning.json"
PRESET = "configs/harness_calculator_grpo_smollm2.yaml"


def train_command(preset: str, seed: int, out: Path, overrides: list[str]) -> list[str]:
    sets = [arg for override in overrides for arg in ("--set", override)]
    return ["agentgym", "train", preset, "--set", f"seed={seed}", *sets, "--out", str(out)]


def _train(preset: str, seed: int, out: Path, overrides: list[str], argv: list[str]) -> dict[str, Any]:
    command = train_command(preset, seed, out, overrides)
    # the commit the run starts from (the checkout may move on while it trains)
    record = {**provenance(argv, script=__file__),
              "train_command": "OMP_NUM_THREADS=1 " + shlex.join(command)}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log_path = out.parent / f"seed{seed}.log"
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, stdout=log,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode:  # the other seeds go on; this one gets no row
        last = log_path.read_text().strip().splitlines()[-1:] or [""]
        print(f"seed {seed} failed (exit {done.returncode}): {last[0]} (log: {log_path})", file=sys.stderr)
    return record


def row_of(preset: str, tag: str, seed: int, out: Path, record: dict[str, Any] | None) -> dict[str, Any]:
    """The table row of one finished run folder."""
    report = json.loads((out / "report.json").read_text())
    history = report.get("history") or []
    evals = report["eval"]
    return {
        "preset": preset, "tag": tag, "seed": seed, "run": str(out),
        "before_sft": (evals.get("before_sft") or {}).get("success_rate"),
        "after_sft": evals["before"]["success_rate"], "after_rl": evals["after"]["success_rate"],
        "after_rl_ci95": evals["after"]["success_ci95"], "episodes": evals["after"]["episodes"],
        "iterations": report["iterations"], "wall_s": round(report["wall_time_s"], 1),
        "iteration_s": round(sum(h["perf/iteration_s"] for h in history) / max(1, len(history)), 1),
        "update_s": round(sum(h["perf/update_s"] for h in history) / max(1, len(history)), 1),
        "proxy_s_per_iteration": round(sum(h["perf/env_s"] for h in history) / max(1, len(history)), 2),
        "provenance": record,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=PRESET, help="a harness preset (config file)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", default="runs/harness-learning", help="where the run folders go")
    parser.add_argument("--jobs", type=int, default=2, help="training processes at a time")
    parser.add_argument("--set", action="append", default=[], help="override for every run (key=value)")
    parser.add_argument("--tag", default="", help="names the variant --set makes (needed with --set)")
    parser.add_argument("--table", action="store_true", help="only print the recorded rows")
    args = parser.parse_args(argv)
    if args.set and not args.tag:
        parser.error("--set changes the preset: name the variant with --tag, so its rows stay apart")
    argv = sys.argv[1:] if argv is None else argv
    kept = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
    if not args.table:
        root = Path(args.runs) / Path(args.preset).stem / args.tag
        root.mkdir(parents=True, exist_ok=True)
        key = (args.preset, args.tag)
        recorded = {r["seed"] for r in kept if (r["preset"], r.get("tag", "")) == key}
        # a seed recorded in the results (its run folder may be gone: another session) is not run again
        todo = [s for s in args.seeds
                if s not in recorded and not (root / f"seed{s}" / "report.json").is_file()]
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            runs = pool.map(lambda s: _train(args.preset, s, root / f"seed{s}", args.set, argv), todo)
            records = dict(zip(todo, runs, strict=True))
        for seed in args.seeds:
            if not (root / f"seed{seed}" / "report.json").is_file():
                continue  # recorded earlier; its row stays as it is
            old = next((r for r in kept if (r["preset"], r.get("tag", ""), r["seed"]) == (*key, seed)), None)
            record = records.get(seed, (old or {}).get("provenance"))
            if record is None:  # a run made by hand with the same command: recorded now, and said so
                command = shlex.join(train_command(args.preset, seed, root / f"seed{seed}", args.set))
                record = {**provenance(argv, script=__file__),
                          "train_command": f"OMP_NUM_THREADS=1 {command}",
                          "note": "started by hand; commit and machine taken when it was tabulated"}
            kept = [r for r in kept if (r["preset"], r.get("tag", ""), r["seed"]) != (*key, seed)]
            kept.append(row_of(args.preset, args.tag, seed, root / f"seed{seed}", record))
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({"rows": kept}, indent=2) + "\n")
    print("| preset | tag | seed | before SFT | after SFT | after RL (95% CI) | s/iteration (update) "
          "| proxy s/it |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(kept, key=lambda r: (r["preset"], r.get("tag", ""), r["seed"])):
        low, high = r["after_rl_ci95"]
        print(f"| {Path(r['preset']).stem} | {r.get('tag', '') or '-'} | {r['seed']} | "
              f"{_pct(r['before_sft'])} | "
              f"{_pct(r['after_sft'])} | {_pct(r['after_rl'])} ({_pct(low)}–{_pct(high)}) | "
              f"{r['iteration_s']} ({r['update_s']}) | {r['proxy_s_per_iteration']} |")


if __name__ == "__main__":
    main()
