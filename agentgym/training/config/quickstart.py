"""The embedded quickstart: what ``agentgym train`` (and ``make demo``) runs with no config.

A tiny Llama-style model (≈0.1 M parameters, byte-level tokenizer) learns small mazes on CPU in
about two minutes. It sees the 3×3 cells around it and the goal's direction, and answers with a
move. A short SFT warm start on 16 expert episodes leaves it clearly imperfect (≈25–50% held-out
success); GiGPO then raises it. The same settings as a file: ``configs/quickstart_maze_gigpo.yaml``
(a test keeps the two equal).
"""

from __future__ import annotations

from typing import Any

QUICKSTART: dict[str, Any] = {
    "seed": 0,
    "iterations": 60,
    "checkpoint_every": 20,
    "model": {"tiny": {"arch": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                       "intermediate_size": 192, "max_position_embeddings": 256}},
    "env": {"id": "maze-v0", "kwargs": {"size": 2, "observation": "local"}, "max_turns": 10},
    "rollout": {"num_tasks": 8, "group_size": 8, "prompt_mode": "current", "include_instructions": False,
                "show_admissible_actions": False, "max_new_tokens": 8, "temperature": 0.6},
    "algorithm": {"name": "gigpo",
                  "args": {"gamma": 0.95, "mode": "mean_norm", "invalid_action_penalty": 0.1}},
    "optim": {"lr": 3.0e-4, "num_epochs": 1, "num_minibatches": 4, "grad_clip": 1.0},
    "loss": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean", "kl_coef": 0.05,
             "kl_type": "k3", "entropy_coef": 0.0},
    "sft": {"enabled": True, "num_episodes": 16, "num_epochs": 30, "lr": 1.0e-3, "batch_size": 32},
    "eval": {"num_episodes": 64, "temperature": 0.0},
}
