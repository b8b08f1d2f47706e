"""Per-env costs and baselines: reset time (cold and cached), steps/s in-process and over HTTP,
expert and random-policy success, mean expert episode length.

    python benchmarks/envs.py [ENV_ID ...] [--episodes 20] [--out benchmarks/results/envs.json]

Every env is measured in its own fresh process with an empty ``$AGENTGYM_CACHE``, so nothing is
warm that a first user would not find warm:

* **make**: import of the env's module + construction (``agentgym.make``), once.
* **cold reset**: the first reset of a seed (generation included: TextWorld and ALFWorld games are
  compiled and written to the disk cache then); median over ``--cold-seeds`` seeds.
* **cached reset**: a reset of one of those seeds again (games come from the cache); median.
* **expert**: ``--episodes`` episodes (seeds 1000, 1001, …) driven by ``env.expert_action()``:
  success rate (``info["success"]``), mean turns, and steps/s over the step calls only.
* **random**: the same seeds, 5 episodes each, each action drawn uniformly from ``info["admissible_actions"]``
  (envs that list them) or from an env-specific random policy (Wordle: a random list word;
  Countdown: a random expression over the numbers); other envs show "—".
* **HTTP steps/s**: ``agentgym serve ENV_ID`` in a separate process (sharing the cache), one
  ``RemoteEnv`` session, expert episodes, step requests only (the expert's own requests are not
  timed).

It prints a markdown table and writes ``benchmarks/results/envs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_server import HOST, free_port, start_server, stop_server  # the shared process helpers
from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results"
EPISODE_SEED = 1000
Policy = Callable[[Any, str, dict[str, Any], random.Random], "str | None"]


def expert_policy(env: Any, _obs: str, _info: dict[str, Any], _rng: random.Random) -> str | None:
    return env.expert_action()


def random_policy(env_id: str) -> Policy:
    """A uniformly random policy for ``env_id``; it answers ``None`` (no action) where there is no natural
    one."""
    if env_id == "wordle-v0":
        from agentgym.envs.games.wordle import load_words

        words = load_words()
        return lambda _env, _obs, _info, rng: rng.choice(words)
    if env_id == "countdown-v0":
        def expression(_env: Any, obs: str, _info: dict[str, Any], rng: random.Random) -> str:
            numbers = re.findall(r"\d+", obs.split("Numbers:")[-1].split("\n")[0]) or ["1", "1"]
            picked = rng.sample(numbers, rng.randint(2, len(numbers)))
            text = picked[0]
            for number in picked[1:]:
                text += f" {rng.choice('+-*/')} {number}"
            return text

        return expression
    return (lambda _env, _obs, info, rng:
            rng.choice(info["admissible_actions"]) if info.get("admissible_actions") else None)


def run_episodes(env: Any, policy: Policy, episodes: int, seed: int,
                 distinct: int | None = None) -> dict[str, Any]:
    """Play ``episodes`` episodes on seeds ``seed, seed + 1, …`` (cycling over ``distinct`` of them);
    returns success rate, mean turns and steps/s over step calls only."""
    rng = random.Random(seed)
    successes, turns, returns, step_s, steps = 0, [], [], 0.0, 0
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode % (distinct or episodes))
        done, count, total = False, 0, 0.0
        while not done:
            action = policy(env, obs, info, rng)
            if action is None:
                return {"unavailable": True}
            start = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            step_s += time.perf_counter() - start
            steps, count, total, done = steps + 1, count + 1, total + reward, terminated or truncated
        successes += bool(info.get("success"))
        turns.append(count)
        returns.append(total)
    return {"success": successes / episodes, "mean_turns": statistics.mean(turns),
            "mean_return": statistics.mean(returns), "steps": steps,
            "steps_per_s": steps / step_s if step_s else float("nan")}


def measure_child(env_id: str, episodes: int, cold_seeds: int) -> dict[str, Any]:
    """Everything for one env, in this (fresh) process."""
    start = time.perf_counter()
    import agentgym

    env = agentgym.make(env_id)
    result: dict[str, Any] = {"env_id": env_id, "make_s": time.perf_counter() - start}
    cold, cached = [], []
    for seed in range(cold_seeds):
        begin = time.perf_counter()
        env.reset(seed=seed)
        cold.append(time.perf_counter() - begin)
    for seed in range(cold_seeds):
        begin = time.perf_counter()
        env.reset(seed=seed)
        cached.append(time.perf_counter() - begin)
    result["first_reset_ms"] = cold[0] * 1000  # also pays the lazy imports of the first game
    result["cold_reset_ms"] = statistics.median(cold) * 1000
    result["cached_reset_ms"] = statistics.median(cached) * 1000
    result["expert"] = run_episodes(env, expert_policy, episodes, EPISODE_SEED) if env.has_expert else None
    policy = random_policy(env_id)
    # The expert's seeds again, 5 times each: games that are generated per seed are generated once.
    random_result = run_episodes(env, policy, episodes * 5, EPISODE_SEED, episodes)
    result["random"] = None if random_result.get("unavailable") else random_result
    env.close()

    port = free_port()
    server = start_server([sys.executable, "-m", "agentgym", "serve", env_id, "--host", HOST,
                           "--port", str(port), "--log-level", "warning"], port)
    try:
        from agentgym.http.client import RemoteEnv

        remote = RemoteEnv(env_id, base_url=f"http://{HOST}:{port}")
        result["http"] = run_episodes(remote, expert_policy if remote.has_expert else policy,
                                      min(episodes, 10), EPISODE_SEED)
        remote.close()
    finally:
        stop_server(server)
    return result


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _num(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [("| env | make s | first reset ms | cold reset ms | cached reset ms | steps/s in-process "
              "| steps/s HTTP | expert success | expert return | expert turns | random success "
              "| random return |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| `{row['env_id']}` | failed: {row['error'][:100]} | | | | | | | | | | |")
            continue
        expert, rand, http = row["expert"], row["random"], row["http"]
        inproc = expert or rand
        lines.append(
            f"| `{row['env_id']}` | {row['make_s']:.2f} | {row['first_reset_ms']:.1f} | "
            f"{row['cold_reset_ms']:.1f} | {row['cached_reset_ms']:.2f} | "
            f"{inproc['steps_per_s']:,.0f} | {http['steps_per_s']:,.0f} | "
            f"{_pct(expert and expert['success'])} | "
            f"{_num(expert and expert['mean_return'])} | {_num(expert and expert['mean_turns'], '.1f')} | "
            f"{_pct(rand and rand['success'])} | {_num(rand and rand['mean_return'])} |"
            if inproc and http
            else f"| `{row['env_id']}` | {row['make_s']:.2f} | {row['first_reset_ms']:.1f} | "
            f"{row['cold_reset_ms']:.1f} | {row['cached_reset_ms']:.2f} | — | — | — | — | — | — | — |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_ids", nargs="*", help="env ids (default: every registered env)")
    parser.add_argument("--episodes", type=int, default=20,
                        help="expert episodes per env (random: 5x as many)")
    parser.add_argument("--cold-seeds", type=int, default=3, help="seeds reset cold, then again cached")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="limit per env")
    parser.add_argument("--out", type=Path, default=RESULTS / "envs.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_child(args.child, args.episodes, args.cold_seeds)))
        return 0

    import agentgym

    env_ids = args.env_ids or [spec.id for spec in agentgym.list_envs() if not spec.id.startswith("test/")]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"# envs on {machine}; {args.episodes} expert episodes per env\n", flush=True)
    rows = []
    for env_id in env_ids:
        with tempfile.TemporaryDirectory(prefix="agentgym-cache-") as cache:
            command = [sys.executable, __file__, "--child", env_id, "--episodes", str(args.episodes),
                       "--cold-seeds", str(args.cold_seeds)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s,
                                      env={**os.environ, "AGENTGYM_CACHE": cache}, check=False)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip()
                                       else "no output")
                row = json.loads(done.stdout.strip().splitlines()[-1])
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                row = {"env_id": env_id, "error": str(exc)}
        rows.append(row)
        print(markdown_table([row]).splitlines()[-1], flush=True)
    print("\n" + markdown_table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "provenance": provenance(argv, script=__file__),
                                    "episodes": args.episodes, "rows": rows}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
