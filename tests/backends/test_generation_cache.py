"""KV-cached decoding uses the cache API transformers expects: no deprecation warning, same tokens as no
cache."""

from __future__ import annotations

import warnings

import torch

from agentgym.backends.tiny import TinyModelConfig, load_model_and_tokenizer
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.rollout.policy import SamplingParams


def _greedy_without_cache(model: torch.nn.Module, prompt: list[int], max_new_tokens: int,
                          stop_ids: set[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding that recomputes the whole sequence every step: the reference a cache must match."""
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            dist = torch.log_softmax(logits, dim=-1)
            token = int(dist.argmax())
            ids.append(token)
            logprobs.append(float(dist[token]))
            if token in stop_ids:
                break
    return ids[len(prompt):], logprobs


def test_cached_generation_warns_nothing_and_matches_uncached_decoding() -> None:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(TinyModelConfig(num_layers=2))
    model.eval()
    prompts = [tokenizer.encode(text, add_special_tokens=False)
               for text in ("2+2=", "go up", "a longer prompt here")]
    free = [_greedy_without_cache(model, p, 8, set()) for p in prompts]
    # A stop id that ends the second prompt's row first, so a finished row is dropped from the cache.
    stop_id = free[1][0][0]
    expected = [_greedy_without_cache(model, p, 8, {stop_id}) for p in prompts]
    assert [len(ids) for ids, _ in expected] == [8, 1, 8]
    policy = TransformersPolicy(model, tokenizer, stop_token_ids=[stop_id])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers' FutureWarning on `past_key_values` would fail here
        generations = policy.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    assert [g.finish_reason for g in generations] == ["length", "stop", "length"]
    for generation, (token_ids, logprobs) in zip(generations, expected, strict=True):
        assert generation.token_ids == token_ids
        assert max(abs(a - b) for a, b in zip(generation.logprobs, logprobs, strict=True)) < 1e-4
