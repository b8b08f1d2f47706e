"""On a CUDA GPU: generation and training tokens/s and peak memory of a randomly initialised ~0.4 B model;
GRPO vs GiGPO (same update, different advantages: memory should match) and LoRA vs full fine-tuning.

    python benchmarks/gpu_scale.py                     # about 3 minutes on one H100
    python benchmarks/gpu_scale.py --layers 12 --train-rows 32

The model is a Qwen2-style decoder built from a ``TinyModelConfig`` (hidden 1024, 24 layers, GQA 16/2
heads, MLP 4096, the byte-level vocabulary), nothing downloaded. Generation: ``TransformersPolicy`` in
bfloat16, one batch of prompts sampled to exactly ``--gen-tokens`` ids each. Training: the trainer's
own ``PolicyUpdate`` (float32 weights, bfloat16 autocast, micro-batches of ``--micro-tokens`` padded
tokens, KL 0.01 to a reference: a frozen copy for full fine-tuning, the adapter switched off for
LoRA) on synthetic groups (4 tasks × 4 trajectories × 4 turns of ``--prompt``+``--response`` tokens)
whose advantages each algorithm's estimator computes. Peak memory is ``torch.cuda.max_memory_allocated``
over the timed updates. Writes benchmarks/results/gpu_scale.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from provenance import provenance

from agentgym.backends.config import LoraConfig, TinyModelConfig
from agentgym.backends.lora import AdapterDisabled, apply_lora
from agentgym.backends.tiny import build_tiny_model
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.run.distributed import Distributed
from agentgym.training.run.setup import flatten

RESULTS = Path(__file__).parent / "results" / "gpu_scale.json"
DEVICE = "cuda"


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    """Peak allocated GPU memory since ``reset_peak`` (0 on the CPU, where this is a smoke run only)."""
    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0


def model_config(args: argparse.Namespace) -> TinyModelConfig:
    return TinyModelConfig(arch="qwen2", hidden_size=args.hidden, num_layers=args.layers, num_heads=16,
                           num_kv_heads=2, intermediate_size=4 * args.hidden, max_position_embeddings=4096,
                           tie_word_embeddings=False)


def groups(args: argparse.Namespace, rng: np.random.Generator) -> list[EpisodeGroup]:
    out = []
    for g in range(4):
        trajectories = []
        for t in range(4):
            success = bool(rng.integers(0, 2))
            turns = [Turn(rng.integers(0, 256, args.prompt).tolist(),
                          rng.integers(0, 256, args.response).tolist(),
                          [-5.5] * args.response, float(success and i == 3), f"s{rng.integers(0, 3)}")
                     for i in range(4)]
            trajectories.append(Trajectory(turns, f"task{g}", g, success, trajectory_id=f"g{g}t{t}"))
        out.append(EpisodeGroup(f"g{g}", f"task{g}", g, trajectories))
    return out


def measure_generation(args: argparse.Namespace) -> dict[str, float]:
    model, tokenizer = build_tiny_model(model_config(args))
    policy = TransformersPolicy(model.to(DEVICE, torch.bfloat16), tokenizer, seed=0, stop_token_ids=[])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, args.prompt).tolist() for _ in range(args.gen_batch)]
    params = SamplingParams(max_new_tokens=args.gen_tokens, temperature=1.0, seed=0)
    policy.generate(prompts[:2], replace(params, max_new_tokens=8))  # warm-up
    synchronize()
    reset_peak()
    started = time.perf_counter()
    generations = policy.generate(prompts, params)
    synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(len(g.token_ids) for g in generations)
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters_m": parameters / 1e6, "batch": args.gen_batch, "new_tokens": args.gen_tokens,
            "tokens_per_s": tokens / seconds, "peak_gib": peak_gib()}


def measure_update(args: argparse.Namespace, algorithm: str, lora: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model, _ = build_tiny_model(model_config(args))
    model = model.to(DEVICE)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model = apply_lora(model, LoraConfig(r=64))
        reference = AdapterDisabled(model)
    else:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    cfg = load_config(None, [f"algorithm.name={algorithm}", "loss.kl_coef=0.01", "optim.num_minibatches=4",
                             f"optim.micro_batch_tokens={args.micro_tokens}", "optim.lr=1e-6"])
    plugins = PluginSet.from_config(cfg)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.optim.lr)
    update = PolicyUpdate(model, optimizer, plugins, cfg.loss, cfg.optim, temperature=1.0, max_length=8192,
                          pad_token_id=256, seed=0, ref_model=reference, dist=Distributed.create("bf16"),
                          micro_batch_tokens=cfg.optim.micro_batch_tokens)
    batch = groups(args, np.random.default_rng(1))
    advantages = plugins.algorithm.estimator(batch, plugins.args)
    turns, index = flatten(batch), TurnTable.of(batch)
    update(turns, advantages, index, 0)  # warm-up (allocates the optimiser state)
    synchronize()
    reset_peak()
    started = time.perf_counter()
    tokens = 0.0
    for i in range(args.updates):
        tokens += update(turns, advantages, index, i + 1)["perf/train_tokens"]
    synchronize()
    seconds = time.perf_counter() - started
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = {"algorithm": algorithm, "lora": lora, "trainable_m": trainable / 1e6,
              "train_tokens_per_s": tokens / seconds, "peak_gib": peak_gib(),
              "advantage_std": float(np.std(advantages))}
    del update, optimizer, model, reference
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--gen-batch", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--micro-tokens", type=int, default=16384)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_scale.py needs a CUDA device (--device cpu: a smoke run, no memory figures)")
    generation = measure_generation(args)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"model: {generation['parameters_m']:.0f} M parameters on {name}")
    print(f"generation: {generation['tokens_per_s']:.0f} tokens/s "
          f"(batch {args.gen_batch} x {args.gen_tokens} new tokens, bf16), "
          f"peak {generation['peak_gib']:.2f} GiB")
    rows = [measure_update(args, "grpo", False), measure_update(args, "gigpo", False),
            measure_update(args, "gigpo", True)]
    print("| algorithm | weights trained | trainable M | train tokens/s | peak GiB |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {'LoRA r=64' if r['lora'] else 'all'} | {r['trainable_m']:.1f} | "
              f"{r['train_tokens_per_s']:.0f} | {r['peak_gib']:.2f} |")
    if DEVICE != "cuda":
        return  # a smoke run: no memory figures, nothing to record
    gap = abs(rows[0]["peak_gib"] - rows[1]["peak_gib"]) / rows[0]["peak_gib"]
    print(f"GRPO vs GiGPO peak memory differ by {gap:.2%}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"device": name, "args": vars(args), "provenance": provenance(),
                                   "generation": generation, "updates": rows, "grpo_gigpo_peak_gap": gap},
                                  indent=2))


if __name__ == "__main__":
    main()
