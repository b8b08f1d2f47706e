"""GRPO vs RLOO vs GiGPO on the quickstart task: same env, model, demos and budget, several seeds.

    python benchmarks/algorithms.py [--seeds 0 1 2] [--algorithms grpo rloo gigpo] [--iterations 60]

Each run is the embedded quickstart with only ``algorithm.name`` and ``seed`` changed. Prints a
markdown table (held-out success before/after RL, mean ± std over seeds, iterations until the
training rollouts first reach 80% success) and writes ``benchmarks/results/algorithms.json`` and
``algorithms.png`` (training success per iteration, mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentgym.training.loading import load_config
from agentgym.training.loop import train

RESULTS = Path(__file__).resolve().parent / "results"


def first_reaching(history: list[dict], threshold: float, window: int = 3) -> int | None:
    """First iteration where the mean training success over the last ``window`` iterations ≥ threshold."""
    rates = [h["rollout/success_rate"] for h in history]
    for i in range(window - 1, len(rates)):
        if sum(rates[i - window + 1:i + 1]) / window >= threshold:
            return history[i]["iteration"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "rloo", "gigpo"])
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    runs = []
    for algorithm in args.algorithms:
        for seed in args.seeds:
            overrides = [f"algorithm.name={algorithm}", f"seed={seed}", f"iterations={args.iterations}",
                         "checkpoint_every=0"]
            if algorithm != "gigpo":  # the quickstart's algorithm.args are GiGPO's; same penalty for all
                overrides.append("algorithm.args={invalid_action_penalty: 0.1}")
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as out:
                report = train(load_config(None, overrides), out)
            runs.append({
                "algorithm": algorithm, "seed": seed, "wall_s": time.perf_counter() - started,
                "before": report["eval"]["before"]["success_rate"], "after": report["eval"]["after"]["success_rate"],
                "iters_to_80": first_reaching(report["history"], 0.8),
                "curve": [h["rollout/success_rate"] for h in report["history"]],
            })
            print(f"{algorithm} seed {seed}: {runs[-1]['before']:.0%} -> {runs[-1]['after']:.0%} "
                  f"({runs[-1]['wall_s']:.0f} s)", flush=True)
    (RESULTS / "algorithms.json").write_text(json.dumps(runs, indent=2))

    print("\n| algorithm | held-out success before RL | after RL (mean ± std) | gain | iterations to 80% (train) | s/run |")
    print("|---|---:|---:|---:|---:|---:|")
    for algorithm in args.algorithms:
        mine = [r for r in runs if r["algorithm"] == algorithm]
        after = [r["after"] for r in mine]
        before = [r["before"] for r in mine]
        reach = [r["iters_to_80"] for r in mine]
        reached = [x for x in reach if x is not None]
        reach_text = (f"{statistics.mean(reached):.0f} ({len(reached)}/{len(reach)} seeds)" if reached
                      else f"not reached (0/{len(reach)})")
        std = statistics.stdev(after) if len(after) > 1 else 0.0
        print(f"| {algorithm} | {statistics.mean(before):.0%} | {statistics.mean(after):.0%} ± {std:.0%} | "
              f"{statistics.mean(after) - statistics.mean(before):+.0%} | {reach_text} | "
              f"{statistics.mean(r['wall_s'] for r in mine):.0f} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for algorithm in args.algorithms:
        curves = [r["curve"] for r in runs if r["algorithm"] == algorithm]
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(min(map(len, curves)))]
        ax.plot(range(1, len(mean) + 1), mean, label=algorithm)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"training success (mean of {len(args.seeds)} seeds)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("maze-v0 quickstart: GRPO vs RLOO vs GiGPO")
    fig.tight_layout()
    fig.savefig(RESULTS / "algorithms.png", dpi=110)


if __name__ == "__main__":
    main()
