"""`agentgym serve-policy`'s OpenAI-compatible server driven by the official openai client, and the
OpenAI backend tested against it (same tokens and log-probs as the in-process backend)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import LiveServer

from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig, TinyModelConfig
from agentgym.backends.openai_backend import OpenAIEndpoint, OpenAIPolicy, PolicyEndpointError
from agentgym.backends.openai_server import create_policy_app
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError
from agentgym.rollout.policy import SamplingParams

TINY = TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128, max_position_embeddings=512)


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(TINY, seed=0)


@pytest.fixture(scope="module")
def server(policy: TransformersPolicy) -> Iterator[LiveServer]:
    live = LiveServer(create_policy_app(policy, "tiny", max_new_tokens=64))
    yield live
    live.stop()


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def prompt_ids(policy: TransformersPolicy, text: str) -> list[int]:
    ids = policy.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                               add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_models_and_chat_like_a_user(client: openai.OpenAI, policy: TransformersPolicy) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go up"}],
                                           max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                                           extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    [local] = policy.generate([prompt_ids(policy, "go up")], SamplingParams(max_new_tokens=6, temperature=0,
                                                                          num_top_logprobs=3))
    assert choice.model_extra["token_ids"] == local.token_ids  # greedy: exactly the in-process tokens
    assert [c.logprob for c in choice.logprobs.content] == pytest.approx(local.logprobs, abs=1e-5)
    assert all(len(c.top_logprobs) == 3 for c in choice.logprobs.content)
    assert choice.message.content == policy.tokenizer.decode(local.token_ids, skip_special_tokens=True)
    assert reply.usage.completion_tokens == 6 and choice.finish_reason in ("length", "stop")
    assert reply.usage.prompt_tokens == len(prompt_ids(policy, "go up"))


def test_completions_with_token_ids_n_seed_and_stop(client: openai.OpenAI,
                                                    policy: TransformersPolicy) -> None:
    ids = prompt_ids(policy, "x")
    kwargs: dict[str, Any] = {"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 1.0, "seed": 7,
                              "n": 3}
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]  # seeded: reproducible
    assert len(set(texts)) > 1  # n samples of one prompt differ
    batch = client.completions.create(model="tiny", prompt=[ids, ids[:-1]], max_tokens=3, temperature=0,
                                      logprobs=2)
    assert [c.index for c in batch.choices] == [0, 1] and len(batch.choices[0].logprobs.token_logprobs) == 3
    seeded = {"model": "tiny", "prompt": ids, "max_tokens": 12, "temperature": 1.0, "seed": 11}
    full = client.completions.create(**seeded).choices[0].text
    first_new = next(i for i in range(1, len(full)) if full[i] not in full[:i] and full[i].isprintable())
    cut = client.completions.create(**seeded, stop=[full[first_new]]).choices[0]
    assert cut.text == full[:first_new] and cut.finish_reason == "stop"  # the stop string is not in the text
    kept = client.completions.create(**seeded, stop=[full[first_new]],
                                     extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == full[:first_new + 1]


def test_streaming_sends_the_same_text(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


@pytest.mark.parametrize("kwargs, error, match", [
    ({"model": "nope"}, openai.NotFoundError, "does not exist; this server serves 'tiny'"),
    ({"temperature": 5}, openai.BadRequestError, "temperature"),
    ({"max_tokens": 1000}, openai.BadRequestError, "above this server's limit of 64"),
    ({"presence_penalty": 0.5}, openai.BadRequestError, "not supported"),
    ({"messages": [{"role": "user", "content": "x" * 600}]}, openai.BadRequestError,
     "exceeds the model's context length"),
])
def test_bad_requests_get_openai_shaped_errors(client: openai.OpenAI, kwargs: dict[str, Any], error: type,
                                               match: str) -> None:
    request: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4}
    with pytest.raises(error, match=match) as caught:
        client.chat.completions.create(**{**request, **kwargs})
    assert caught.value.body["message"]  # {"error": {"message", "type", "param", "code"}}


def test_concurrent_requests_share_batched_generate_calls(server: LiveServer, client: openai.OpenAI) -> None:
    batcher = server.server.config.app.state.batcher
    before = batcher.batches
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"task {i}"}], max_tokens=16, temperature=0),
            range(16)))
    assert len(replies) == 16
    assert batcher.batches - before < 16  # some requests were generated together


def test_backend_against_the_server_matches_the_in_process_backend(server: LiveServer,
                                                                     policy: TransformersPolicy) -> None:
    endpoint = OpenAIEndpoint(f"{server.url}/v1")
    assert endpoint.check() == "tiny"
    remote = OpenAIPolicy(endpoint, policy.tokenizer, concurrency=4)
    prompts = [prompt_ids(policy, t) for t in ("a", "bb", "left or right?")]
    params = SamplingParams(max_new_tokens=10, temperature=0, num_top_logprobs=2)
    try:
        over_http, in_process = remote.generate(prompts, params), policy.generate(prompts, params)
    finally:
        remote.close()
    for a, b in zip(over_http, in_process, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert ([[t for t, _ in row] for row in a.top_logprobs]
                == [[t for t, _ in row] for row in b.top_logprobs])
        assert "retokenized" not in a.extras


def test_text_only_servers_are_refused_for_token_ids_unless_retokenizing_is_allowed(
    policy: TransformersPolicy,
) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]) -> dict[str, Any]:  # a server that returns text only
        return {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "text": "up", "logprobs": None, "finish_reason": "stop"}]}

    live = LiveServer(app)
    try:
        endpoint = OpenAIEndpoint(f"{live.url}/v1", "m")
        with pytest.raises(PolicyEndpointError,
                           match="returned text but no generated token ids; training must not"):
            OpenAIPolicy(endpoint, policy.tokenizer).generate([[1, 2]], SamplingParams(max_new_tokens=4))
        retokenizing = OpenAIPolicy(endpoint, policy.tokenizer, allow_retokenize=True)
        [g] = retokenizing.generate([[1, 2]], SamplingParams())
        assert g.token_ids == list(policy.tokenizer.encode("up", add_special_tokens=False))
        assert g.extras["retokenized"] is True
    finally:
        live.stop()


def test_training_with_the_openai_backend_fails_with_one_line_saying_what_is_missing() -> None:
    with pytest.raises(ConfigError) as caught:
        make_policy(ModelConfig(backend="openai"))
    message = str(caught.value)
    assert "\n" not in message and "send each update to the server" in message
    assert "model.backend=transformers" in message


def test_server_answers_while_a_slow_generation_runs(server: LiveServer, client: openai.OpenAI) -> None:
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(client.chat.completions.create, model="tiny", max_tokens=64, temperature=0,
                           messages=[{"role": "user", "content": "long"}])
        assert client.models.list().data[0].id == "tiny"  # the event loop is not blocked by generation
        slow.result()
    assert time.perf_counter() - started < 60
