"""``TransformersPolicy``: batched KV-cached decoding checked against a naive loop, log-probs, stops,
seeds."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# After the skips above, so that a missing torch or transformers skips this file instead of failing it.
from agentgym.backends import decode_steps, transformers_backend  # noqa: E402
from agentgym.backends.tiny import ByteTokenizer, TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.backends.transformers_backend import TransformersPolicy  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.rollout.policy import Generation, Policy, SamplingParams  # noqa: E402

EOS = 259
#: Prompts of different lengths (1 to 23 tokens), so left padding and position ids matter.
PROMPTS = [[60], [72, 105, 33], [258, 117, 115, 101, 114, 10, 104, 105], list(range(40, 63)), [1, 2, 3, 4, 5]]


def greedy_reference(
    model, prompt: list[int], max_new_tokens: int, stop_ids=(EOS,)
) -> tuple[list[int], list[float]]:
    """One prompt at a time, no cache, full forward every step, argmax."""
    ids = list(prompt)
    out, lps = [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            out.append(token)
            lps.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
            if token in stop_ids:
                break
    return out, lps


def steered_model(arch: str = "llama", *, ascii_only: bool = False, eos_at: dict | None = None):
    """A tiny model with an untied output layer edited so greedy text is printable ASCII, or so
    that greedy decoding of some prompts samples eos early (it swaps output rows of eos and the
    token the unedited model would emit there)."""
    model, tok = build_tiny_model(TinyModelConfig(arch=arch, tie_word_embeddings=False, seed=5))
    with torch.no_grad():
        weight = model.lm_head.weight
        if ascii_only:
            keep = torch.zeros(weight.shape[0], dtype=torch.bool)
            keep[32:127] = True
            weight[~keep] = 0.0
            weight[keep] *= 10.0
        if eos_at is not None:
            prompt, step = eos_at["prompt"], eos_at["step"]
            token = greedy_reference(model, prompt, step + 1, stop_ids=())[0][step]
            weight[[token, EOS]] = weight[[EOS, token]]
    return model, tok


def absolute_position_model():
    """A GPT-2 with learned absolute position embeddings: unlike rotary models (invariant to shifting
    every position of a row), its outputs change if left padding shifts the position ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=260,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=257,
        eos_token_id=EOS,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    return TransformersPolicy(model, tok, seed=0)


def test_implements_policy_protocol(policy: TransformersPolicy) -> None:
    assert isinstance(policy, Policy)
    assert policy.stop_token_ids == {EOS}
    assert policy.generate([], SamplingParams()) == []


# --- greedy decoding vs the naive reference ----------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_batch_equals_naive_reference(arch: str) -> None:
    if arch == "gpt2":
        model, tok = absolute_position_model(), ByteTokenizer()
    else:
        model, tok = build_tiny_model(TinyModelConfig(arch=arch, seed=2))
    policy = TransformersPolicy(model, tok)
    gens = policy.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ref_ids, ref_lps = greedy_reference(model, prompt, 12)
        assert gen.token_ids == ref_ids
        assert gen.logprobs == pytest.approx(ref_lps, abs=1e-4)
        assert gen.finish_reason == ("stop" if ref_ids[-1] == EOS else "length")
    assert policy.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0)) == gens


def test_greedy_batch_of_one_equals_batch_of_many(policy: TransformersPolicy) -> None:
    params = SamplingParams(max_new_tokens=10, temperature=0, num_top_logprobs=3, return_entropy=True)
    together = policy.generate(PROMPTS, params)
    for prompt, gen in zip(PROMPTS, together, strict=True):
        [alone] = policy.generate([prompt], params)
        assert alone.token_ids == gen.token_ids
        assert alone.logprobs == pytest.approx(gen.logprobs, abs=1e-5)
        assert alone.entropies == pytest.approx(gen.entropies, abs=1e-5)


@pytest.mark.parametrize("shrink_cache", [True, False])
def test_rows_that_hit_eos_stop_while_others_continue(shrink_cache: bool, monkeypatch) -> None:
    model, tok = steered_model(eos_at={"prompt": PROMPTS[1], "step": 3})
    if not shrink_cache:  # the fallback for caches that cannot drop rows: finished rows get masked padding
        monkeypatch.setattr(decode_steps, "select_cache_rows", lambda cache, rows: None)
    policy = TransformersPolicy(model, tok)
    gens = policy.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0))
    assert gens[1].token_ids[-1] == EOS and len(gens[1].token_ids) <= 4
    assert gens[1].finish_reason == "stop"
    assert any(g.finish_reason == "length" for g in gens), "some rows must outlive the finished one"
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ref_ids, ref_lps = greedy_reference(model, prompt, 10)
        assert gen.token_ids == ref_ids
        assert gen.logprobs == pytest.approx(ref_lps, abs=1e-4)
        assert len(gen.logprobs) == len(gen.token_ids)
        assert gen.finish_reason == ("stop" if ref_ids[-1] == EOS else "length")
        assert EOS not in gen.token_ids[:-1]


def test_stop_string() -> None:
    model, tok = steered_model(ascii_only=True)
    policy = TransformersPolicy(model, tok)
    [free] = policy.generate([PROMPTS[2]], SamplingParams(max_new_tokens=12, temperature=0))
    text = tok.decode(free.token_ids)
    assert len(text) == 12 and text.isascii()
    stop = text[4:6]
    first_end = text.index(stop) + len(stop)  # where the first occurrence is complete
    [stopped] = policy.generate(
        [PROMPTS[2]], SamplingParams(max_new_tokens=12, temperature=0, stop_strings=("never seen", stop))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:first_end]
    assert tok.decode(stopped.token_ids).endswith(stop)
    assert stopped.logprobs == pytest.approx(free.logprobs[:first_end])
    assert free.finish_reason == "length"


def test_max_new_tokens_zero_and_one(policy: TransformersPolicy) -> None:
    [none] = policy.generate([PROMPTS[0]], SamplingParams(max_new_tokens=0, return_entropy=True))
    assert none == Generation([], [], "length", None, [])
    gens = policy.generate(PROMPTS, SamplingParams(max_new_tokens=1, temperature=0))
    assert all(len(g.token_ids) == 1 for g in gens)


# --- sampling ------------------------------------------------------------------------------------


def test_sampled_logprobs_equal_teacher_forced_score(policy: TransformersPolicy) -> None:
    gens = policy.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, seed=11))
    scored = policy.score(PROMPTS, [g.token_ids for g in gens])
    for gen, row in zip(gens, scored, strict=True):
        assert len(row) == len(gen.token_ids)
        assert max(abs(a - b) for a, b in zip(row, gen.logprobs, strict=True)) < 1e-4
    gens = policy.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.7, seed=11))
    scored = policy.score(PROMPTS, [g.token_ids for g in gens], temperature=0.7, batch_size=2)
    for gen, row in zip(gens, scored, strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-4)


def test_a_repeated_prompt_is_prefilled_once_and_its_copies_sample_on_their_own(
        policy: TransformersPolicy) -> None:
    """A group's episodes share their first prompt: the prefill runs on the distinct prompts only, and every
    copy then samples its own continuation, with the log-probs of a teacher-forced pass; greedy copies equal
    the naive one-prompt-at-a-time reference."""
    prompts = [PROMPTS[i % 3] for i in range(9)]  # three prompts, three copies each, interleaved
    batch_sizes: list[int] = []
    hook = policy.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: batch_sizes.append(int(kwargs["input_ids"].shape[0])),
        with_kwargs=True)
    try:
        gens = policy.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, seed=3))
    finally:
        hook.remove()
    assert batch_sizes[0] == 3 and batch_sizes[1] == 9
    assert len({tuple(g.token_ids) for g in gens}) > 3  # the copies of a prompt did not all sample alike
    scored = policy.score(prompts, [g.token_ids for g in gens])
    for gen, row in zip(gens, scored, strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-4)
    greedy = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    for prompt, gen in zip(prompts, greedy, strict=True):
        ref_ids, ref_lps = greedy_reference(policy.model, prompt, 8)
        assert gen.token_ids == ref_ids and gen.logprobs == pytest.approx(ref_lps, abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_a_prefix_every_prompt_shares_is_prefilled_once(arch: str) -> None:
    """Turns that start with the same instructions: their common prefix runs once, each row's own suffix
    continues it (padding then sits between the two), and the generations equal the naive one-prompt-at-a-
    time reference and the plain prefill's. GPT-2's learned absolute positions would expose a wrong
    position id after the gap."""
    if arch == "gpt2":
        model, tok = absolute_position_model(), ByteTokenizer()
    else:
        model, tok = build_tiny_model(TinyModelConfig(arch=arch, seed=4))
    policy = TransformersPolicy(model, tok)
    shared = list(range(70, 90))  # 20 tokens
    suffixes = [[40], [41, 42, 43], [44, 45, 46, 47, 48, 49], [41, 42, 43], [50, 51]]  # one repeated
    prompts = [shared + suffix for suffix in suffixes]
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _module, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        greedy = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    finally:
        hook.remove()
    assert shapes[:3] == [(1, 20), (4, 6), (5, 1)]  # the prefix, the four distinct suffixes, then decoding
    for prompt, gen in zip(prompts, greedy, strict=True):
        ref_ids, ref_lps = greedy_reference(model, prompt, 8)
        assert gen.token_ids == ref_ids and gen.logprobs == pytest.approx(ref_lps, abs=1e-4)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, num_top_logprobs=3,
                            return_entropy=True)
    shared_prefill = policy.generate(prompts, params)
    scored = policy.score(prompts, [g.token_ids for g in shared_prefill])
    for gen, row in zip(shared_prefill, scored, strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-4)
    policy.min_shared_prefix = 10**9  # the plain prefill
    plain = policy.generate(prompts, params)
    for a, b in zip(shared_prefill, plain, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-4)


def test_a_short_common_prefix_is_not_worth_a_pass_of_its_own(policy: TransformersPolicy) -> None:
    prompts = [[70, 71, 72, 40], [70, 71, 72, 41, 42]]  # 3 common tokens, fewer than MIN_SHARED_PREFIX
    shapes: list[tuple[int, ...]] = []
    hook = policy.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        policy.generate(prompts, SamplingParams(max_new_tokens=2, temperature=0))
    finally:
        hook.remove()
    assert shapes[0] == (2, 5)


def test_seeded_sampling_is_reproducible(policy: TransformersPolicy) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=123)
    first = policy.generate(PROMPTS, params)
    assert policy.generate(PROMPTS, params) == first
    other = policy.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=124))
    assert [g.token_ids for g in other] != [g.token_ids for g in first]
    unseeded = SamplingParams(max_new_tokens=12)
    a, b = policy.generate(PROMPTS, unseeded), policy.generate(PROMPTS, unseeded)
    assert [g.token_ids for g in a] != [g.token_ids for g in b], "seed=None continues the generator"


def test_sampling_logprobs_filters() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))

    def probs(**kw: Any) -> list[float]:
        return transformers_backend.sampling_logprobs(logits, **kw).exp()[0].tolist()

    assert probs() == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert probs(top_p=0.8) == pytest.approx([0.625, 0.375, 0, 0])  # smallest set with mass >= 0.8
    assert probs(top_p=0.81) == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert probs(top_k=3) == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert probs(top_k=3, top_p=0.5) == pytest.approx([1, 0, 0, 0])
    hot = torch.softmax(logits[0] / 2.0, -1).tolist()
    assert probs(temperature=2.0) == pytest.approx(hot)


def test_samples_follow_the_reported_distribution(policy: TransformersPolicy) -> None:
    params = SamplingParams(max_new_tokens=1, temperature=0.8, top_k=4, num_top_logprobs=4, seed=0)
    gens = policy.generate([PROMPTS[1]] * 4000, params)
    reported = dict(gens[0].top_logprobs[0])
    assert all(dict(g.top_logprobs[0]) == pytest.approx(reported, abs=1e-5) for g in gens)
    counts: dict[int, int] = {}
    for g in gens:
        counts[g.token_ids[0]] = counts.get(g.token_ids[0], 0) + 1
    assert set(counts) <= set(reported)
    for token, lp in reported.items():
        assert counts.get(token, 0) / len(gens) == pytest.approx(math.exp(lp), abs=0.03)


def test_stop_string_spanning_multibyte_tokens(policy: TransformersPolicy) -> None:
    ids = list("ab 日本語".encode())
    hits = [
        policy._hits_stop_string(ids[:n], SamplingParams(stop_strings=("日本",)), window=6 + 2)
        for n in range(1, len(ids) + 1)
    ]
    assert hits.index(True) == len("ab 日本".encode()) - 1  # the first prefix that completes it


def test_top_k_one_and_tiny_top_p_are_greedy(policy: TransformersPolicy) -> None:
    greedy = policy.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0))
    for params in (
        SamplingParams(max_new_tokens=8, top_k=1, seed=0),
        SamplingParams(max_new_tokens=8, top_p=1e-6, seed=0),
    ):
        gens = policy.generate(PROMPTS, params)
        assert [g.token_ids for g in gens] == [g.token_ids for g in greedy]
        assert all(lp == pytest.approx(0.0, abs=1e-6) for g in gens for lp in g.logprobs), "point mass"


def test_top_k_limits_sampled_tokens_and_top_logprobs(policy: TransformersPolicy) -> None:
    params = SamplingParams(
        max_new_tokens=10, temperature=1.3, top_k=3, num_top_logprobs=5, return_entropy=True, seed=7
    )
    for gen in policy.generate(PROMPTS, params):
        for token, lp, top, entropy in zip(gen.token_ids, gen.logprobs, gen.top_logprobs, gen.entropies,
                                           strict=True):
            assert 1 <= len(top) <= 3 + 2  # filtered tokens (-inf) are left out; ties may keep extras
            assert token in dict(top) and dict(top)[token] == pytest.approx(lp)
            assert math.fsum(math.exp(v) for _, v in top) == pytest.approx(1.0, abs=1e-5)
            assert 0.0 <= entropy <= math.log(len(top)) + 1e-5


def test_top_logprobs_sorted_and_greedy_token_is_top_one(policy: TransformersPolicy) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0, num_top_logprobs=4)
    for gen in policy.generate(PROMPTS, params):
        assert len(gen.top_logprobs) == len(gen.token_ids)
        for token, lp, top in zip(gen.token_ids, gen.logprobs, gen.top_logprobs, strict=True):
            values = [v for _, v in top]
            assert len(top) == 4 and values == sorted(values, reverse=True)
            assert top[0][0] == token and top[0][1] == pytest.approx(lp)
    for gen in policy.generate(PROMPTS, SamplingParams(max_new_tokens=8, num_top_logprobs=4, seed=3)):
        for token, lp, top in zip(gen.token_ids, gen.logprobs, gen.top_logprobs, strict=True):
            assert lp <= top[0][1] + 1e-6
            if token in dict(top):
                assert dict(top)[token] == pytest.approx(lp)
    assert policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))[0].top_logprobs is None


def test_entropies_match_hand_computation(policy: TransformersPolicy) -> None:
    prompt = PROMPTS[3]
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt])).logits[0, -1].double()
    for temperature in (1.0, 0.5):
        [gen] = policy.generate(
            [prompt], SamplingParams(max_new_tokens=6, temperature=temperature, return_entropy=True, seed=1)
        )
        p = torch.softmax(logits / temperature, -1)
        expected = float(-(p * p.log()).sum())
        assert gen.entropies[0] == pytest.approx(expected, abs=1e-4)
        assert all(e >= 0 for e in gen.entropies) and len(gen.entropies) == len(gen.token_ids)
    [greedy] = policy.generate([prompt], SamplingParams(max_new_tokens=2, temperature=0, return_entropy=True))
    p = torch.softmax(logits, -1)
    assert greedy.entropies[0] == pytest.approx(float(-(p * p.log()).sum()), abs=1e-4)


# --- score ---------------------------------------------------------------------------------------


def test_score_is_padding_and_batching_invariant(policy: TransformersPolicy) -> None:
    continuations = [[1, 2, 3], [], [259], list(range(100, 120)), [7] * 5]
    together = policy.score(PROMPTS, continuations)
    assert [len(row) for row in together] == [len(c) for c in continuations]
    one_by_one = policy.score(PROMPTS, continuations, batch_size=1)
    for a, b in zip(together, one_by_one, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    with torch.no_grad():  # direct full forward for one row
        ids = torch.tensor([PROMPTS[3] + continuations[3]])
        lps = torch.log_softmax(policy.model(ids).logits[0].float(), -1)
    n = len(PROMPTS[3])
    expected = [float(lps[n - 1 + i, t]) for i, t in enumerate(continuations[3])]
    assert together[3] == pytest.approx(expected, abs=1e-5)


# --- weights and modes -----------------------------------------------------------------------------


def test_sync_weights_shared_noop_and_copy() -> None:
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    other, _ = build_tiny_model(TinyModelConfig(seed=9))
    policy = TransformersPolicy(model, tok)
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    before = policy.generate(PROMPTS, greedy)
    policy.sync_weights(model.state_dict())  # shared tensors: nothing to copy
    policy.sync_weights(model)
    policy.sync_weights(None)
    assert policy.generate(PROMPTS, greedy) == before
    policy.sync_weights(other.state_dict())
    assert policy.generate(PROMPTS, greedy) == TransformersPolicy(other, tok).generate(PROMPTS, greedy)
    assert policy.model is model
    with pytest.raises(ConfigError, match="does not have"):
        policy.sync_weights({"not.a.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="state dict"):
        policy.sync_weights([1, 2])


def test_generation_restores_training_mode() -> None:
    model, tok = build_tiny_model(TinyModelConfig(num_layers=1))
    policy = TransformersPolicy(model, tok)
    model.train()
    policy.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2))
    policy.score(PROMPTS[:2], [[1], [2]])
    assert model.training
    model.eval()
    policy.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2))
    assert not model.training


def test_from_pretrained_with_config() -> None:
    policy = TransformersPolicy.from_pretrained(TinyModelConfig(num_layers=1), seed=3)
    assert policy.device.type == "cpu" and policy.vocab_size == len(policy.tokenizer)


# --- argument errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_p=0), "top_p"),
        (SamplingParams(top_k=-2), "top_k"),
        (SamplingParams(max_new_tokens=-1), "max_new_tokens"),
        (SamplingParams(num_top_logprobs=-1), "num_top_logprobs"),
        (SamplingParams(stop_strings=("",)), "stop_strings"),
    ],
)
def test_invalid_params_raise_config_error(
    policy: TransformersPolicy, params: SamplingParams, field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        policy.generate(PROMPTS, params)


def test_invalid_prompts_raise_config_error(policy: TransformersPolicy) -> None:
    with pytest.raises(ConfigError, match="empty"):
        policy.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ConfigError, match="outside"):
        policy.generate([[1, 100_000]], SamplingParams())
    with pytest.raises(ConfigError, match="one continuation per prompt"):
        policy.score([[1]], [[2], [3]])
    with pytest.raises(ConfigError, match="temperature"):
        policy.score([[1]], [[2]], temperature=0)


# --- torch's CPU threads ---------------------------------------------------------------------------------


def test_num_threads_is_set_when_the_policy_is_built_and_left_alone_by_default() -> None:
    from agentgym.backends.builder import make_policy
    from agentgym.backends.config import ModelConfig

    before = torch.get_num_threads()
    try:
        make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu", num_threads=1))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), device="cpu"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("value", "message"), [
    ("0", "model.num_threads must be a positive integer or null"),
    ("-2", "model.num_threads must be a positive integer or null"),
    ("true", "model.num_threads must be an integer"),
    ("1.5", "model.num_threads must be an integer"),
])
def test_a_bad_thread_count_is_a_one_line_error(value: str, message: str) -> None:
    from agentgym.training.config.loading import load_config

    with pytest.raises(ConfigError, match=message) as raised:
        load_config(None, [f"model.num_threads={value}"])
    assert "\n" not in str(raised.value)


def test_activation_checkpointing_is_switched_on_without_a_deprecation_warning() -> None:
    import warnings

    model, _ = build_tiny_model(TinyModelConfig(seed=3))
    model.train()
    ids = torch.randint(0, 200, (2, 12))
    model(input_ids=ids).logits.sum().backward()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers 5 warns on gradient_checkpointing_enable
        transformers_backend.enable_activation_checkpointing(model)
    assert model.is_activation_checkpointing
    model(input_ids=ids).logits.sum().backward()
    again = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, again, strict=True))
