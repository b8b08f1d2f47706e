"""Advantage time of every estimator for 10k and 100k turns, short and long trajectories.

    python benchmarks/estimators.py [--turns 10000 100000] [--lengths 20 100] [--repeats 5]

Targets on one core at 100k turns: GiGPO < 0.5 s, HGPO ≤ 0.6 s (the reference HGPO takes about 70 s
on 100k turns of long trajectories). Times the estimator call on pre-built groups and prints a markdown
table. The batch's ``TurnTable`` is built by the first call and reused by the later ones (``TurnTable.of``
keeps it, as a training iteration builds it once for the estimator, the plan and packing), so the best
time is the estimator's own work.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.training.api.algorithm import get_algorithm


def build_groups(num_turns: int, group_size: int = 8, turns_per_trajectory: int = 20, seed: int = 0
                 ) -> list[EpisodeGroup]:
    """Maze-like batch: 50 states per task, sparse terminal rewards, 10% invalid actions, a critic value per
    turn (``ppo``)."""
    rng = np.random.default_rng(seed)
    groups, made = [], 0
    while made < num_turns:
        trajectories = []
        for _ in range(group_size):
            length = min(turns_per_trajectory, num_turns - made) or 1
            states = rng.integers(0, 50, size=length)
            rewards = np.zeros(length)
            rewards[-1] = float(rng.random() < 0.5)
            invalid = rng.random(length) < 0.1
            values = rng.random(length)  # what ppo's critic would have written
            turns = [Turn([], [], [], float(r), f"s{s}", bool(i), extras={"critic_value": float(v)})
                     for s, r, i, v in zip(states, rewards, invalid, values, strict=True)]
            trajectories.append(Trajectory(turns, f"task{len(groups)}", len(groups)))
            made += length
            if made >= num_turns:
                break
        groups.append(EpisodeGroup(f"g{len(groups)}", f"task{len(groups)}", len(groups), trajectories))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 100],
                        help="turns per trajectory (the last trajectory of a batch may be shorter)")
    parser.add_argument("--algorithms", nargs="+",
                        default=["gigpo", "hgpo", "graphgpo", "ppo", "seeupo", "grpo", "rloo"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| estimator | turns | turns per trajectory | best s | median s |")
    print("|---|---:|---:|---:|---:|")
    for num_turns in args.turns:
        for length in args.lengths:
            groups = build_groups(num_turns, turns_per_trajectory=length)
            for name in args.algorithms:
                algo = get_algorithm(name)
                algo_args = algo.make_args({})
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    algo.estimator(groups, algo_args)
                    times.append(time.perf_counter() - start)
                print(f"| {name} | {num_turns:,} | {length} | {min(times):.4f} | "
                      f"{float(np.median(times)):.4f} |", flush=True)


if __name__ == "__main__":
    main()
