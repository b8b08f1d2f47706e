"""Generated tokens/s of the tiny model: in-process ``TransformersPolicy`` vs the OpenAI-compatible path.

The OpenAI-compatible path is what ``model.backend: vllm-server`` and ``agentgym eval --policy URL`` use:
``OpenAIPolicy`` sends one completions request per prompt (token ids in, token ids and log-probs
out) to ``agentgym serve-policy``'s app, started here with uvicorn on 127.0.0.1 (a thread of this
process, so client and server share the machine's cores), which batches concurrent requests into
one ``generate`` call, except seeded ones: a seeded request (what training sends, for reproducible
rollouts) is generated in a batch of its own, so its sample does not depend on other requests.
Both kinds are measured. Same model and prompts; tokens/s counts generated ids.

    python benchmarks/generation_backends.py                  # batches 1 8 32, 32 new tokens, 3 repeats
    python benchmarks/generation_backends.py --batch 64 --new-tokens 64

Prints a markdown table and writes benchmarks/results/generation_backends.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx
import torch
import uvicorn
from provenance import provenance

from agentgym.backends.config import TinyModelConfig
from agentgym.backends.openai_backend import OpenAIEndpoint, OpenAIPolicy
from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.policy import SamplingParams

RESULTS = Path(__file__).parent / "results" / "generation_backends.json"
#: The quickstart's model shape (what ``agentgym train`` with no config trains).
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192)


def serve(policy: TransformersPolicy) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_policy_app(policy, "tiny", max_new_tokens=512),
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server, thread, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("the policy server did not start within 30 s")


def timed(generate, prompts: list[list[int]], params: SamplingParams, repeats: int) -> tuple[float, int]:
    generate(prompts[:1], params)  # warm-up
    times, tokens = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        generations = generate(prompts, params)
        times.append(time.perf_counter() - started)
        tokens = sum(len(g.token_ids) for g in generations)
    return statistics.median(times), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    policy = TransformersPolicy.from_pretrained(TINY, seed=0)
    server, thread, url = serve(policy)
    remote = OpenAIPolicy(OpenAIEndpoint(f"{url}/v1", "tiny"), policy.tokenizer, concurrency=64)
    # Sampling that never stops early, so every row generates exactly --new-tokens ids.
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    eos = policy.tokenizer.eos_token_id
    policy.stop_token_ids = frozenset()  # both paths share this policy object
    rows = []
    try:
        for batch in args.batch:
            prompts = [policy.tokenizer.apply_chat_template(
                [{"role": "user", "content": f"task {i}: find the exit of maze {i}"}], tokenize=True,
                add_generation_prompt=True) for i in range(batch)]
            prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
            unseeded = dataclasses.replace(params, seed=None)
            for name, generate, how in (("transformers (in-process)", policy.generate, params),
                                        ("OpenAI-compatible, seeded requests", remote.generate, params),
                                        ("OpenAI-compatible, unseeded requests", remote.generate, unseeded)):
                seconds, tokens = timed(generate, prompts, how, args.repeats)
                rows.append({"backend": name, "batch": batch, "new_tokens": args.new_tokens, "tokens": tokens,
                             "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1)})
    finally:
        remote.close()
        server.should_exit = True
        thread.join(timeout=15)
        policy.stop_token_ids = frozenset({eos})
    print("| backend | batch | generated tokens | s (median) | tokens/s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['batch']} | {r['tokens']} | {r['seconds']:.3f} | "
              f"{r['tokens_per_s']:.0f} |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"model": "tiny (quickstart shape)", "threads": torch.get_num_threads(),
                                   "provenance": provenance(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
