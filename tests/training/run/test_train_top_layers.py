"""model.train_top_layers: only the top N decoder layers (and the final norm) train, and the backward pass
stops below them; the gradients of what trains are those of a full backward pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from learning import small

from agentgym.backends.builder import make_policy, train_only_top_layers
from agentgym.backends.config import ModelConfig, TinyModelConfig
from agentgym.errors import ConfigError
from agentgym.training.config.loading import load_config
from agentgym.training.run.loop import Trainer, train

SHAPE = TinyModelConfig(num_layers=3, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _policy(top: int | None) -> torch.nn.Module:
    return make_policy(ModelConfig(tiny=SHAPE, device="cpu", train_top_layers=top), seed=0).model


def test_top_layer_gradients_equal_a_full_backward_and_the_rest_get_none() -> None:
    full, top = _policy(None), _policy(1)
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    grads = {}
    for name, model in (("full", full), ("top", top)):
        model.train()
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean().backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters()}
    trained = {n for n, g in grads["top"].items() if g is not None}
    assert trained == {n for n in grads["top"] if ".layers.2." in n} | {"model.norm.weight"}
    for name in trained:
        assert torch.allclose(grads["top"][name], grads["full"][name], atol=1e-6), name


def test_the_backward_pass_ends_at_the_lowest_trained_layer() -> None:
    model = _policy(2)
    seen: dict[int, bool] = {}
    for index, layer in enumerate(model.get_decoder().layers):
        layer.register_forward_hook(
            lambda module, args, out, index=index: seen.__setitem__(index, (out[0] if isinstance(out, tuple)
                                                                            else out).requires_grad))
    model.train()
    model(input_ids=torch.tensor([[5, 6, 7]]))
    assert seen == {0: False, 1: True, 2: True}  # nothing below layer 1 is part of the graph


def test_a_run_changes_only_the_top_layers_and_the_async_generator_follows(tmp_path: Path) -> None:
    cfg = load_config(None, small("iterations=2", "sft.enabled=true", "model.device=cpu",
                                  "model.train_top_layers=1", "rollout.max_staleness=1"))
    run = Trainer(cfg, tmp_path)
    start = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    run.run()
    end = run.model.state_dict()
    changed = {k for k in start if not torch.equal(start[k], end[k])}
    layers = len(run.model.get_decoder().layers)
    top = f".layers.{layers - 1}."
    assert changed and all(top in k or k == "model.norm.weight" for k in changed), changed
    generated = run.generator.model.state_dict()
    assert all(torch.equal(generated[k], end[k]) for k in end)  # the final evaluation played these weights
    run.close()


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.train_top_layers=0"], "must be a positive integer"),
    (["model.train_top_layers=true"], "must be an integer"),
    (["model.train_top_layers=2", "model.lora.r=4"], "both choose what trains"),
])
def test_bad_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, small(*overrides))


def test_more_layers_than_the_model_has_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has 2 layers; use 1..2"):
        train(load_config(None, small("model.tiny.num_layers=2", "model.train_top_layers=3")), tmp_path)
    with pytest.raises(ConfigError, match="needs a decoder with a list of layers"):
        train_only_top_layers(torch.nn.Linear(2, 2), 1)


def test_sft_can_train_every_layer_while_rl_trains_the_top_ones(tmp_path: Path) -> None:
    """``sft.all_layers``: the warm start changes the lower layers too, RL afterwards only the top one."""
    cfg = load_config(None, small("iterations=1", "sft.enabled=true", "sft.all_layers=true",
                                  "model.device=cpu", "model.train_top_layers=1"))
    run = Trainer(cfg, tmp_path)
    start = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
    seen: dict[str, Any] = {}
    eval_before_rl = run.eval_before_rl

    def after_sft(*args: Any) -> None:  # the warm start is done, RL has not begun
        seen["weights"] = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        seen["trainable"] = {name for name, p in run.model.named_parameters() if p.requires_grad}
        eval_before_rl(*args)

    run.eval_before_rl = after_sft
    run.run()
    after_sft = seen["weights"]
    changed = {k for k in start if not torch.equal(start[k], after_sft[k])}
    assert any(".layers.0." in k for k in changed) and "model.embed_tokens.weight" in changed
    layers = len(run.model.get_decoder().layers)
    top = {k for k in start if f".layers.{layers - 1}." in k or k == "model.norm.weight"}
    assert seen["trainable"] and seen["trainable"] <= top
    end = run.model.state_dict()
    moved = {k for k in end if not torch.equal(after_sft[k], end[k])}
    assert moved and moved <= top, moved
    run.close()
