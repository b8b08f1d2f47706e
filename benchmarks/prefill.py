"""Generation with a batch's common prompt prefix computed once, against the plain prefill.

    python benchmarks/prefill.py                  # SmolLM2, 3x3 mazes, current-observation prompts
    python benchmarks/prefill.py --env search-qa-v0 --env-kwargs '{}' --prompt-mode window
    python benchmarks/prefill.py --model tiny     # the byte model, in seconds

Plays ``--episodes`` episodes of ``--env`` with its expert for ``--turns`` turns and renders each turn's
prompt as training does (the env's instructions in the system message; ``--prompt-mode``), then times
``TransformersPolicy.generate`` on every turn's batch (the prompts of all episodes at that turn; greedy,
``--new-tokens`` tokens) two ways, alternating, ``--repeats`` times each: ``shared``, where the tokens that
all of a batch's prompts start with run once and each row continues them (``agentgym.backends.prefill``),
and ``plain`` (``min_shared_prefix`` above every prompt's length: each distinct prompt whole). Both give
the same tokens (checked here on every batch). The table gives per turn the rows, mean prompt tokens, the
shared prefix, the median seconds of each and the speed-up; rows go to ``results/prefill.json`` with
their provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from provenance import provenance

import agentgym
from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig
from agentgym.backends.prefill import shared_prefix_length
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptSettings

RESULTS = Path(__file__).resolve().parent / "results" / "prefill.json"
MODELS = {"smollm2": ModelConfig(path="smollm2"), "tiny": ModelConfig()}


def turn_prompts(policy: Any, env_id: str, env_kwargs: dict, mode: str, episodes: int,
                 turns: int) -> list[list[list[int]]]:
    """Per turn, the prompt ids of every episode still running at it (the expert plays)."""
    renderer = PromptSettings(prompt_mode=mode, show_admissible_actions=False).renderer(policy.tokenizer,
                                                                                        "plain")
    batches: list[list[list[int]]] = [[] for _ in range(turns)]
    for seed in range(episodes):
        env = agentgym.make(env_id, **env_kwargs)
        observation, info = env.reset(seed=seed)
        conv = renderer.start(observation, info)
        for turn in range(turns):
            batches[turn].append(renderer.prompt_ids(conv))
            action = env.expert_action()
            observation, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            renderer.record(conv, [], action, observation, info)
        env.close()
    return [batch for batch in batches if batch]


def timed(policy: Any, prompts: list[list[int]], params: SamplingParams,
          min_shared: int) -> tuple[float, list]:
    policy.min_shared_prefix = min_shared
    started = time.perf_counter()
    generations = policy.generate(prompts, params)
    return time.perf_counter() - started, [g.token_ids for g in generations]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=list(MODELS))
    parser.add_argument("--env", default="maze-v0")
    parser.add_argument("--env-kwargs", default='{"size": 3}', help="JSON keyword arguments of the env")
    parser.add_argument("--prompt-mode", default="current", choices=["current", "window", "full"])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = make_policy(MODELS[args.model])
    default_min = policy.min_shared_prefix
    batches = turn_prompts(policy, args.env, json.loads(args.env_kwargs), args.prompt_mode, args.episodes,
                           args.turns)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0)
    timed(policy, batches[0], params, default_min)  # warm-up
    rows = []
    for turn, prompts in enumerate(batches):
        times: dict[str, list[float]] = {"shared": [], "plain": []}
        for _ in range(args.repeats):
            shared_s, shared_ids = timed(policy, prompts, params, default_min)
            plain_s, plain_ids = timed(policy, prompts, params, 10**9)
            if shared_ids != plain_ids:
                raise SystemExit(f"turn {turn}: the shared prefill generated other tokens than the plain one")
            times["shared"].append(shared_s)
            times["plain"].append(plain_s)
        rows.append({"turn": turn, "rows": len(prompts),
                     "prompt_tokens": statistics.mean(map(len, prompts)),
                     "shared_prefix": shared_prefix_length(prompts),
                     "plain_s": statistics.median(times["plain"]),
                     "shared_s": statistics.median(times["shared"])})
    print(f"\n{args.model}, {args.env} {args.env_kwargs}, prompt mode {args.prompt_mode}, greedy, "
          f"{args.new_tokens} new tokens, {args.threads} thread(s)\n")
    print("| turn | rows | prompt tokens (mean) | shared prefix | plain s | shared s | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['turn']} | {row['rows']} | {row['prompt_tokens']:.0f} | {row['shared_prefix']} "
              f"| {row['plain_s']:.2f} | {row['shared_s']:.2f} | {row['plain_s'] / row['shared_s']:.2f}× |")
    plain, shared = sum(r["plain_s"] for r in rows), sum(r["shared_s"] for r in rows)
    print(f"| all | | | | {plain:.2f} | {shared:.2f} | {plain / shared:.2f}× |")
    RESULTS.parent.mkdir(exist_ok=True)
    stored = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    stored.append({**vars(args), "turns_measured": rows, "provenance": provenance()})
    RESULTS.write_text(json.dumps(stored, indent=1))


if __name__ == "__main__":
    main()
