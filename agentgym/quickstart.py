"""The embedded quickstart: what ``agentgym train`` (and ``make demo``) runs with no config.

A tiny Llama-style model (≈0.4 M parameters, byte-level tokenizer) learns a small maze on CPU: a
short SFT warm start on a limited budget of expert demonstrations leaves it clearly imperfect,
then GiGPO improves it. The same settings as a file: ``configs/quickstart_maze_gigpo.yaml``.
"""

from __future__ import annotations

from typing import Any

QUICKSTART: dict[str, Any] = {
    "seed": 0,
    "iterations": 30,
    "checkpoint_every": 10,
    "model": {"arch": "llama", "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 384, "max_position_embeddings": 512},
    "env": {"id": "maze-v0", "kwargs": {"size": 3}, "max_turns": 12},
    "rollout": {"num_tasks": 8, "group_size": 8, "prompt_mode": "window", "window_turns": 0,
                "include_instructions": False, "show_admissible_actions": False,
                "max_new_tokens": 8, "temperature": 1.0},
    "algorithm": {"name": "gigpo", "args": {"gamma": 0.95, "mode": "mean_norm", "invalid_action_penalty": 0.1}},
    "optim": {"lr": 2e-4, "num_epochs": 1, "num_minibatches": 4, "grad_clip": 1.0},
    "loss": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean", "kl_coef": 0.0,
             "entropy_coef": 0.0},
    "sft": {"enabled": True, "num_episodes": 24, "num_epochs": 4, "lr": 1e-3, "batch_size": 32},
    "eval": {"num_episodes": 64, "temperature": 0.0},
}
