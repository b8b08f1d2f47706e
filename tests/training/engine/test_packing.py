"""Packing: exact rows/masks/advantages, truncation, log-prob alignment against ``score``, minibatches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# After the skips above, so that a missing torch or transformers skips this file instead of failing it.
from agentgym.backends.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.backends.transformers_backend import TransformersPolicy, entropy_of  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.rollout.records import Turn  # noqa: E402
from agentgym.training.api.terms import (  # noqa: E402
    EntropyArgs,
    EntropyTerm,
    ForwardOutputs,
    KLArgs,
    KLTerm,
    total_loss,
)
from agentgym.training.config.schema import LossConfig  # noqa: E402
from agentgym.training.engine.losses import get_policy_loss  # noqa: E402
from agentgym.training.engine.packing import (  # noqa: E402
    TokenBatch,
    minibatches,
    pack_turns,
    sequence_logprobs,
    token_minibatches,
)

PAD = 256


def turn(prompt, response, logprobs=None) -> Turn:
    if logprobs is None:
        logprobs = [-0.1 * (k + 1) for k in range(len(response))]
    return Turn(list(prompt), list(response), list(logprobs), 0.0, "s")


def random_turns(seed: int, num: int, vocab: int = 256) -> list[Turn]:
    rng = np.random.default_rng(seed)
    turns = []
    for _ in range(num):
        prompt = rng.integers(0, vocab, int(rng.integers(1, 12))).tolist()
        response = rng.integers(0, vocab, int(rng.integers(0, 8))).tolist()
        turns.append(turn(prompt, response, (-rng.random(len(response)) * 3).tolist()))
    return turns


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128))
    return model, tokenizer


# --- pack_turns ------------------------------------------------------------------------------------------


def test_pack_turns_hand_built_pair():
    turns = [turn([1, 2, 3], [4, 5], [-0.1, -0.2]), turn([6], [7, 8, 9], [-0.3, -0.4, -0.5])]
    batch = pack_turns(turns, [0.5, -1.5], pad_token_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert batch.advantages.tolist() == [[0, 0, 0, 0.5, 0.5], [0, -1.5, -1.5, -1.5, 0]]
    torch.testing.assert_close(
        batch.old_logprobs, torch.tensor([[0, 0, 0, -0.1, -0.2], [0, -0.3, -0.4, -0.5, 0]])
    )
    assert batch.turn_index.tolist() == [0, 1]
    assert (batch.num_rows, batch.seq_len, batch.num_response_tokens) == (2, 5, 5)
    assert batch.input_ids.dtype == torch.long and batch.attention_mask.dtype == torch.long
    assert batch.response_mask.dtype == batch.advantages.dtype == batch.old_logprobs.dtype == torch.float32
    assert batch.turn_step is None  # packed without turn steps


@pytest.mark.parametrize("seed", range(4))
def test_pack_turns_covers_every_response_token(seed):
    turns = random_turns(seed, 9)
    adv = np.random.default_rng(seed).normal(size=len(turns))
    batch = pack_turns(turns, adv, pad_token_id=PAD)
    mask = batch.response_mask.bool()
    assert int(mask.sum()) == sum(len(t.response_ids) for t in turns)
    assert batch.input_ids[mask].tolist() == [i for t in turns for i in t.response_ids]
    torch.testing.assert_close(
        batch.old_logprobs[mask],
        torch.tensor([x for t in turns for x in t.response_logprobs], dtype=torch.float32),
    )
    torch.testing.assert_close(
        batch.advantages[mask],
        torch.tensor([a for t, a in zip(turns, adv, strict=True) for _ in t.response_ids],
                     dtype=torch.float32),
    )
    for row, t in enumerate(turns):
        p, r = len(t.prompt_ids), len(t.response_ids)
        assert batch.input_ids[row, : p + r].tolist() == t.prompt_ids + t.response_ids
        assert batch.attention_mask[row].tolist() == [1] * (p + r) + [0] * (batch.seq_len - p - r)
        assert batch.response_mask[row, :p].sum() == 0 and batch.response_mask[row, p + r :].sum() == 0
    # Outside the response mask advantages and old log-probs are exactly 0.
    assert (batch.advantages[~mask] == 0).all() and (batch.old_logprobs[~mask] == 0).all()


def test_forced_positions_leave_the_response_mask_only_when_asked():
    """``skip_forced``: positions a constraint forced drop out of the mask (also after left truncation);
    the ids, old log-probs and the other positions stay as they were."""
    a = turn([1, 2, 3], [4, 5, 6])
    a.extras["forced_positions"] = [1, 2]
    b = turn([7], [8, 9])  # no constraint: nothing recorded
    plain = pack_turns([a, b], [1.0, -1.0], pad_token_id=PAD, max_length=5)
    skipped = pack_turns([a, b], [1.0, -1.0], pad_token_id=PAD, max_length=5, skip_forced=True)
    assert plain.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert skipped.response_mask.tolist() == [[0, 0, 1, 0, 0], [0, 1, 1, 0, 0]]
    assert torch.equal(plain.input_ids, skipped.input_ids)
    assert torch.equal(plain.old_logprobs, skipped.old_logprobs)
    assert skipped.num_response_tokens == 3
    a.extras["forced_positions"] = [3]
    with pytest.raises(ConfigError, match="turn 0 has forced_positions outside its 3-token response"):
        pack_turns([a, b], [1.0, -1.0], pad_token_id=PAD, skip_forced=True)


def test_pack_turns_accepts_list_array_and_tensor_advantages():
    turns = random_turns(5, 4)
    ref = pack_turns(turns, [0.1, 0.2, 0.3, 0.4], pad_token_id=0)
    for adv in (np.array([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.1, 0.2, 0.3, 0.4], requires_grad=True)):
        assert torch.equal(pack_turns(turns, adv, pad_token_id=0).advantages, ref.advantages)


def test_left_truncation_keeps_every_response_token():
    turns = [turn(range(10, 20), [1, 2, 3]), turn([5, 6], [7]), turn([8], [9, 10, 11, 12, 13])]
    batch = pack_turns(turns, [1.0, 2.0, 3.0], pad_token_id=0, max_length=6)
    assert batch.input_ids.tolist() == [[17, 18, 19, 1, 2, 3], [5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1]]
    torch.testing.assert_close(batch.old_logprobs[0, 3:], torch.tensor([-0.1, -0.2, -0.3]))
    assert batch.advantages[2].tolist() == [0, 3, 3, 3, 3, 3]
    # A response that leaves no room for one prompt token cannot be packed.
    with pytest.raises(ConfigError, match="max_length"):
        pack_turns([turn([1], [2, 3, 4, 5, 6, 7])], [0.0], pad_token_id=0, max_length=6)


@pytest.mark.parametrize(
    "turns, advantages, match",
    [
        ([], [], "no turns"),
        ([turn([1], [2])], [0.0, 1.0], "one advantage per turn"),
        ([turn([1], [2], [-0.1, -0.2])], [0.0], "response_logprobs"),
        ([turn([], [2])], [0.0], "empty prompt"),
        ([turn([1], [2])], [float("nan")], "finite"),
        ([turn([1], [2], [float("-inf")])], [0.0], "non-finite"),
        ([turn([-1], [2])], [0.0], "negative"),
    ],
)
def test_pack_turns_errors(turns, advantages, match):
    with pytest.raises(ConfigError, match=match):
        pack_turns(turns, advantages, pad_token_id=0)


def test_token_batch_helpers():
    batch = pack_turns(random_turns(1, 5), np.arange(5.0), pad_token_id=PAD)
    picked = batch.select(torch.tensor([3, 1]))
    assert picked.turn_index.tolist() == [3, 1]
    assert torch.equal(picked.input_ids, batch.input_ids[[3, 1]])
    assert torch.equal(batch.to("cpu").advantages, batch.advantages)
    trimmed = picked.trim()
    assert trimmed.seq_len == int(picked.attention_mask.sum(-1).max())
    assert torch.equal(trimmed.response_mask.sum(), picked.response_mask.sum())
    with pytest.raises(ConfigError, match="response_mask"):
        TokenBatch(batch.input_ids, batch.attention_mask, batch.response_mask[:, :-1], batch.advantages,
                   batch.old_logprobs, batch.turn_index)


# --- sequence_logprobs --------------------------------------------------------------------------------------


def test_sequence_logprobs_equals_teacher_forced_score(tiny):
    model, tokenizer = tiny
    turns = random_turns(11, 6, vocab=260)
    batch = pack_turns(turns, [0.0] * len(turns), pad_token_id=tokenizer.pad_token_id)
    policy = TransformersPolicy(model, tokenizer)
    for temperature in (1.0, 0.7):
        scored = policy.score([t.prompt_ids for t in turns], [t.response_ids for t in turns],
                              temperature=temperature)
        with torch.no_grad():
            logprobs, entropy = sequence_logprobs(model, batch, temperature=temperature)
        assert entropy is None
        mask = batch.response_mask.bool()
        for row, expected in enumerate(scored):
            got = logprobs[row][mask[row]].tolist()
            assert len(got) == len(expected)
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        assert (logprobs[:, 0] == 0).all()


def test_sequence_logprobs_entropy_and_chunking(tiny):
    model, tokenizer = tiny
    batch = pack_turns(random_turns(3, 5, vocab=260), [1.0] * 5, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        full_lp, full_ent = sequence_logprobs(model, batch, temperature=0.8, return_entropy=True,
                                              all_positions=True)
        chunk_lp, chunk_ent = sequence_logprobs(model, batch, temperature=0.8, return_entropy=True,
                                                chunk_rows=2, all_positions=True)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    torch.testing.assert_close(full_lp, chunk_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(full_ent, chunk_ent, atol=1e-6, rtol=0)
    reference = torch.log_softmax(logits[:, :-1] / 0.8, dim=-1)
    expected_ent = entropy_of(reference.reshape(-1, reference.shape[-1])).reshape(reference.shape[:2])
    torch.testing.assert_close(full_ent[:, 1:], expected_ent, atol=1e-5, rtol=0)
    assert (full_ent[:, 0] == 0).all() and (full_ent[:, 1:] > 0).all()


def test_sequence_logprobs_gradients_match_plain_log_softmax(tiny):
    model, tokenizer = tiny
    batch = pack_turns(random_turns(4, 4, vocab=260), [1.0, -1.0, 0.5, 2.0],
                       pad_token_id=tokenizer.pad_token_id)
    mask = batch.response_mask

    def grads(objective):
        model.zero_grad()
        objective().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    def chunked():
        lp, ent = sequence_logprobs(model, batch, return_entropy=True, chunk_rows=3)
        return (lp * mask).sum() + 0.3 * (ent * mask).sum()

    def plain():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
        lsm = torch.log_softmax(logits[:, :-1], dim=-1)
        lp = lsm.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        ent = -(lsm.exp() * lsm).sum(-1)
        return (lp * mask[:, 1:]).sum() + 0.3 * (ent * mask[:, 1:]).sum()

    got, expected = grads(chunked), grads(plain)
    model.zero_grad()
    assert got.keys() == expected.keys() and got
    for name in got:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_response_positions_only_equal_every_positions_values_and_gradients(arch):
    """The output layer applied at the response positions only gives what every position's logits give
    there, with the same gradients, and zeros elsewhere."""
    model, tokenizer = build_tiny_model(TinyModelConfig(arch=arch, num_layers=2, hidden_size=32,
                                                        intermediate_size=64))
    batch = pack_turns(random_turns(5, 6, vocab=260), [1.0, -1.0, 0.5, 2.0, 0.0, 1.5],
                       pad_token_id=tokenizer.pad_token_id)
    mask = batch.response_mask.bool()

    def run(all_positions, chunk_rows=None):
        model.zero_grad()
        lp, ent = sequence_logprobs(model, batch, temperature=0.7, return_entropy=True, chunk_rows=chunk_rows,
                                    all_positions=all_positions)
        ((lp * batch.response_mask).sum() + 0.3 * (ent * batch.response_mask).sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return lp.detach(), ent.detach(), grads

    lp, ent, grads = run(False)
    assert model._agentgym_head_ok is True  # the response path was taken
    full_lp, full_ent, full_grads = run(True)
    torch.testing.assert_close(lp[mask], full_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[mask], full_ent[mask], atol=1e-5, rtol=0)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert grads.keys() == full_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], full_grads[name], atol=1e-5, rtol=1e-4)
    chunked_lp, _, _ = run(False, chunk_rows=1)  # one row's worth of tokens per log-softmax chunk
    torch.testing.assert_close(chunked_lp, lp, atol=1e-6, rtol=0)


def test_a_model_whose_logits_are_not_its_output_layer_gets_every_positions_logits(tiny):
    """Logits scaled after the output layer (as some configs do) fail the first-batch check: the full
    path is used, and the values stay right."""
    model, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64))

    class Scaled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, **kwargs):
            out = inner_forward(**kwargs)
            out.logits = out.logits * 2.0
            return out

        def get_decoder(self):
            return self.inner.get_decoder()

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

    inner_forward = model.forward
    scaled = Scaled(model)
    batch = pack_turns(random_turns(2, 3, vocab=260), [1.0] * 3, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = sequence_logprobs(scaled, batch, all_positions=False)
        expected = torch.log_softmax(model(input_ids=batch.input_ids,
                                           attention_mask=batch.attention_mask).logits.float() * 2.0, -1)
    assert scaled._agentgym_head_ok is False
    mask = batch.response_mask.bool()
    reference = expected[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp[:, 1:][mask[:, 1:]], reference[mask[:, 1:]], atol=1e-5, rtol=0)


def test_padding_ids_do_not_change_real_positions(tiny):
    model, tokenizer = tiny
    turns = random_turns(8, 5, vocab=260)
    a = pack_turns(turns, [0.0] * 5, pad_token_id=tokenizer.pad_token_id)
    b = pack_turns(turns, [0.0] * 5, pad_token_id=65)
    with torch.no_grad():
        lp_a, ent_a = sequence_logprobs(model, a, return_entropy=True, all_positions=True)
        lp_b, ent_b = sequence_logprobs(model, b, return_entropy=True, all_positions=True)
    real = a.attention_mask.bool()
    torch.testing.assert_close(lp_a[real], lp_b[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_a[real], ent_b[real], atol=1e-5, rtol=0)


def test_end_to_end_loss_at_recomputed_old_logprobs(tiny):
    """Pack -> recompute old log-probs -> loss: ratio 1 everywhere, only response tokens get gradient."""
    model, tokenizer = tiny
    batch = pack_turns(random_turns(6, 4, vocab=260), [1.0, -0.5, 0.25, 2.0],
                       pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        old, _ = sequence_logprobs(model, batch)
    logprobs, entropy = sequence_logprobs(model, batch, return_entropy=True)
    logprobs.retain_grad()
    terms = {"kl": KLTerm(KLArgs(coef=0.1)), "entropy": EntropyTerm(EntropyArgs(coef=0.01))}
    batch = dataclasses.replace(batch, old_logprobs=old)
    loss, metrics = total_loss(get_policy_loss("ppo_clip"), terms, batch,
                               ForwardOutputs(logprobs, entropy, ref_logprobs=old), LossConfig())
    loss.backward()
    assert metrics["loss/clipfrac"] == 0.0 and metrics["loss/kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert (logprobs.grad[batch.response_mask == 0] == 0).all()
    model.zero_grad()


def test_sequence_logprobs_argument_errors(tiny):
    model, _ = tiny
    batch = pack_turns([turn([1], [2])], [0.0], pad_token_id=0)
    with pytest.raises(ConfigError, match="temperature"):
        sequence_logprobs(model, batch, temperature=0.0)
    with pytest.raises(ConfigError, match="chunk_rows"):
        sequence_logprobs(model, batch, chunk_rows=0)


# --- minibatches --------------------------------------------------------------------------------------------


def test_minibatches_are_a_deterministic_partition():
    batch = pack_turns(random_turns(2, 11), np.arange(11.0), pad_token_id=PAD)

    def split(seed, n):
        parts = minibatches(batch, n, generator=torch.Generator().manual_seed(seed))
        return [p.turn_index.tolist() for p in parts], parts

    first, parts = split(0, 3)
    assert split(0, 3)[0] == first
    assert split(1, 3)[0] != first
    flat = [i for part in first for i in part]
    assert sorted(flat) == list(range(11)) and flat != list(range(11))
    assert [len(p) for p in first] == [4, 4, 3]
    for part in parts:  # each part carries its rows unchanged (up to trimmed padding)
        source = batch.select(part.turn_index)
        width = part.seq_len
        assert torch.equal(part.input_ids, source.input_ids[:, :width])
        assert torch.equal(part.advantages, source.advantages[:, :width])
        assert source.attention_mask[:, width:].sum() == 0
    ordered = minibatches(batch, 2, shuffle=False)
    assert [p.turn_index.tolist() for p in ordered] == [list(range(6)), list(range(6, 11))]
    for bad in (0, 12):
        with pytest.raises(ConfigError, match="num_minibatches"):
            minibatches(batch, bad)


def test_token_minibatches_respect_the_budget():
    turns = random_turns(9, 13)
    turns.append(turn(list(range(45)), [1, 2]))  # a row longer than the budget gets its own part
    batch = pack_turns(turns, np.ones(len(turns)), pad_token_id=PAD)
    parts = token_minibatches(batch, 40, generator=torch.Generator().manual_seed(3))
    assert sorted(i for p in parts for i in p.turn_index.tolist()) == list(range(len(turns)))
    for part in parts:
        assert part.num_rows * part.seq_len <= 40 or part.num_rows == 1
    again = token_minibatches(batch, 40, generator=torch.Generator().manual_seed(3))
    assert [p.turn_index.tolist() for p in again] == [p.turn_index.tolist() for p in parts]
    assert sum(p.num_response_tokens for p in parts) == batch.num_response_tokens
    with pytest.raises(ConfigError, match="max_tokens"):
        token_minibatches(batch, 0)


def test_pack_turns_takes_each_rows_turn_step_and_keeps_it_through_minibatches():
    turns = [Turn([1], [2], [-0.1], 0.0, str(i)) for i in range(5)]
    batch = pack_turns(turns, [0.0] * 5, pad_token_id=0, turn_step=[4, 3, 2, 1, 0])
    assert batch.turn_step.tolist() == [4, 3, 2, 1, 0]
    for part in minibatches(batch, 2, generator=torch.Generator().manual_seed(0)):
        assert part.turn_step.tolist() == [4 - i for i in part.turn_index.tolist()]
    with pytest.raises(ConfigError, match="one turn step per turn: 5 turns, 2 turn steps"):
        pack_turns(turns, [0.0] * 5, pad_token_id=0, turn_step=[0, 1])
