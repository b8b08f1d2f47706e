"""Constrained decoding: the ``tag_spans`` rule on hand examples, its token mask for single- and
multi-character tokens, and a real tiny model that, whatever it samples, writes only well-formed
copied calls."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

import agentgym
from agentgym.backends.constrained import ConstraintMask
from agentgym.backends.tiny import TinyModelConfig
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.envs.registration import register_tool_envs
from agentgym.errors import ConfigError
from agentgym.rollout.constraints import TagSpans, is_word_span, list_constraints, make_constraint
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.training.config.loading import load_config

PROMPT = "Question: Who founded Zorvex Labs? Doc 1(Title: Zorvex Labs) founded in 1921 by Ada Kim."
CALL = re.compile(r"<(search|answer)>(.+)</\1>", re.DOTALL)


def test_word_spans_on_hand_examples() -> None:
    assert is_word_span(PROMPT, "Zorvex Labs") and is_word_span(PROMPT, "1921 by Ada Kim")
    assert is_word_span(PROMPT, "Labs) founded")  # punctuation inside a span is copied too
    for text in ("Zorv", "orvex", "Kim.", " Ada", "", "Zorvex  Labs", "Bob"):
        assert not is_word_span(PROMPT, text), text


def test_tag_spans_next_chars_and_ends() -> None:
    rule = TagSpans()
    assert rule.next_chars(PROMPT, "") == {"<"}
    assert rule.next_chars(PROMPT, "<") == {"s", "a"}
    assert rule.next_chars(PROMPT, "<answer") == {">"}
    # The first character of a copy: the initial of any word of the prompt.
    assert rule.next_chars(PROMPT, "<answer>") == set("QWfZLD1TibAK")
    # "Ada" continues only as in the prompt, and may close only at a word's end.
    assert rule.next_chars(PROMPT, "<answer>A") == {"d"}
    assert rule.next_chars(PROMPT, "<answer>Ada") == {" ", "<"}
    assert rule.next_chars(PROMPT, "<answer>Ada Kim</ans") == {"w"}
    assert not rule.may_end(PROMPT, "<answer>Ada Kim</answe")
    assert rule.may_end(PROMPT, "<answer>Ada Kim</answer>")
    assert rule.next_chars(PROMPT, "<answer>Ada Kim</answer>") == frozenset()  # nothing after the call
    assert rule.next_chars(PROMPT, "I think") == frozenset() and not rule.may_end(PROMPT, "I think")
    assert TagSpans(tags=("answer",)).next_chars(PROMPT, "<") == {"a"}
    assert "tag_spans" in list_constraints()
    with pytest.raises(ConfigError, match="Did you mean 'tag_spans'"):
        make_constraint("tag_span")


class PieceTokenizer:
    """A tokenizer with multi-character tokens (as BPE vocabularies have): id -> text."""

    PIECES = ("<", "search", ">", "Zorvex", " ", "Labs", "</search>", "Zor", "vex Labs</search>", "answer",
              "Ada")
    all_special_ids = (11,)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.PIECES[i] if i < len(self.PIECES) else ("" if skip_special_tokens else "<eos>")
                       for i in ids)


def test_mask_checks_every_character_of_multi_character_tokens() -> None:
    tok = PieceTokenizer()
    pieces = {i: text for i, text in enumerate(PieceTokenizer.PIECES)}
    prompt = [3, 4, 5]  # "Zorvex Labs"
    mask = ConstraintMask(TagSpans(), tok, [prompt], pieces, {11}, 12)

    def allowed() -> list[int]:
        return [i for i, value in enumerate(mask.step([0])[0].tolist()) if value == 0.0]

    assert allowed() == [0]  # only "<"
    for token in (0, 1, 2):  # "<search>"
        mask.advance(0, token)
    assert allowed() == [3, 5, 7]  # "Zorvex", "Labs" and "Zor" start a copy; "Ada" is not in the prompt
    mask.advance(0, 7)
    assert allowed() == [8]  # "vex Labs</search>" finishes the copy and the call in one token
    mask.advance(0, 8)
    assert allowed() == [11]  # the call is complete: only the end-of-turn token
    assert mask.step([None])[0].eq(0).all()  # a finished row kept in the batch is left alone


def _allowed_by_definition(constraint, prompt: str, response: str,
                           pieces: dict[int, str]) -> set[int] | None:
    """Every token whose characters the rule allows one after another: the mask's definition, token by
    token."""
    if constraint.next_chars(prompt, response) is None:
        return None
    allowed = set()
    for token, text in pieces.items():
        ok = True
        for k, char in enumerate(text):
            chars = constraint.next_chars(prompt, response + text[:k])
            if chars is not None and char not in chars:
                ok = False
                break
        if ok:
            allowed.add(token)
    return allowed


class FreeAfterColon:
    """Allows ``a``, ``b`` and ``:`` until a colon is written, then anything: a rule that lets go
    mid-token."""

    def next_chars(self, prompt: str, response: str) -> frozenset[str] | None:
        return None if ":" in response else frozenset("ab:")

    def may_end(self, prompt: str, response: str) -> bool:
        return False


@pytest.mark.parametrize("seed", range(4))
def test_the_mask_allows_exactly_the_tokens_the_rule_allows_char_by_char(seed: int) -> None:
    """The trie walk against the definition, on random multi-character vocabularies (pieces of the prompt's
    words, the tags, junk) along random allowed responses, for TagSpans and for a rule that lets go."""
    rng = random.Random(seed)
    prompt_text = "Who founded Zorvex Labs in Old Harbor? Ask the Zorvex archive."
    words = prompt_text.replace("?", " ").replace(".", " ").split()
    texts = {"<", ">", "/", "a", "b", ":", "<search>", "</search>", "<answer>", "</answer>", " ", "?"}
    while len(texts) < 300:
        word = rng.choice(words + ["search", "answer", "xyz", "a:b", "ab:", ":zz"])
        start = rng.randrange(len(word))
        piece = word[start:start + rng.randint(1, 6)]
        texts.add(rng.choice(["", " ", "<", ">"]) + piece + rng.choice(["", " ", "</"]))
    pieces = dict(enumerate(sorted(texts)))
    tok = PieceTokenizer()
    for constraint in (TagSpans(), FreeAfterColon()):
        mask = ConstraintMask(constraint, tok, [[]], pieces, {len(pieces)}, len(pieces) + 1)
        mask.prompts = [prompt_text]
        for _ in range(12):
            expected = _allowed_by_definition(constraint, prompt_text, mask.responses[0], pieces)
            got = mask.allowed(0)
            if expected is None:
                assert got is None
                break
            assert set(got) - {len(pieces)} == expected
            choices = sorted(expected)
            if not choices:
                break
            mask.advance(0, rng.choice(choices))


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_pretrained(TinyModelConfig(hidden_size=32, intermediate_size=64,
                                                              max_position_embeddings=512))


def test_an_untrained_model_only_writes_copied_calls(policy: TransformersPolicy) -> None:
    register_tool_envs()
    env = agentgym.make("search-qa-v0", num_entities=60, top_k=1)
    renderer = PromptRenderer(policy.tokenizer, mode="window", action_format="raw",
                              include_instructions=False)
    prompts = []
    for seed in range(4):
        question, info = env.reset(seed=seed)
        prompts.append(renderer.prompt_ids(renderer.start(question, info)))
        action = env.expert_action()  # and a prompt with a retrieved document in it
        obs, _, _, _, after = env.step(action)
        conv = renderer.start(question, info)
        renderer.record(conv, [], action, obs, after)
        prompts.append(renderer.prompt_ids(conv))
    rule = TagSpans()
    for temperature, copies in ((1.5, 3), (0.0, 1)):
        params = SamplingParams(max_new_tokens=64, temperature=temperature, seed=3, constraint="tag_spans")
        for prompt, gen in zip(prompts * copies, policy.generate(prompts * copies, params), strict=True):
            text = policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            prompt_text = policy.tokenizer.decode(prompt, skip_special_tokens=True)
            assert all(math.isfinite(lp) for lp in gen.logprobs)
            if gen.finish_reason == "stop":
                match = CALL.fullmatch(text)
                assert match and rule.may_end(prompt_text, text), text
                assert is_word_span(prompt_text, match.group(2))
            else:  # cut by max_new_tokens: every character was allowed where it was written
                assert len(text) == 64 and text.startswith(("<search>", "<answer>")), text
                assert all(text[k] in rule.next_chars(prompt_text, text[:k]) for k in range(len(text)))
    # Renormalising over the allowed tokens can only raise a sampled token's log-prob.
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5, constraint="tag_spans")
    constrained = policy.generate(prompts, params)
    free = policy.score(prompts, [g.token_ids for g in constrained])
    pairs = [(c, f) for g, fs in zip(constrained, free, strict=True)
             for c, f in zip(g.logprobs, fs, strict=True)]
    assert all(c >= f - 1e-5 for c, f in pairs)
    assert any(c > f + 1e-3 for c, f in pairs)


def test_unknown_constraint_names_the_field() -> None:
    with pytest.raises(ConfigError, match="rollout.constraint: no decoding constraint named 'spans'"):
        load_config(None, ["rollout.constraint=spans"])
    assert load_config(None, ["rollout.constraint=tag_spans"]).rollout.constraint == "tag_spans"


def test_a_constraint_takes_arguments_after_a_colon() -> None:
    """``tag_spans:python,answer``: the tags are the arguments; the code-math drill's calls follow them."""
    rule = make_constraint("tag_spans:python,answer")
    prompt = "Problem: Compute 42 * 57 + 93. Give the exact value."
    assert rule.next_chars(prompt, "<") == {"p", "a"}  # no <search> any more
    assert rule.next_chars(prompt, "<python>42 * 57") == {" ", "<"}
    assert rule.may_end(prompt, "<python>42 * 57 + 93</python>")
    assert not rule.may_end(prompt, "<python>42 * 57 + 93.</python>")  # "." ends no word
    assert not rule.may_end(prompt, "<search>Compute</search>")
    assert make_constraint("tag_spans") == TagSpans()
    assert make_constraint("tag_spans:answer").tags == ("answer",)
    for spec, message in (("tag_spans:a b", "tag names made of letters"),
                          ("tag_spans:python,", "tag names made of letters"),
                          ("tag_spanz:python", "Did you mean 'tag_spans'")):
        with pytest.raises(ConfigError, match=message):
            make_constraint(spec)
    with pytest.raises(ConfigError, match="rollout.constraint: tag_spans needs tag names"):
        load_config(None, ["rollout.constraint=tag_spans:<python>"])
    assert load_config(None, ["rollout.constraint=tag_spans:python,answer"]).rollout.constraint == \
        "tag_spans:python,answer"


def test_a_factory_that_takes_no_arguments_refuses_them_in_one_line() -> None:
    from agentgym.rollout import constraints

    register = constraints.register_constraint
    register("search_only", lambda: TagSpans(("search",)))
    try:
        assert make_constraint("search_only").tags == ("search",)
        with pytest.raises(ConfigError,
                           match=r"decoding constraint 'search_only' does not take the arguments \['x'\]"):
            make_constraint("search_only:x")
    finally:
        del constraints._CONSTRAINTS["search_only"]


def test_forced_positions_are_where_the_rule_left_one_token(policy: TransformersPolicy) -> None:
    """The backend reports the positions where the constraint allowed a single token: exactly those
    (checked against the rule, character by character with the byte tokenizer), each sampled with
    probability 1; unconstrained generations report none."""
    prompt_text = "Problem: Compute 42 * 57 + 93. Give the exact value."
    prompt = policy.tokenizer.encode(prompt_text, add_special_tokens=False)
    rule = make_constraint("tag_spans:python,answer")
    params = SamplingParams(max_new_tokens=40, temperature=1.5, seed=1, constraint="tag_spans:python,answer")
    generations = policy.generate([prompt] * 12, params)
    seen_free = False
    for gen in generations:
        text = policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        expected = []
        for k in range(len(gen.token_ids)):  # one byte per token; the last may be the end-of-turn token
            chars = rule.next_chars(prompt_text, text[:k])
            may_stop = rule.may_end(prompt_text, text[:k]) or not chars
            if len(chars) + may_stop == 1:
                expected.append(k)
        forced = gen.extras["forced_positions"]
        assert forced == expected, (text, forced)
        assert all(abs(gen.logprobs[k]) < 1e-6 for k in forced)
        seen_free |= len(forced) < len(gen.token_ids)
    assert seen_free and any(len(g.extras["forced_positions"]) > len(g.token_ids) // 2 for g in generations)
    free = policy.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0, seed=1))[0]
    assert "forced_positions" not in free.extras
