"""Run by tests/training/run/test_distributed.py, alone or under ``accelerate launch``: one ``PolicyUpdate``
of the tiny model on a fixed batch, for several loss settings; the main process saves the resulting weights.

Usage: python tests/distributed_worker.py OUT.pt [micro_batch_tokens]
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from turn_tables import plan_table

from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig, TinyModelConfig
from agentgym.rollout.records import Turn
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.run.distributed import Distributed

SETTINGS = {
    "token-mean": ["loss.loss_agg_mode=token-mean"],
    "token-mean-kl-entropy": ["loss.loss_agg_mode=token-mean", "loss.kl_coef=0.1", "loss.entropy_coef=0.01"],
    "seq-mean-token-mean": ["loss.loss_agg_mode=seq-mean-token-mean"],
    "seq-mean-token-sum-norm": ["loss.loss_agg_mode=seq-mean-token-sum-norm"],
}


def turns_and_advantages() -> tuple[list[Turn], np.ndarray, TurnTable]:
    """Nine turns of different prompt and response lengths (so rows, tokens and padding all differ)."""
    rng = np.random.default_rng(7)
    turns = []
    for i in range(9):
        prompt = rng.integers(0, 256, int(rng.integers(3, 14))).tolist()
        response = rng.integers(0, 256, int(rng.integers(1, 9))).tolist()
        turns.append(Turn(prompt, response, rng.normal(-3, 0.3, len(response)).tolist(), 0.0, str(i)))
    index = plan_table([f"t{i}" for i in range(9)], np.zeros(9, dtype=np.int64),
                       np.arange(9, dtype=np.int64) // 3)
    return turns, rng.normal(0, 1, 9), index


def run(micro_batch_tokens: int | None) -> dict[str, dict[str, torch.Tensor]]:
    dist = Distributed.create()
    turns, advantages, index = turns_and_advantages()
    results = {}
    for name, overrides in SETTINGS.items():
        cfg = load_config(None, ["optim.num_minibatches=2", "optim.lr=0.5", "algorithm.name=grpo",
                                 *overrides])
        policy = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu"), seed=1)
        model = policy.model
        reference = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu"), seed=2).model
        # SGD: the update is linear in the gradient, so it shows the gradients agree (Adam divides tiny
        # gradients by their own size, which magnifies float rounding).
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
        trained, optimizer = dist.prepare(model, optimizer)
        update = PolicyUpdate(trained, optimizer, PluginSet.from_config(cfg), cfg.loss, cfg.optim,
                              temperature=1.0, max_length=64, pad_token_id=256, seed=0, ref_model=reference,
                              dist=dist, micro_batch_tokens=micro_batch_tokens)
        metrics = update(turns, advantages, index, 1)
        results[name] = {"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                         "loss": torch.tensor(metrics["loss/policy"])}
    return results


if __name__ == "__main__":
    out = sys.argv[1]
    budget = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "none" else None
    results = run(budget)
    if Distributed.create().is_main:
        torch.save(results, out)


def initial_parameters() -> dict[str, torch.Tensor]:
    """The weights every setting starts from."""
    policy = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu"), seed=1)
    return policy.model.state_dict()
