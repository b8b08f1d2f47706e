"""Shared prefixes computed once (agentgym.training.engine.prefix): the segments a batch is cut into, and
log-probs, entropies and gradients equal to the plain pass on random group-shaped batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from turn_tables import plan_table

from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model
from agentgym.errors import ConfigError
from agentgym.rollout.records import Turn
from agentgym.training.api.plugin_set import PluginSet
from agentgym.training.config.loading import load_config
from agentgym.training.engine.packing import pack_turns, sequence_logprobs
from agentgym.training.engine.prefix import prefix_order, prefix_segments, shared_prefix_logprobs
from agentgym.training.engine.update import PolicyUpdate
from agentgym.training.run.distributed import Distributed


def group_turns(rng: random.Random, *, tasks: int, group: int, turns: int, vocab: int = 250,
                logprob: float = -0.5) -> list[Turn]:
    """Turns shaped like an update's: per task a prompt that its ``group`` episodes share, and each
    episode's later turns repeat its own history (earlier responses and observations). Sampler
    log-probs are ``logprob`` plus noise of 0.5."""
    out = []
    for _ in range(tasks):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(20, 90))]
        for _ in range(group):
            history = list(prompt)
            for _ in range(rng.randint(1, turns)):
                response = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 12))]
                behaviour = [logprob + rng.gauss(0, 0.5) for _ in response]
                out.append(Turn(list(history), response, behaviour, 0.0, "a"))
                history += response + [rng.randrange(4, vocab) for _ in range(rng.randint(1, 15))]
    rng.shuffle(out)
    return out


def test_segments_are_cut_where_sharing_pays_and_keep_every_response_in_a_suffix() -> None:
    rng = random.Random(0)
    turns = group_turns(rng, tasks=3, group=4, turns=3)
    batch = pack_turns(turns, [1.0] * len(turns), pad_token_id=0)
    batch = batch.select(prefix_order(batch))
    segments = prefix_segments(batch)
    assert sorted(r for s in segments for r in s.rows) == list(range(batch.num_rows))
    for segment in segments:
        assert segment.rows == list(range(segment.rows[0], segment.rows[-1] + 1))
        if segment.prefix_len:
            ids = batch.input_ids[segment.rows, : segment.prefix_len]
            assert (ids == ids[:1]).all()  # the prefix really is common
            first_response = batch.response_mask[segment.rows].argmax(-1)
            assert (first_response > segment.prefix_len).all()
    # Three tasks whose prompts share nothing: at least three segments, and every one shares a prefix.
    assert len(segments) >= 3 and all(s.prefix_len >= 20 for s in segments)
    # Rows that share nothing stay whole.
    lone = pack_turns([Turn([1, 2, 3], [4], [-0.1], 0.0, "a"), Turn([5, 6, 7], [8], [-0.1], 0.0, "b")],
                      [0.0, 0.0], pad_token_id=0)
    assert [s.prefix_len for s in prefix_segments(lone)] == [0]


def test_a_segment_prefix_ends_before_the_earliest_response() -> None:
    """Two rows whose prompts are equal up to the first's response: the prefix stops a token short of it."""
    prompt = list(range(10, 110))
    turns = [Turn(prompt, [7, 7], [-0.1] * 2, 0.0, "a"), Turn(prompt + [7, 7, 9], [3], [-0.1], 0.0, "b")]
    batch = pack_turns(turns, [0.0, 0.0], pad_token_id=0)
    assert [(s.rows, s.prefix_len) for s in prefix_segments(batch)] == [([0, 1], 99)]


@pytest.mark.parametrize(("arch", "all_positions"), [("llama", True), ("llama", False), ("qwen2", False)])
def test_shared_prefixes_give_the_plain_log_probs_entropies_and_gradients(arch: str,
                                                                         all_positions: bool) -> None:
    model, tokenizer = build_tiny_model(TinyModelConfig(arch=arch, num_layers=2, hidden_size=32,
                                                        intermediate_size=64))
    rng = random.Random(1)
    turns = group_turns(rng, tasks=3, group=4, turns=4)
    advantages = torch.randn(len(turns), generator=torch.Generator().manual_seed(0))
    batch = pack_turns(turns, advantages, pad_token_id=tokenizer.pad_token_id)
    batch = batch.select(prefix_order(batch))
    assert any(s.prefix_len for s in prefix_segments(batch))
    mask = batch.response_mask

    def run(compute):
        model.zero_grad()
        lp, ent = compute(model, batch, temperature=0.8, return_entropy=True, all_positions=all_positions)
        ((lp * batch.advantages).sum() + 0.1 * (ent * mask).sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return lp.detach(), ent.detach(), grads

    lp, ent, grads = run(shared_prefix_logprobs)
    plain_lp, plain_ent, plain_grads = run(sequence_logprobs)
    on = mask.bool()
    torch.testing.assert_close(lp[on], plain_lp[on], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[on], plain_ent[on], atol=1e-5, rtol=0)
    if not all_positions:
        assert (lp[~on] == 0).all()
    assert grads.keys() == plain_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], atol=1e-5, rtol=1e-4)
    # Without autograd (the old and reference passes) too.
    with torch.no_grad():
        again, _ = shared_prefix_logprobs(model, batch, all_positions=all_positions)
        plain, _ = sequence_logprobs(model, batch, all_positions=all_positions)
    torch.testing.assert_close(again[on], plain[on], atol=1e-5, rtol=0)


@pytest.mark.parametrize("overrides", [["loss.loss_agg_mode=token-mean"],
                                       ["loss.loss_agg_mode=seq-mean-token-mean", "loss.kl_coef=0.1",
                                        "loss.entropy_coef=0.01", "optim.response_logits=true"]])
def test_an_update_with_shared_prefixes_moves_the_weights_as_the_plain_one(overrides: list[str]) -> None:
    """The whole update (old log-probs, reference, micro-batches of a token budget, two minibatches): the
    same weights after it, with and without ``optim.share_prefixes``."""
    rng = random.Random(3)
    turns = group_turns(rng, tasks=3, group=3, turns=3)
    advantages = np.random.default_rng(0).normal(0, 1, len(turns))
    table = plan_table([f"t{i}" for i in range(len(turns))], np.zeros(len(turns), dtype=np.int64),
                       np.arange(len(turns), dtype=np.int64) // 3)
    tiny = ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu")
    weights = {}
    for share in (False, True):
        cfg = load_config(None, ["optim.num_minibatches=2", "optim.lr=0.5", "algorithm.name=grpo",
                                 f"optim.share_prefixes={str(share).lower()}", *overrides])
        model, reference = make_policy(tiny, seed=1).model, make_policy(tiny, seed=2).model
        update = PolicyUpdate(model, torch.optim.SGD(model.parameters(), lr=cfg.optim.lr),
                              PluginSet.from_config(cfg), cfg.loss, cfg.optim, temperature=1.0,
                              max_length=512, pad_token_id=256, seed=0, ref_model=reference,
                              micro_batch_tokens=600, response_logits=cfg.optim.response_logits,
                              share_prefixes=share)
        update(turns, advantages, table, 1)
        weights[share] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    start = make_policy(tiny, seed=1).model.state_dict()
    assert max((weights[False][k] - start[k]).abs().max().item() for k in start) > 1e-3
    gap = max((weights[False][k] - weights[True][k]).abs().max().item() for k in start)
    assert gap < 1e-5, gap


def test_shared_prefixes_refuse_gradient_checkpointing_and_several_processes() -> None:
    with pytest.raises(ConfigError, match="gradient checkpointing"):
        load_config(None, ["optim.share_prefixes=true", "model.gradient_checkpointing=true"])
    cfg = load_config(None, ["optim.share_prefixes=true"])

    class TwoProcesses(Distributed):
        def __init__(self) -> None:
            self.rank, self.world_size = 0, 2

    with pytest.raises(ConfigError, match="one process"):
        PolicyUpdate(torch.nn.Linear(1, 1), None, PluginSet.from_config(cfg), cfg.loss, cfg.optim,
                     temperature=1.0, max_length=64, pad_token_id=256, seed=0, dist=TwoProcesses(),
                     share_prefixes=True)


@pytest.mark.parametrize("staleness", [0, 1])
def test_old_log_probs_from_the_update_pass_move_the_weights_as_a_separate_pass(staleness: int) -> None:
    """``optim.old_logprobs_from_update`` (one optimiser step per phase): the same weights as with the
    separate old pass, including a stale batch's importance weights (sampler log-probs differ from the
    trainer's here), alone and with shared prefixes."""
    rng = random.Random(4)
    turns = group_turns(rng, tasks=2, group=3, turns=2, logprob=-5.5)  # about the random model's own
    advantages = np.random.default_rng(1).normal(0, 1, len(turns))
    table = plan_table([f"t{i}" for i in range(len(turns))], np.zeros(len(turns), dtype=np.int64),
                       np.arange(len(turns), dtype=np.int64) // 3)
    tiny = ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu")
    weights, metrics = {}, {}
    for reuse, share in ((False, False), (True, False), (True, True)):
        cfg = load_config(None, ["optim.num_minibatches=1", "optim.lr=0.5", "algorithm.name=grpo",
                                 "loss.kl_coef=0", f"optim.old_logprobs_from_update={str(reuse).lower()}"])
        model = make_policy(tiny, seed=1).model
        update = PolicyUpdate(model, torch.optim.SGD(model.parameters(), lr=cfg.optim.lr),
                              PluginSet.from_config(cfg), cfg.loss, cfg.optim, temperature=1.0,
                              max_length=512, pad_token_id=256, seed=0, micro_batch_tokens=700,
                              share_prefixes=share)
        metrics[reuse, share] = update(turns, advantages, table, 1, staleness=staleness)
        weights[reuse, share] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    start = make_policy(tiny, seed=1).model.state_dict()
    assert max((weights[False, False][k] - start[k]).abs().max().item() for k in start) > 1e-3
    for key in ((True, False), (True, True)):
        gap = max((weights[False, False][k] - weights[key][k]).abs().max().item() for k in start)
        assert gap < 1e-5, (key, gap)
    if staleness:
        expected = metrics[False, False]["offpolicy/is_weight_mean"]
        assert expected != pytest.approx(1.0)
        assert metrics[True, False]["offpolicy/is_weight_mean"] == pytest.approx(expected, rel=0.05)


def test_old_log_probs_from_the_update_pass_need_one_step_per_phase() -> None:
    with pytest.raises(ConfigError, match="one optimiser step per update phase"):
        load_config(None, ["optim.old_logprobs_from_update=true", "optim.num_minibatches=2"])
    load_config(None, ["optim.old_logprobs_from_update=true", "optim.num_minibatches=1"])


def test_sft_with_shared_prefixes_and_response_logits_learns_as_the_plain_one() -> None:
    """The warm start takes the update's options: the same losses step by step, and the same weights up to
    what Adam makes of float rounding (it divides each gradient by its own scale, so rounding in a near-zero
    gradient moves that weight by up to lr; the test bounds it at 1% of the move)."""
    from agentgym.training.config.schema import SFTConfig
    from agentgym.training.engine.update import sft_update

    turns = group_turns(random.Random(5), tasks=3, group=3, turns=3)
    tiny = ModelConfig(tiny=TinyModelConfig(num_layers=2), device="cpu")
    sft = SFTConfig(enabled=True, num_episodes=1, num_epochs=2, lr=0.001, batch_size=8)
    weights, losses = {}, {}
    for cheap in (False, True):
        model = make_policy(tiny, seed=1).model
        losses[cheap] = steps = []
        sft_update(model, turns, sft, max_length=512, pad_token_id=256, grad_clip=1.0, seed=0,
                   on_step=lambda step, total, loss, steps=steps: steps.append(loss), response_logits=cheap,
                   share_prefixes=cheap)
        weights[cheap] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert len(losses[True]) == 4 and losses[True][-1] < losses[True][0]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
    start = make_policy(tiny, seed=1).model.state_dict()
    moved = max((weights[False][k] - start[k]).abs().max().item() for k in start)
    gap = max((weights[False][k] - weights[True][k]).abs().max().item() for k in start)
    assert moved > 1e-3 and gap < 0.01 * moved, (gap, moved)
