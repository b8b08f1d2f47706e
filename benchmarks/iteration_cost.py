"""What one RL iteration of the packaged real model costs on this machine, and what each saving buys.

    python benchmarks/iteration_cost.py                          # SmolLM2, search-qa, 8 tasks x 4 episodes
    python benchmarks/iteration_cost.py --variants plain shared --iterations 1
    python benchmarks/iteration_cost.py --model tiny             # the byte model, in a minute

Each variant trains the same run (``configs/search_qa_grpo_tiny.yaml`` with ``--model``'s weights, no SFT,
no constraint, GRPO at lr 1e-5 without KL, one minibatch, micro-batches of 4,096 padded tokens) for
``--iterations`` timed iterations after one that warms up, in a process of its own with ``--threads``
torch threads. The variants add one saving at a time:

- ``plain``: every prompt position's logits, a separate no-grad pass for the old log-probs, every row
  computed whole (what the update did before these options);
- ``response_logits``: ``optim.response_logits``, the output layer at the response positions only;
- ``shared``: and ``optim.share_prefixes`` (a group's common prompt, and an episode's repeated history,
  computed once per segment of rows) and ``optim.old_logprobs_from_update`` (the old log-probs from the
  update's own pass);
- ``shared_top``: and ``model.train_top_layers: 6`` (the backward pass stops below SmolLM2's top 6 of 30
  layers; the tiny model: its top 1 of 2).

The table gives seconds per iteration and their parts (generation, env, update), the padded tokens the
update trained on, and the update's speed-up over ``plain``. Rows accumulate in
``benchmarks/results/iteration_cost.json`` with their ``provenance``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from provenance import child_run, measured_child, provenance, timed_training

RESULTS = Path(__file__).resolve().parent / "results" / "iteration_cost.json"
SHARED = ["optim.response_logits=true", "optim.share_prefixes=true", "optim.old_logprobs_from_update=true"]
VARIANTS = {
    "plain": ["optim.response_logits=false"],
    "response_logits": ["optim.response_logits=true"],
    "shared": SHARED,
    "shared_top": SHARED,  # and model.train_top_layers: TOP_LAYERS[model]
}
MODELS = {
    "smollm2": ["model.path=smollm2", "rollout.max_prompt_tokens=1024"],
    "tiny": [],
}
TOP_LAYERS = {"smollm2": 6, "tiny": 1}


def variant_overrides(variant: str, model: str) -> list[str]:
    top = [f"model.train_top_layers={TOP_LAYERS[model]}"] if variant == "shared_top" else []
    return [*VARIANTS[variant], *top]


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One short training run in this process; its per-iteration timings (the warm-up left out)."""
    overrides = [f"iterations={spec['iterations'] + 1}", "checkpoint_every=0", "sft.enabled=false",
                 "eval.num_episodes=1", "rollout.constraint=null", "rollout.require_tool_calls=false",
                 f"rollout.num_tasks={spec['tasks']}", f"rollout.group_size={spec['group']}",
                 f"rollout.max_new_tokens={spec['max_new_tokens']}", f"env.max_turns={spec['turns']}",
                 "optim.num_minibatches=1", "optim.micro_batch_tokens=4096", "optim.lr=1.0e-5",
                 "loss.kl_coef=0.0", f"model.num_threads={spec['threads']}",
                 *MODELS[spec["model"]], *variant_overrides(spec["variant"], spec["model"]), *spec["set"]]
    return timed_training("configs/search_qa_grpo_tiny.yaml", overrides, [
        "perf/iteration_s", "perf/generate_s", "perf/env_s", "perf/update_s", "perf/train_tokens",
        "update/loss_tokens", "rollout/turns"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="smollm2")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations (one more warms up)")
    parser.add_argument("--tasks", type=int, default=8, help="rollout.num_tasks")
    parser.add_argument("--group", type=int, default=4, help="rollout.group_size")
    parser.add_argument("--turns", type=int, default=2, help="env.max_turns")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="model.num_threads")
    parser.add_argument("--set", action="append", default=[], help="extra override (key=value)")
    parser.add_argument("--note", default="", help="what else ran on the machine, recorded with the rows")
    args = child_run(parser, argv, run_one)
    if args is None:
        return
    rows = []
    for variant in args.variants:
        spec = {"model": args.model, "variant": variant, "iterations": args.iterations, "tasks": args.tasks,
                "group": args.group, "turns": args.turns, "max_new_tokens": args.max_new_tokens,
                "threads": args.threads, "set": args.set}
        rows.append(measured_child(__file__, spec, omp_threads=str(args.threads), note=args.note))
        print(f"{variant}: {rows[-1]['iteration_s']:.1f} s/iteration, update {rows[-1]['update_s']:.1f} s",
              flush=True)
    base = next((r["update_s"] for r in rows if r["variant"] == "plain"), None)
    print(f"\n{args.model}, search-qa, {args.tasks} tasks x {args.group} episodes, up to {args.turns} turns "
          f"of {args.max_new_tokens} tokens, {args.threads} threads, {args.iterations} timed iterations\n")
    print("| variant | s/iteration | generate s | env s | update s | trained tokens | turns | "
          "update speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speedup = f"{base / r['update_s']:.2f}x" if base else "-"
        print(f"| {r['variant']} | {r['iteration_s']:.1f} | {r['generate_s']:.1f} | {r['env_s']:.1f} | "
              f"{r['update_s']:.1f} | {r['train_tokens']:.0f} | {r['turns']:.0f} | {speedup} |")
    record = provenance(argv)
    kept = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
    RESULTS.write_text(json.dumps({"rows": kept + [{**r, "provenance": record} for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
