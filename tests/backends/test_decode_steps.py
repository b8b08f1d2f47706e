"""The decoding engines behind ``TransformersPolicy`` (``agentgym.backends.decode_steps``): ``static`` and
``compiled`` give the naive reference's tokens, the ``dynamic`` engine's numbers, teacher-forced log-probs,
and reuse their preallocated caches without leaking one batch into the next."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_transformers_backend import (  # noqa: E402
    EOS,
    PROMPTS,
    absolute_position_model,
    greedy_reference,
    steered_model,
)

from agentgym.backends import make_policy  # noqa: E402
from agentgym.backends.config import ModelConfig  # noqa: E402
from agentgym.backends.decode_steps import (  # noqa: E402
    CACHE_LENGTH_BUCKET,
    KEPT_STATIC_CACHES,
    bucket_length,
    bucket_rows,
)
from agentgym.backends.tiny import ByteTokenizer, TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.backends.transformers_backend import TransformersPolicy  # noqa: E402
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.rollout.policy import SamplingParams  # noqa: E402

FULL = SamplingParams(max_new_tokens=12, temperature=0, num_top_logprobs=4, return_entropy=True)


def assert_same_generations(a, b, tol: float = 1e-4) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=tol)
        if x.entropies is not None:
            assert x.entropies == pytest.approx(y.entropies, abs=tol)
        if x.top_logprobs is not None:
            assert [[t for t, _ in p] for p in x.top_logprobs] == [[t for t, _ in p] for p in y.top_logprobs]
        assert x.extras == y.extras


def input_shapes(model):
    """Record the ``input_ids`` shape of every forward pass of ``model``; returns (shapes, hook)."""
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _module, _args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    return shapes, hook


def test_buckets() -> None:
    assert [bucket_rows(n) for n in (1, 2, 3, 4, 5, 9, 64, 65)] == [1, 2, 4, 4, 8, 16, 64, 128]
    assert bucket_length(1) == CACHE_LENGTH_BUCKET
    assert bucket_length(CACHE_LENGTH_BUCKET + 1) == 2 * CACHE_LENGTH_BUCKET


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_static_greedy_equals_the_naive_reference_and_the_dynamic_engine(arch: str) -> None:
    """GPT-2's learned absolute positions expose a wrong position id; five prompts of 1-23 tokens run as
    eight rows (three filler rows) in a cache of one bucket, at one shape every step."""
    if arch == "gpt2":
        model, tok = absolute_position_model(), ByteTokenizer()
    else:
        model, tok = build_tiny_model(TinyModelConfig(arch=arch, seed=2))
    static = TransformersPolicy(model, tok, decode="static")
    shapes, hook = input_shapes(model)
    try:
        gens = static.generate(PROMPTS, FULL)
    finally:
        hook.remove()
    assert shapes[0] == (8, 23) and set(shapes[1:]) == {(8, 1)} and len(shapes) == 12
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ref_ids, ref_lps = greedy_reference(model, prompt, 12)
        assert gen.token_ids == ref_ids
        assert gen.logprobs == pytest.approx(ref_lps, abs=1e-4)
    assert_same_generations(gens, TransformersPolicy(model, tok).generate(PROMPTS, FULL))


def test_finished_rows_stay_in_the_static_batch_as_masked_padding() -> None:
    model, tok = steered_model(eos_at={"prompt": PROMPTS[1], "step": 3})
    static = TransformersPolicy(model, tok, decode="static")
    shapes, hook = input_shapes(model)
    try:
        gens = static.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0))
    finally:
        hook.remove()
    assert gens[1].token_ids[-1] == EOS and gens[1].finish_reason == "stop" and len(gens[1].token_ids) <= 4
    assert any(g.finish_reason == "length" for g in gens)
    assert set(shapes[1:]) == {(8, 1)}  # the finished row was not dropped
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ref_ids, ref_lps = greedy_reference(model, prompt, 10)
        assert gen.token_ids == ref_ids and gen.logprobs == pytest.approx(ref_lps, abs=1e-4)


@pytest.fixture(scope="module")
def pair() -> tuple[TransformersPolicy, TransformersPolicy]:
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    return TransformersPolicy(model, tok), TransformersPolicy(model, tok, decode="static")


def test_static_sampling_is_seeded_and_its_logprobs_are_teacher_forced(pair) -> None:
    dynamic, static = pair
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=11, num_top_logprobs=2,
                            return_entropy=True)
    first = static.generate(PROMPTS, params)
    assert static.generate(PROMPTS, params) == first
    scored = static.score(PROMPTS, [g.token_ids for g in first], temperature=0.8)
    for gen, row in zip(first, scored, strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-4)
    # The static engine keeps finished rows as padding, the dynamic one drops them; both draw for the live
    # rows only, so the seed gives the same samples whichever engine runs, rows stopping early or not.
    endless = [TransformersPolicy(p.model, p.tokenizer, decode=p.decode, stop_token_ids=[]) for p in pair]
    filtered = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=20, top_p=0.9, seed=11)
    for each in (params, filtered):
        assert_same_generations(endless[1].generate(PROMPTS, each), endless[0].generate(PROMPTS, each))
    stopping = SamplingParams(max_new_tokens=24, temperature=1.0, seed=4, stop_strings=["e"])
    sampled = static.generate(PROMPTS, stopping)
    assert_same_generations(sampled, dynamic.generate(PROMPTS, stopping))
    lengths = [len(g.token_ids) for g in sampled]
    assert {g.finish_reason for g in sampled} == {"stop", "length"} and len(set(lengths)) > 2, lengths
    other = static.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=0.8, seed=12))
    assert [g.token_ids for g in other] != [g.token_ids for g in first]


def test_a_reused_static_cache_carries_nothing_from_the_batch_before(pair) -> None:
    """Two batches of the same bucket share one cache: a long batch first must not change a short one."""
    _, static = pair
    short = [PROMPTS[0], PROMPTS[2]]
    fresh = TransformersPolicy(static.model, static.tokenizer, decode="static").generate(short, FULL)
    static.generate([PROMPTS[3], PROMPTS[4]], SamplingParams(max_new_tokens=30, temperature=1.0, seed=1))
    caches_before = dict(static._static_caches._caches)
    after = static.generate(short, FULL)
    assert_same_generations(after, fresh, tol=0)
    assert any(after_cache is before_cache for after_cache in static._static_caches._caches.values()
               for before_cache in caches_before.values()), "the second batch reused the first one's cache"
    for rows in (1, 3, 9, 17):  # more shapes than are kept
        static.generate(PROMPTS[:1] * rows, SamplingParams(max_new_tokens=2, temperature=0))
    assert len(static._static_caches._caches) == KEPT_STATIC_CACHES


def test_static_stop_strings_and_constraints_equal_the_dynamic_engine(pair) -> None:
    dynamic, static = pair
    [free] = dynamic.generate([PROMPTS[2]], SamplingParams(max_new_tokens=12, temperature=0))
    stop = dynamic.tokenizer.decode(free.token_ids[3:5])
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_strings=(stop,))
    assert_same_generations(static.generate(PROMPTS, params), dynamic.generate(PROMPTS, params))
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=4, constraint="tag_spans",
                            num_top_logprobs=3)
    constrained = static.generate(PROMPTS[:2], params)
    assert all(g.extras["forced_positions"] for g in constrained)
    assert all(dynamic.tokenizer.decode(g.token_ids).startswith("<") for g in constrained)
    assert_same_generations(constrained, dynamic.generate(PROMPTS[:2], params))
    greedy = SamplingParams(max_new_tokens=24, temperature=0, constraint="tag_spans")
    assert_same_generations(static.generate(PROMPTS, greedy), dynamic.generate(PROMPTS, greedy))


def test_the_decode_engine_is_chosen_in_config_and_kept_by_copies() -> None:
    policy = make_policy(ModelConfig(tiny=TinyModelConfig(num_layers=1), decode="static"), seed=0)
    assert policy.decode == "static"
    assert policy.detached_copy(seed=1).decode == "static"
    with pytest.raises(ConfigError, match="model.decode must be one of"):
        ModelConfig(decode="paged")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="decode must be one of"):
        TransformersPolicy(policy.model, policy.tokenizer, decode="fast")  # type: ignore[arg-type]


@pytest.mark.slow
def test_compiled_steps_on_the_cpu_equal_the_dynamic_engine(pair) -> None:
    """``torch.compile`` (inductor, no CUDA graphs on a CPU): the first batch compiles the step."""
    dynamic, _ = pair
    compiled = TransformersPolicy(dynamic.model, dynamic.tokenizer, decode="compiled")
    assert_same_generations(compiled.generate(PROMPTS, FULL), dynamic.generate(PROMPTS, FULL))
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    sampled = compiled.generate(PROMPTS, params)
    assert compiled.generate(PROMPTS, params) == sampled
    assert_same_generations(sampled, dynamic.generate(PROMPTS, params))
    for gen, row in zip(sampled, compiled.score(PROMPTS, [g.token_ids for g in sampled]), strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-4)


@pytest.mark.gpu
def test_compiled_steps_with_cuda_graphs_equal_the_dynamic_engine() -> None:
    """On a GPU ``compiled`` captures each step in a CUDA graph; replays must read the cache in place."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device")
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    model = model.to("cuda")
    dynamic = TransformersPolicy(model, tok)
    compiled = TransformersPolicy(model, tok, decode="compiled")
    prompts = PROMPTS * 8  # 40 rows: a 64-row bucket
    for params in (FULL, SamplingParams(max_new_tokens=12, temperature=0, seed=3)):
        assert_same_generations(compiled.generate(prompts, params), dynamic.generate(prompts, params),
                                tol=1e-3)
    again = compiled.generate(prompts, FULL)  # a replay of the captured graphs
    assert_same_generations(again, dynamic.generate(prompts, FULL), tol=1e-3)
    sampled = compiled.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=5))
    for gen, row in zip(sampled, compiled.score(prompts, [g.token_ids for g in sampled]), strict=True):
        assert row == pytest.approx(gen.logprobs, abs=1e-3)
