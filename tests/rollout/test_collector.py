"""Collector and prompt rendering with the real tiny model on real envs, in-process and over HTTP."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

import agentgym
from agentgym.backends.tiny import CHATML_TEMPLATE, TinyModelConfig, build_tiny_model
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.http.client import EnvClient, RemoteEnv
from agentgym.rollout.actions import parse_action
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer, _ids
from agentgym.rollout.records import EpisodeGroup


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    model, tokenizer = build_tiny_model(TinyModelConfig(seed=0))
    return TransformersPolicy(model, tokenizer)


def test_full_mode_splicing_equals_rendering_the_whole_chat(policy: TransformersPolicy) -> None:
    tok = policy.tokenizer
    renderer = PromptRenderer(tok, mode="full", action_format="plain", show_admissible_actions=False)
    conv = renderer.start("You are at A.", {"instructions": "Walk."})
    replies = [("north", "You are at B."), ("east ✓", "You are at C.")]
    for text, obs in replies:
        response_ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        renderer.record(conv, response_ids, text, obs, {})
    messages = [{"role": "system", "content": conv.system}, {"role": "user", "content": "You are at A."}]
    for text, obs in replies:
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
    expected = _ids(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
    assert renderer.prompt_ids(conv) == expected


def test_tool_env_results_are_tool_messages_and_specs_reach_the_template(policy: TransformersPolicy) -> None:
    tok = copy.deepcopy(policy.tokenizer)
    # ChatML that also lists the tool names it is given, as Qwen's template does in its system turn.
    tok.chat_template = ("{% if tools %}{{ '<|im_start|>tools\\n' }}"
                         "{% for t in tools %}{{ t.function.name + ' ' }}"
                         "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}" + CHATML_TEMPLATE)
    env = agentgym.make("tools-v0")
    obs, info = env.reset(seed=4)
    tools = info["tools"]  # published at reset
    assert tools
    renderer = PromptRenderer(tok, mode="full", show_admissible_actions=False)
    conv = renderer.start(obs, info)
    messages = [{"role": "system", "content": conv.system}, {"role": "user", "content": obs}]
    for _ in range(2):
        action = env.expert_action()
        reply, _, _, _, info = env.step(action)
        response = tok.encode(action, add_special_tokens=False) + [tok.eos_token_id]
        renderer.record(conv, response, action, reply, info)
        messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": reply}]
    expected = _ids(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, tools=tools))
    assert renderer.prompt_ids(conv) == expected
    text = tok.decode(expected)
    assert text.count("<|im_start|>tool\n") == 2
    assert all(f"{spec['function']['name']} " in text.split("<|im_end|>")[0] for spec in tools)
    # Off: the same replies are user messages.
    plain = PromptRenderer(tok, mode="full", show_admissible_actions=False, tool_messages=False)
    conv = plain.start(obs, {"tools": tools})
    plain.record(conv, tok.encode("x", add_special_tokens=False) + [tok.eos_token_id], "x", "reply", info)
    assert "<|im_start|>tool" not in tok.decode(plain.prompt_ids(conv))


def test_window_mode_restates_task_and_keeps_last_k(policy: TransformersPolicy) -> None:
    renderer = PromptRenderer(policy.tokenizer, mode="window", window_turns=1)
    conv = renderer.start("Find the key.", {"admissible_actions": ["a", "b"]})
    renderer.record(conv, [], "a", "obs one", {"admissible_actions": ["b"]})
    renderer.record(conv, [], "b", "obs two", {"admissible_actions": ["a"]})
    text = policy.tokenizer.decode(renderer.prompt_ids(conv))
    assert "Task: Find the key." in text and "[2] b -> obs two" in text and "[1] a" not in text
    assert "taken 2 action(s)" in text and "Available actions: a" in text


def _collect(policy: TransformersPolicy, make_env, mode: str) -> list[EpisodeGroup]:
    renderer = PromptRenderer(policy.tokenizer, mode=mode, window_turns=2)
    collector = Collector(make_env, policy, renderer)
    try:
        return collector.collect([11, 12], group_size=3,
                                 sampling=SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    finally:
        collector.close()


@pytest.mark.parametrize("mode", ["window", "full"])
def test_collect_records_groups_and_turns(policy: TransformersPolicy, mode: str) -> None:
    groups = _collect(policy, lambda: agentgym.make("maze-v0", max_turns=4), mode)
    assert [len(g.trajectories) for g in groups] == [3, 3]
    for group in groups:
        assert {t.task_id for t in group.trajectories} == {group.task_id}
        for trajectory in group.trajectories:
            assert 1 <= len(trajectory.turns) <= 4
            assert trajectory.truncated == (len(trajectory.turns) == 4 and not trajectory.success)
            for turn in trajectory.turns:
                assert len(turn.response_ids) == len(turn.response_logprobs) > 0
                text = policy.tokenizer.decode(turn.response_ids, skip_special_tokens=True)
                assert turn.action == parse_action(text).action
                assert turn.state_key.startswith(group.task_id)
            if mode == "full":  # each prompt extends the previous prompt + its generated ids
                for before, after in itertools.pairwise(trajectory.turns):
                    prefix = before.prompt_ids + before.response_ids
                    assert after.prompt_ids[:len(prefix)] == prefix
    # a random tiny model mostly emits garbage: invalid actions are flagged, not raised
    assert any(t.invalid for g in groups for tr in g.trajectories for t in tr.turns)
    json.dumps([g.to_json() for g in groups])  # records are plain data
    assert EpisodeGroup.from_json(json.loads(json.dumps(groups[0].to_json()))) == groups[0]


def test_collector_over_http_matches_in_process(policy: TransformersPolicy, make_service) -> None:
    service = make_service(["sokoban-v0"])
    client = EnvClient(client=service)
    local = _collect(policy, lambda: agentgym.make("sokoban-v0", max_turns=3), "window")
    remote = _collect(policy, lambda: RemoteEnv("sokoban-v0", client=client, max_turns=3), "window")
    assert [g.to_json() for g in remote] == [g.to_json() for g in local]


def test_collector_over_a_fleet_matches_in_process(policy: TransformersPolicy, make_service) -> None:
    from agentgym.http.fleet import EnvFleet

    service = make_service(["sokoban-v0"])
    fleet = EnvFleet(["http://testserver"], "sokoban-v0", max_turns=3, clients=[EnvClient(client=service)])
    local = _collect(policy, lambda: agentgym.make("sokoban-v0", max_turns=3), "window")
    assert [g.to_json() for g in _collect(policy, fleet, "window")] == [g.to_json() for g in local]
