"""LoRA training on CPU with the tiny model: only the adapter moves, the reference is the base model,
the loss falls, checkpoints hold the adapter and resume exactly, ``model/`` is the merged model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from learning import small
from safetensors import safe_open

from agentgym.backends.builder import make_policy
from agentgym.backends.config import LoraConfig, ModelConfig, TinyModelConfig
from agentgym.backends.lora import AdapterDisabled, base_state_dict, is_lora, merged_state_dict
from agentgym.backends.tiny import load_model_and_tokenizer
from agentgym.errors import ConfigError
from agentgym.rollout.records import Turn
from agentgym.training.api.turn_table import TurnTable
from agentgym.training.config.loading import load_config
from agentgym.training.engine.packing import pack_turns, sequence_logprobs
from agentgym.training.run.loop import Trainer, flatten, train

SMALL = small("iterations=3", "model.lora.r=4", "optim.lr=0.01")


def _batch(tokenizer_vocab: int = 256) -> object:
    rng = np.random.default_rng(0)
    turns = [Turn(rng.integers(0, tokenizer_vocab, 12).tolist(), rng.integers(0, tokenizer_vocab, 6).tolist(),
                  [-1.0] * 6, 0.0, str(i)) for i in range(4)]
    return pack_turns(turns, [1.0, -1.0, 0.5, -0.5], pad_token_id=256)


def test_only_the_adapter_trains_and_the_reference_is_the_base_model() -> None:
    cfg = ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu", lora=LoraConfig(r=4))
    policy = make_policy(cfg, seed=3)
    model = policy.model
    assert is_lora(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    plain, _ = load_model_and_tokenizer(TinyModelConfig(num_layers=2, seed=3))
    batch = _batch()
    with torch.no_grad():
        base_lp = sequence_logprobs(plain, batch)[0]
    before = base_state_dict(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model.train()
    for _ in range(3):
        logprobs = sequence_logprobs(model, batch)[0]
        loss = -(logprobs * batch.response_mask * batch.advantages).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    after = base_state_dict(model)
    assert before.keys() == after.keys() == plain.state_dict().keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "a base weight changed"
    with torch.no_grad():
        policy_lp = sequence_logprobs(model, batch)[0]
        ref_lp = sequence_logprobs(AdapterDisabled(model), batch)[0]
    mask = batch.response_mask.bool()
    assert torch.allclose(ref_lp[mask], base_lp[mask], atol=1e-6)
    assert (policy_lp[mask] - base_lp[mask]).abs().max() > 1e-3, "the adapter did not change the policy"
    # The merged weights are a plain model computing what the adapter-on policy computes.
    plain.load_state_dict(merged_state_dict(model))
    with torch.no_grad():
        assert torch.allclose(sequence_logprobs(plain, batch)[0][mask], policy_lp[mask], atol=1e-5)


def test_lora_rl_update_changes_only_the_adapter_and_the_loss_falls(tmp_path: Path) -> None:
    cfg = load_config(None, [*SMALL, "sft.enabled=false", "loss.kl_coef=0.1", "optim.num_minibatches=1"])
    run = Trainer(cfg, tmp_path)
    try:
        run.update.ref_model = AdapterDisabled(run.model)
        groups = run.collector.collect([1, 2], 4, run.sampling(1.0, 0))
        turns = flatten(groups)
        advantages = np.linspace(-1.0, 1.0, len(turns))
        base_before = base_state_dict(run.model)
        adapter_before = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
        losses = [run.update(turns, advantages, TurnTable.from_groups(groups), i)["loss/policy"]
                  for i in range(1, 6)]
        assert losses[-1] < losses[0], losses
        base_after = base_state_dict(run.model)
        assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)
        moved = [n for n, p in run.model.named_parameters() if p.requires_grad
                 and not torch.equal(p, adapter_before[n])]
        assert moved, "no adapter weight changed"
    finally:
        run.close()


def test_lora_sft_loss_falls_and_is_folded_into_the_reference(tmp_path: Path) -> None:
    report = train(load_config(None, [*SMALL, "iterations=1", "loss.kl_coef=0.05"]), tmp_path)
    assert report["sft"]["sft/loss_last"] < report["sft"]["sft/loss_first"]
    assert "lora_base" in torch.load(tmp_path / "reference.pt", weights_only=True)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert "model" not in state and state["adapter"]
    assert all(".lora_" in k for k in state["adapter"])
    # model/ is a plain HF model with the adapter merged in; adapter/ is the PEFT adapter alone.
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    merged, _ = load_model_and_tokenizer(str(tmp_path / "model"))
    assert not any("lora" in k for k in merged.state_dict())
    # The tiny model ties its output projection to the embeddings: stored once, as a plain model's save does.
    with safe_open(str(tmp_path / "model" / "model.safetensors"), "pt") as weights:
        assert "lm_head.weight" not in weights.keys() and "model.embed_tokens.weight" in weights.keys()
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()


def test_lora_resume_is_exact(tmp_path: Path) -> None:
    overrides = [*SMALL, "loss.kl_coef=0.05", "optim.schedule=cosine"]
    full = train(load_config(None, overrides), tmp_path / "full")
    train(load_config(None, overrides), tmp_path / "split", stop_after=1)
    resumed = train(load_config(None, overrides), tmp_path / "split", resume=True)

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in h]

    assert strip(resumed["history"]) == strip(full["history"])
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["adapter"]
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)["adapter"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logged = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in logged] == [1, 2, 3]


def test_lora_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"model.lora.r must be a positive integer"):
        load_config(None, ["model.lora.r=0"])
    with pytest.raises(ConfigError, match=r"match no layer"):
        make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu",
                                lora=LoraConfig(target_modules=("c_attn",))))
    with pytest.raises(ConfigError, match=r"needs model.path"):
        make_policy(ModelConfig(device="cpu", lora=LoraConfig(quantize="4bit")))
