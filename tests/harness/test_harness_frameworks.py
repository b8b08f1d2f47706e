"""Real agent frameworks, unchanged, trained through the harness: the OpenAI Agents SDK and LangGraph examples
(examples/harness/) run against a real rollout proxy, their calls served by the collector. Each framework's
own client builds the requests; every turn's prompt must be exactly the chat (and tools) that framework sent,
rendered with the chat template, and every turn's response the ids the policy sampled."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.harness import HarnessEnv, RolloutProxy
from agentgym.rollout.chat_messages import render_messages
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import Generation, SamplingParams
from agentgym.rollout.prompt import PromptSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harness"
# The example and the package it needs (the `harness` extra: pip install 'agentgym-rl[harness]').
FRAMEWORKS = {"agents_sdk_agent": "agents", "langgraph_agent": "langgraph"}
TASK = {"id": "mul", "question": "What is 17 * 23?", "answer": 391}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


def _example(name: str) -> ModuleType:
    importlib.import_module(FRAMEWORKS[name])  # `make setup` installs the harness extra: a missing one fails
    spec = importlib.util.spec_from_file_location(f"harness_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



class Scripted:
    """A policy stand-in that answers the given texts in order."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.left = list(replies)

    def generate(self, prompts: Any, params: SamplingParams) -> list[Generation]:
        out = []
        for _ in prompts:
            ids = list(self.tokenizer.encode(self.left.pop(0), add_special_tokens=False))
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


class Recording:
    """The real policy, with every generation it made kept."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.generated: list[tuple[list[int], list[int], list[float]]] = []

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        out = self.policy.generate(prompts, params)
        for prompt, generation in zip(prompts, out, strict=True):
            self.generated.append((list(prompt), list(generation.token_ids), list(generation.logprobs)))
        return out


def _play(name: str, policy: Any, tokenizer: Any, proxy: RolloutProxy, seeds: list[int], group: int,
          max_new_tokens: int) -> list[Any]:
    run = _example(name).run
    renderer = PromptSettings(max_new_tokens=max_new_tokens).renderer(tokenizer, "raw")
    collector = Collector(lambda: HarnessEnv(run, [TASK], proxy=proxy, timeout_s=60), policy, renderer,
                          action_format="raw")
    try:
        groups = collector.collect(seeds, group, SamplingParams(max_new_tokens=max_new_tokens))
    finally:
        collector.close()
    return [t for g in groups for t in g.trajectories]


def _chats(trajectory: Any) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """The (messages, tools) each of the trajectory's calls sent: the first in ``first_info``, each later one
    in the info of the step before it."""
    infos = [trajectory.first_info, *(t.info for t in trajectory.turns[:-1])]
    return [(info["messages"], info["tools"]) for info in infos]


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_the_framework_calls_the_tool_and_answers(name: str, tiny: Any, proxy: RolloutProxy) -> None:
    tokenizer = tiny[1]
    policy = Scripted(tokenizer, [CALL, "17 * 23 = 391."])
    [trajectory] = _play(name, policy, tokenizer, proxy, [0], 1, 64)
    assert "harness_error" not in trajectory.turns[-1].info, trajectory.turns[-1].info
    assert len(trajectory.turns) == 2 and trajectory.turns[-1].reward == 1.0 and trajectory.success
    chats = _chats(trajectory)
    for (messages, tools), turn in zip(chats, trajectory.turns, strict=True):
        assert [tool["function"]["name"] for tool in tools] == ["calculator"]
        assert turn.prompt_ids == render_messages(tokenizer, messages, tools)
    # the second call sent the model's call back as tool_calls, and the calculator's real result after it
    messages = chats[1][0]
    assert [m["role"] for m in messages][-2:] == ["assistant", "tool"]
    [call] = messages[-2]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "17 * 23"}
    assert messages[-1]["content"] == "391" and messages[-1]["tool_call_id"] == call["id"]
    assert "<tool_response>\n391\n</tool_response>" in tokenizer.decode(trajectory.turns[1].prompt_ids)
    assert trajectory.turns[0].tool_calls == 1


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_turn_is_the_framework_chat_and_the_sampled_ids(name: str, tiny: Any,
                                                             proxy: RolloutProxy) -> None:
    model, tokenizer = tiny
    policy = Recording(TransformersPolicy(model, tokenizer))
    trajectories = _play(name, policy, tokenizer, proxy, [0, 1], 2, 16)
    assert len(trajectories) == 4
    turns = [t for trajectory in trajectories for t in trajectory.turns]
    assert len(turns) == len(policy.generated)
    sampled = {tuple(prompt) + (-1,) + tuple(ids): logprobs for prompt, ids, logprobs in policy.generated}
    for trajectory in trajectories:
        for (messages, tools), turn in zip(_chats(trajectory), trajectory.turns, strict=True):
            assert turn.prompt_ids == render_messages(tokenizer, messages, tools)
            key = tuple(turn.prompt_ids) + (-1,) + tuple(turn.response_ids)
            assert turn.response_logprobs == sampled[key]


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_an_agent_that_never_answers_stops_after_max_calls(name: str, tiny: Any, proxy: RolloutProxy) -> None:
    from agentgym.harness.examples import MAX_CALLS

    tokenizer = tiny[1]
    [trajectory] = _play(name, Scripted(tokenizer, [CALL] * (MAX_CALLS + 1)), tokenizer, proxy, [0], 1, 64)
    # the framework's own limit (max_turns, recursion_limit) ends the run: reward 0, not a failed rollout
    assert len(trajectory.turns) == MAX_CALLS and trajectory.turns[-1].reward == 0.0
    assert "harness_error" not in trajectory.turns[-1].info
