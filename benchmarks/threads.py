"""How torch's CPU thread count (``model.num_threads``) changes the cost of a training iteration.

    python benchmarks/threads.py                                   # the quickstart preset, 1 and 2 threads
    python benchmarks/threads.py --threads 1 2 4 --iterations 5 --preset configs/quickstart_maze_gigpo.yaml
    python benchmarks/threads.py --preset configs/harness_calculator_grpo_smollm2.yaml --iterations 2

Each setting trains the preset for ``--iterations`` RL iterations (no SFT, no evaluation beyond the
smallest) in a process of its own with ``model.num_threads`` set, and reports the mean seconds per
iteration and its generation and update parts (the first iteration is left out: it warms the caches).
The machine's 1-minute load average before each run is recorded with it: the answer depends on what
else the cores are doing, so run it the way you train (alone, or beside env services and other runs).
Settings are run in turn, ``--repeats`` times each, interleaved, so a change in the machine's load hits
every setting alike.

Rows accumulate in ``benchmarks/results/threads.json`` with their ``provenance``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from provenance import child_run, provenance, run_child, timed_training

RESULTS = Path(__file__).resolve().parent / "results" / "threads.json"


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One short training run in this process; its per-iteration timings."""

    overrides = [f"model.num_threads={spec['threads']}", f"iterations={spec['iterations'] + 1}",
                 "checkpoint_every=0", "sft.enabled=false", "eval.num_episodes=1", *spec["set"]]
    return timed_training(spec["preset"], overrides,
                          ["perf/iteration_s", "perf/generate_s", "perf/update_s", "rollout/turns"])


def launch(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_one`` in a child process (its own torch, nothing inherited from this one)."""
    return run_child(__file__, spec, omp_threads="")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="configs/quickstart_maze_grpo.yaml",
                        help="config file (repo-relative)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations (one more warms up)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per thread count, interleaved")
    parser.add_argument("--set", action="append", default=[], help="extra override (key=value)")
    parser.add_argument("--note", default="", help="what else ran on the machine, recorded with the rows")
    args = child_run(parser, argv, run_one)
    if args is None:
        return
    argv = sys.argv[1:] if argv is None else argv
    rows = []
    for repeat in range(args.repeats):
        for threads in args.threads:
            spec = {"preset": args.preset, "threads": threads, "iterations": args.iterations, "set": args.set}
            load = os.getloadavg()[0]
            started = time.perf_counter()
            timings = launch(spec)
            rows.append({**spec, **timings, "repeat": repeat, "load_before": load, "note": args.note,
                         "wall_s": time.perf_counter() - started})
            print(f"{threads} thread(s), repeat {repeat}: {timings['iteration_s']:.2f} s/iteration (generate "
                  f"{timings['generate_s']:.2f}, update {timings['update_s']:.2f}; load {load:.1f})",
                  flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    kept = json.loads(RESULTS.read_text())["runs"] if RESULTS.is_file() else []
    kept.append({"rows": rows, "provenance": provenance(argv, script=__file__)})
    RESULTS.write_text(json.dumps({"runs": kept}, indent=1) + "\n")
    print("\n| threads | s / iteration | generate s | update s | runs | load before |")
    print("|---:|---:|---:|---:|---:|---:|")
    for threads in args.threads:
        mine = [r for r in rows if r["threads"] == threads]
        print(f"| {threads} | {statistics.mean(r['iteration_s'] for r in mine):.2f} | "
              f"{statistics.mean(r['generate_s'] for r in mine):.2f} | "
              f"{statistics.mean(r['update_s'] for r in mine):.2f} | {len(mine)} | "
              f"{statistics.mean(r['load_before'] for r in mine):.1f} |")


if __name__ == "__main__":
    main()
