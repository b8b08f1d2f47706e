"""Asynchronous rollouts against synchronous training: seconds per iteration on a tool env whose steps take
real time, with the packaged real model.

    python benchmarks/async_rollouts.py                                   # SmolLM2, search-qa, 1.0 s tools
    python benchmarks/async_rollouts.py --latency 0.5 --iterations 4 --modes sync async1
    python benchmarks/async_rollouts.py --model tiny --latency 0.05       # the byte model, in a minute

Each mode trains the same run (``configs/search_qa_grpo_tiny.yaml`` with ``--model``'s weights, no SFT,
no constraint, one torch thread for the update and one for generation) for ``--iterations`` RL
iterations plus one that warms up (left out), in a process of its own:

- ``sync``: ``rollout.max_staleness: 0``, collect then update, one torch thread;
- ``sync2t``: the same with two torch threads (what the asynchronous modes use between them);
- ``async1``: ``rollout.max_staleness: 1``, the next iteration is collected during the update;
- ``async2p``: ``rollout.max_staleness: 2`` with ``rollout.partial_rollouts``: up to two iterations
  ahead, and episodes in flight take each update's weights at their next turn;
- ``async2p2t``: the same with two torch threads each for generation and the update (four on two cores).

The env is ``search-qa-v0`` behind a wrapper that sleeps ``--latency`` seconds in every step, standing
for a tool call that waits on something else (a web request, a sandbox, a judge): the collector steps
in-process envs one after another, so a turn of B × G live episodes waits B × G × latency. The table
gives the mean seconds per iteration and their parts (generation, env, update: where a collection ran
during updates, its time is not waited for), the overlap, the staleness of the batches, and the
speed-up over ``sync``. Learning with asynchrony is measured by ``benchmarks/algorithms.py --tag async2p
--set rollout.max_staleness=2 --set rollout.partial_rollouts=true`` (the maze, 3 seeds).

Rows accumulate in ``benchmarks/results/async_rollouts.json`` with their ``provenance``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from provenance import child_run, measured_child, provenance, timed_training

RESULTS = Path(__file__).resolve().parent / "results" / "async_rollouts.json"
SLOW_ENV = "bench/slow-search-qa-v0"
MODES = {
    "sync": ["rollout.max_staleness=0"],
    "sync2t": ["rollout.max_staleness=0", "model.num_threads=2"],
    "async1": ["rollout.max_staleness=1"],
    "async2p": ["rollout.max_staleness=2", "rollout.partial_rollouts=true"],
    "async2p2t": ["rollout.max_staleness=2", "rollout.partial_rollouts=true", "model.num_threads=2"],
}
MODELS = {
    "smollm2": ["model={path: smollm2, num_threads: 1}", "optim.lr=1.0e-5", "optim.response_logits=true",
                "optim.micro_batch_tokens=4096", "rollout.max_prompt_tokens=1024"],
    "tiny": ["model.num_threads=1"],
}


def register_slow_env(latency_s: float) -> None:
    """``SLOW_ENV``: search-qa whose every step also waits ``latency_s`` seconds."""
    import agentgym
    from agentgym.registry import load_env_creator

    search_qa = load_env_creator(agentgym.spec("search-qa-v0"))

    class ToolLatency(search_qa):  # type: ignore[misc, valid-type]
        """Waits ``latency_s`` in every step, as a tool call that waits on a remote service would."""

        def step(self, action: str) -> Any:
            time.sleep(latency_s)
            return super().step(action)

    agentgym.register(SLOW_ENV, ToolLatency, description="search-qa with a fixed latency in every step",
                      max_turns=3, action_format="raw", override=True)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One short training run in this process; its per-iteration timings (the warm-up left out)."""
    register_slow_env(spec["latency"])
    overrides = [f"env.id={SLOW_ENV}", f"iterations={spec['iterations'] + 1}", "checkpoint_every=0",
                 "sft.enabled=false", "eval.num_episodes=1", "rollout.constraint=null",
                 f"rollout.num_tasks={spec['tasks']}", f"rollout.group_size={spec['group']}",
                 f"rollout.max_new_tokens={spec['max_new_tokens']}", "env.max_turns=2",
                 "rollout.require_tool_calls=false", "optim.num_minibatches=1",
                 *MODELS[spec["model"]], *MODES[spec["mode"]], *spec["set"]]
    return timed_training("configs/search_qa_grpo_tiny.yaml", overrides, [
        "perf/iteration_s", "perf/generate_s", "perf/env_s", "perf/update_s", "perf/rollout_wait_s",
        "perf/overlap_s", "rollout/staleness", "rollout/turns"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="smollm2")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["sync", "sync2t", "async1",
                                                                              "async2p"])
    parser.add_argument("--latency", type=float, default=1.0, help="seconds every env step waits")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations (one more warms up)")
    parser.add_argument("--tasks", type=int, default=4, help="rollout.num_tasks")
    parser.add_argument("--group", type=int, default=2, help="rollout.group_size")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], help="extra override (key=value)")
    parser.add_argument("--note", default="", help="what else ran on the machine, recorded with the rows")
    args = child_run(parser, argv, run_one)
    if args is None:
        return
    rows = []
    for mode in args.modes:
        spec = {"model": args.model, "mode": mode, "latency": args.latency, "iterations": args.iterations,
                "tasks": args.tasks, "group": args.group, "max_new_tokens": args.max_new_tokens,
                "set": args.set}
        rows.append(measured_child(__file__, spec, omp_threads="1", note=args.note))
        print(f"{mode}: {rows[-1]['iteration_s']:.1f} s/iteration", flush=True)
    base = next((r["iteration_s"] for r in rows if r["mode"] == "sync"), None)
    print(f"\n{args.model}, search-qa with {args.latency:g} s per env step, {args.tasks} tasks x "
          f"{args.group}, {args.iterations} timed iterations\n")
    print("| mode | s/iteration | generate s | env s | update s | waited s | overlap s | staleness | "
          "speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        speedup = f"{base / r['iteration_s']:.2f}x" if base else "-"
        print(f"| {r['mode']} | {r['iteration_s']:.1f} | {r['generate_s']:.1f} | {r['env_s']:.1f} | "
              f"{r['update_s']:.1f} | {r['rollout_wait_s']:.1f} | {r['overlap_s']:.1f} | "
              f"{r['staleness']:.2f} | {speedup} |")
    record = provenance(argv)
    kept = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
    RESULTS.write_text(json.dumps({"rows": kept + [{**r, "provenance": record} for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
