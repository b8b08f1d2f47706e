"""Generated tokens/s of ``TransformersPolicy``'s decoding engines: ``dynamic``, ``static``, ``compiled``.

    python benchmarks/decode_modes.py                                  # SmolLM2 on the CPU, batches 1 8 64
    python benchmarks/decode_modes.py --model gpu --device cuda        # a 0.36 B Qwen2-shaped model on a GPU
    python benchmarks/decode_modes.py --model tiny --new-tokens 32     # the byte model, in seconds

``model.decode`` chooses the engine (``agentgym.backends.decode_steps``): ``dynamic`` grows its cache a
column a step and drops finished rows; ``static`` preallocates the cache and keeps every step one shape;
``compiled`` runs those fixed-shape steps through ``torch.compile`` (CUDA graphs on a GPU). Each batch holds
distinct random prompts of 32-64 tokens, decoded greedily with no stop token, so every row generates
exactly ``--new-tokens`` ids. Per engine and batch: the first call's seconds (for ``compiled`` that is
where compiling happens) and the median of ``--repeats`` further calls; the speed-up is against
``dynamic`` at the same batch, and "same tokens" the share of rows whose ids equal ``dynamic``'s (bfloat16
rounding differs between the engines' kernels, so on a GPU a near-tie may break the other way). Rows merge
into ``results/decode_modes.json`` by (model, device, engine, batch), with their provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from provenance import provenance

from agentgym.backends.config import DECODE_MODES, TinyModelConfig
from agentgym.backends.tiny import build_tiny_model, load_model_and_tokenizer
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.policy import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "decode_modes.json"
#: The shape ``gpu_scale.py`` measures: Qwen2-style, 24 layers of width 1024 (about 0.36 B parameters).
GPU_SHAPE = TinyModelConfig(arch="qwen2", hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=2,
                            intermediate_size=4096, max_position_embeddings=4096, tie_word_embeddings=False)
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192)


def build(model: str, device: str) -> tuple[Any, Any]:
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if model == "smollm2":
        net, tokenizer = load_model_and_tokenizer("smollm2", dtype=dtype)
    else:
        net, tokenizer = build_tiny_model(GPU_SHAPE if model == "gpu" else TINY)
    return net.to(device, dtype).eval(), tokenizer


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(policy: TransformersPolicy, prompts: list[list[int]], params: SamplingParams,
          repeats: int, device: str) -> tuple[float, float, list[list[int]]]:
    """(first call's seconds, median seconds of the next ``repeats`` calls, the token ids)."""
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        started = time.perf_counter()
        generations = policy.generate(prompts, params)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times[1:]), [g.token_ids for g in generations]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "gpu", "tiny"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", nargs="+", default=list(DECODE_MODES), choices=list(DECODE_MODES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = build(args.model, args.device)
    rng = np.random.default_rng(0)
    vocab = min(int(model.get_input_embeddings().num_embeddings), 30_000)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0)
    rows, baseline = [], {}
    for batch in args.batch:
        prompts = [rng.integers(1, vocab, int(rng.integers(32, 65))).tolist() for _ in range(batch)]
        for mode in ["dynamic", *[m for m in args.modes if m != "dynamic"]]:
            policy = TransformersPolicy(model, tokenizer, stop_token_ids=[], decode=mode)
            first, seconds, ids = timed(policy, prompts, params, args.repeats, args.device)
            if mode == "dynamic":
                baseline[batch] = (seconds, ids)
            tokens = sum(len(row) for row in ids)
            same = sum(a == b for a, b in zip(ids, baseline[batch][1], strict=True)) / batch
            rows.append({"model": args.model, "device": args.device, "engine": mode, "batch": batch,
                         "new_tokens": args.new_tokens, "first_call_s": round(first, 3),
                         "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1),
                         "speedup": round(baseline[batch][0] / seconds, 2),
                         "same_tokens": same,
                         "threads": torch.get_num_threads(), "note": args.note})
            if mode not in args.modes:
                rows.pop()  # dynamic ran only as the baseline

    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"{args.model} on {device_name}, {args.new_tokens} new tokens per row, greedy\n")
    print("| engine | batch | first call s | s (median) | tokens/s | vs dynamic | same tokens |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['engine']} | {r['batch']} | {r['first_call_s']:.2f} | {r['seconds']:.3f} | "
              f"{r['tokens_per_s']:.0f} | {r['speedup']:.2f}× | {r['same_tokens']:.0%} |")
    stamp = provenance()
    kept = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    key = ("model", "device", "engine", "batch")
    fresh = {tuple(r[k] for k in key) for r in rows}
    kept = [r for r in kept if tuple(r[k] for k in key) not in fresh]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": kept + [{**r, "device_name": device_name, "provenance": stamp}
                                                   for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
