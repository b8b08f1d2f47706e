"""webshop-v0 baselines and speed: the expert, two random policies, catalog build time and steps/s.

    python benchmarks/webshop_env.py [--episodes 200] [--num-products 500] [--catalog-seed 0]
                                     [--out benchmarks/results/webshop_env.json]

All in one process, through ``agentgym.make("webshop-v0", ...)`` (15-turn budget), episodes on seeds
0..N-1:

* **build**: generating the catalog and indexing it for search (first make), and a second make (cached).
* **expert**: ``expert_action()`` every turn: success (reward 1), mean reward, mean turns.
* **random admissible**: each action drawn uniformly from ``info["admissible_actions"]`` (on the search
  page that is the literal ``search[<query>]``, so this policy seldom sees a product).
* **search + random**: searches the instruction's words first, then clicks uniformly at random among the
  admissible actions: what chance earns once the search is good.
* **steps/s**: env ``step`` calls only (policy time excluded), over all the random episodes.

It prints a markdown table and writes ``benchmarks/results/webshop_env.json`` with the provenance.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import provenance

import agentgym
from agentgym.envs.webshop.catalog import generate_catalog
from agentgym.envs.webshop.search import search_engine

RESULTS = Path(__file__).resolve().parent / "results"


def play(env: Any, seed: int, choose: Any) -> dict[str, Any]:
    """One episode; ``choose(env, info, turn)`` picks each action. Returns its reward, success, turns and the
    time spent in ``step``."""
    _, info = env.reset(seed=seed)
    reward, turns, step_s = 0.0, 0, 0.0
    while True:
        action = choose(env, info, turns)
        start = time.perf_counter()
        _, reward, terminated, truncated, info = env.step(action)
        step_s += time.perf_counter() - start
        turns += 1
        if terminated or truncated:
            return {"reward": float(reward), "success": bool(info.get("success")), "turns": turns,
                    "step_s": step_s, "bought": terminated}


def expert(env: Any, info: dict[str, Any], turn: int) -> str:
    return env.unwrapped.expert_action()


def random_policy(rng: random.Random, search_first: bool) -> Any:
    def choose(env: Any, info: dict[str, Any], turn: int) -> str:
        if search_first and info["admissible_actions"] == ["search[<query>]"]:
            return f"search[{env.unwrapped.goal.search_text}]"
        return rng.choice(info["admissible_actions"])
    return choose


def summarize(name: str, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    count = len(episodes)
    return {"policy": name, "episodes": count,
            "success": sum(e["success"] for e in episodes) / count,
            "mean_reward": sum(e["reward"] for e in episodes) / count,
            "mean_turns": sum(e["turns"] for e in episodes) / count,
            "bought": sum(e["bought"] for e in episodes) / count,
            "steps": sum(e["turns"] for e in episodes), "step_s": sum(e["step_s"] for e in episodes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--num-products", type=int, default=500)
    parser.add_argument("--catalog-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "webshop_env.json")
    args = parser.parse_args(argv)
    kwargs = {"catalog_seed": args.catalog_seed, "num_products": args.num_products}

    start = time.perf_counter()
    env = agentgym.make("webshop-v0", **kwargs)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    agentgym.make("webshop-v0", **kwargs).close()
    cached_make_s = time.perf_counter() - start
    catalog = generate_catalog(args.catalog_seed, args.num_products)
    assert search_engine(catalog) is env.unwrapped.engine

    seeds = range(args.episodes)
    rows = [summarize("expert", [play(env, s, expert) for s in seeds]),
            summarize("random admissible",
                      [play(env, s, random_policy(random.Random(s), False)) for s in seeds]),
            summarize("search + random",
                      [play(env, s, random_policy(random.Random(s), True)) for s in seeds])]
    random_steps = sum(row["steps"] for row in rows[1:])
    random_step_s = sum(row["step_s"] for row in rows[1:])
    result = {"env": "webshop-v0", "kwargs": kwargs, "products": len(catalog.products),
              "goals": len(catalog.goals), "build_s": round(build_s, 3),
              "cached_make_s": round(cached_make_s, 4),
              "steps_per_s": round(random_steps / random_step_s), "expert_steps_per_s":
              round(rows[0]["steps"] / rows[0]["step_s"]), "policies": rows,
              "provenance": provenance(argv, script=__file__)}
    env.close()

    print(f"webshop-v0, {len(catalog.products)} products (catalog seed {args.catalog_seed}), "
          f"{args.episodes} episodes per policy, max 15 turns\n")
    print("| policy | success | mean reward | mean turns | bought |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['policy']} | {row['success']:.1%} | {row['mean_reward']:.3f} "
              f"| {row['mean_turns']:.1f} | {row['bought']:.0%} |")
    print(f"\nbuild (generate + index): {build_s:.2f} s; cached make: {cached_make_s * 1000:.1f} ms; "
          f"env steps/s (random episodes): {result['steps_per_s']}; (expert episodes): "
          f"{result['expert_steps_per_s']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
