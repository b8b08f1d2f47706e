"""The OpenAI Responses API on the rollout proxy (``POST /rollouts/{id}/v1/responses``): a request is read as
the same chat call as ``/chat/completions``, and the reply written back as a response object or its event
stream. Unit tests of the translation and its refusals, then the real ``openai`` client and an OpenAI Agents
SDK agent on its default (Responses) model, played through the collector."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import TypeAdapter

from agentgym.backends.openai_guard import RequestError
from agentgym.backends.tiny import build_tiny_model
from agentgym.harness import HarnessEnv, RolloutProxy
from agentgym.harness.examples import MAX_CALLS, SYSTEM, answered, calculate
from agentgym.harness.proxy import Reply, Rollout
from agentgym.harness.responses import parse_request, response_events, response_object
from agentgym.rollout.chat_messages import render_messages, reply_message
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import Generation, SamplingParams
from agentgym.rollout.prompt import PromptSettings

MODEL = "agentgym-policy"
TOOL = {"type": "function", "name": "lookup", "description": "Look a word up.", "strict": True,
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
TWO_CALLS = ('Sure.<tool_call>{"name": "lookup", "arguments": {"word": "apple"}}</tool_call>'
             '<tool_call>{"name": "lookup", "arguments": {"word": "pear"}}</tool_call>')


def _call(call_id: str, word: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "lookup",
            "arguments": json.dumps({"word": word}), "status": "completed"}


def _tool_call(call_id: str, word: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"word": word})}}


# --- the translation ----------------------------------------------------------------------------


def test_instructions_and_a_string_input_are_a_system_and_a_user_message() -> None:
    request = parse_request({"model": MODEL, "instructions": "Be brief.", "input": "Hi", "temperature": 0.3,
                             "max_output_tokens": 50, "store": False, "truncation": "auto", "include": [],
                             "metadata": {"k": "v"}, "parallel_tool_calls": True,
                             "text": {"format": {"type": "text"}}})
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert request.tools is None and not request.stream
    assert request.params == {"temperature": 0.3, "max_output_tokens": 50}  # recorded, not used


def test_items_become_the_chat_a_chat_completions_agent_would_send() -> None:
    request = parse_request({"model": MODEL, "instructions": "Use the tools.", "tools": [TOOL],
                             "tool_choice": "auto", "input": [
        {"role": "developer", "content": "Answer in English."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look up "},
                                                         {"type": "input_text", "text": "two words."}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]},
        _call("call_a", "apple"), _call("call_b", "pear"),
        {"type": "function_call_output", "call_id": "call_a", "output": "a fruit"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "also"}]},
        _call("call_c", "plum"),
        {"type": "function_call_output", "call_id": "call_c", "output": "a stone fruit"},
        {"role": "user", "content": "Thanks."},
    ]})
    assert request.messages == [
        {"role": "system", "content": "Use the tools."},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "Look up two words."},
        # the text before the calls and both parallel calls: ONE assistant message, as the model wrote it
        {"role": "assistant", "content": "Sure.", "tool_calls": [_tool_call("call_a", "apple"),
                                                                 _tool_call("call_b", "pear")]},
        {"role": "tool", "tool_call_id": "call_a", "content": "a fruit"},
        {"role": "tool", "tool_call_id": "call_b", "content": "also"},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("call_c", "plum")]},
        {"role": "tool", "tool_call_id": "call_c", "content": "a stone fruit"},
        {"role": "user", "content": "Thanks."},
    ]
    assert request.tools == [CHAT_TOOL]
    # tool_choice none: the model sees no tools, as in chat
    assert parse_request({"model": MODEL, "input": "x", "tools": [TOOL], "tool_choice": "none"}).tools is None


def test_the_reply_is_a_response_the_openai_models_accept() -> None:
    from openai.types.responses import Response, ResponseStreamEvent

    request = parse_request({"model": MODEL, "input": "x", "tools": [TOOL]})
    message, _ = reply_message(TWO_CALLS)
    response = Response.model_validate(response_object(request, message, MODEL))
    assert response.status == "completed" and response.usage is None and response.output_text == "Sure."
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    calls = response.output[1:]
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in calls] == [  # type: ignore[union-attr]
        (call["id"], "lookup", {"word": word}) for call, word in zip(message["tool_calls"], ["apple", "pear"],
                                                                    strict=True)]
    only_calls = response_object(request, reply_message(TWO_CALLS.removeprefix("Sure."))[0], MODEL)
    assert [item["type"] for item in only_calls["output"]] == ["function_call", "function_call"]
    # the stream: every event valid as the openai package reads it, numbered, ending in the whole response
    events = response_events(request, message, MODEL)
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(event) for event in events]
    assert [event.sequence_number for event in parsed] == list(range(len(events)))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        *["response.output_item.added", "response.function_call_arguments.delta",
          "response.function_call_arguments.done", "response.output_item.done"] * 2,
        "response.completed"]
    first, final = parsed[0].response, parsed[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Sure." and len(final.output) == 3 and final.id == first.id


REFUSED = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "send the whole conversation"),
    ({"conversation": "conv_1"}, "conversation", "keeps no conversations"),
    ({"background": True}, "background", "background responses are not served"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "tool type 'web_search'"),
    ({"tool_choice": "required"}, "tool_choice", "'auto' or 'none'"),
    ({"text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}}, "text.format", "json_schema"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]},
     "input[0].content[0]", "'input_image'"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "'web_search_call'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "keeps none"),
    ({"include": ["message.output_text.logprobs"]}, "include", "log-probs are not returned"),
    ({"input": []}, "input", "non-empty list"),
]


@pytest.mark.parametrize(("extra", "param", "text"), REFUSED)
def test_what_cannot_be_served_is_refused_naming_the_field(extra: dict[str, Any], param: str,
                                                           text: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request({"model": MODEL, "input": "x", **extra})
    assert caught.value.status == 400 and caught.value.param == param
    assert text in str(caught.value) and str(caught.value).startswith(param)


# --- over HTTP, with the real openai client -------------------------------------------------------



def test_the_route_refuses_in_openai_error_shape(proxy: RolloutProxy) -> None:
    rollout = proxy.open("t")
    headers = {"Authorization": f"Bearer {rollout.api_key}"}
    url = f"{rollout.base_url}/responses"
    ok = {"model": MODEL, "input": "hi"}
    cases = [(httpx.post(url, json={**ok, **extra}, headers=headers), 400, param, text)
             for extra, param, text in REFUSED]
    cases += [
        (httpx.post(url, json={**ok, "model": "gpt-5"}, headers=headers), 404, "model", "serves model"),
        (httpx.post(url, json={"input": "hi"}, headers=headers), 400, "model", "model is required"),
        (httpx.post(url, json=ok, headers={"Authorization": "Bearer wrong"}), 401, None, "wrong or missing"),
        (httpx.post(url, content=b"{nope", headers=headers), 400, None, "not JSON"),
    ]
    for response, status, param, text in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert error["param"] == param and text in error["message"], error
    assert not rollout.events.qsize()  # nothing refused reached the env
    rollout.close("done")


def _serve(rollout: Rollout, replies: list[str], seen: list[Any]) -> threading.Thread:
    """Answer the rollout's calls with ``replies`` as the env does, keeping each call."""

    def answer() -> None:
        for text in replies:
            call = rollout.events.get(timeout=20)
            seen.append(call)
            message, has_calls = reply_message(text)
            rollout.answer(call, Reply(text, message, "tool_calls" if has_calls else "stop"))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_the_openai_client_creates_and_streams_responses(proxy: RolloutProxy) -> None:
    rollout = proxy.open("t")
    calls: list[Any] = []
    server = _serve(rollout, [TWO_CALLS, "Both are fruit.", "Yes."], calls)
    client = openai.OpenAI(base_url=rollout.base_url, api_key=rollout.api_key, max_retries=0)
    first = client.responses.create(model=MODEL, instructions="Use the tools.", input="Look up two words.",
                                    tools=[TOOL], temperature=0.5)  # type: ignore[list-item]
    assert first.output_text == "Sure." and first.status == "completed"
    function_calls = [item for item in first.output if item.type == "function_call"]
    assert [json.loads(c.arguments)["word"] for c in function_calls] == ["apple", "pear"]
    # send the output back with both results, as an agent loop does: one assistant message, two tool results
    history: list[Any] = [{"role": "user", "content": "Look up two words."},
                          *[item.model_dump(exclude_none=True) for item in first.output],
                          *[{"type": "function_call_output", "call_id": c.call_id, "output": f"meaning {i}"}
                            for i, c in enumerate(function_calls)]]
    with client.responses.stream(model=MODEL, input=history, tools=[TOOL]) as stream:  # type: ignore[list-item]
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert deltas == ["Both are fruit."] and streamed.output_text == "Both are fruit."
    raw = client.responses.create(model=MODEL, input="ok?", stream=True)
    kinds = [event.type for event in raw]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    server.join(10)
    chat = calls[1].messages
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "tool"]
    assert chat[1]["content"] == "Sure." and [c["id"] for c in chat[1]["tool_calls"]] == [
        c.call_id for c in function_calls]
    assert [m["content"] for m in chat[2:]] == ["meaning 0", "meaning 1"]
    assert calls[0].tools == calls[1].tools == [CHAT_TOOL] and calls[0].params == {"temperature": 0.5}
    assert calls[0].messages[0] == {"role": "system", "content": "Use the tools."}
    rollout.close("done")


# --- an OpenAI Agents SDK agent on its default (Responses) model, through the collector -------------

TASK = {"id": "mul", "question": "What is 17 * 23?", "answer": 391}
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


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


def _sdk_agent(streamed: bool) -> Any:
    """The calculator agent as the Agents SDK docs write it on OpenAI: the default client, a model name."""
    from agents import (
        Agent,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression (+, -, *, /, parentheses) and return its value.

        Args:
            expression: The expression to evaluate, e.g. "(17 + 4) * 3".
        """
        return calculate(expression)

    async def run(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        agent = Agent(name="Calculator", instructions=SYSTEM, tools=[calculator], model=model)
        try:
            if streamed:
                result: Any = Runner.run_streamed(agent, task["question"], max_turns=MAX_CALLS)
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, task["question"], max_turns=MAX_CALLS)
        finally:
            await client.close()
        return 1.0 if answered(str(result.final_output), task["answer"]) else 0.0

    return run


@pytest.fixture()
def default_client() -> Iterator[None]:
    """The SDK's default client is process-wide: put back whatever was there."""
    from agents.models import _openai_shared

    before = _openai_shared.get_default_openai_client()
    yield
    _openai_shared.set_default_openai_client(before)  # type: ignore[arg-type]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_an_agents_sdk_agent_on_the_responses_api_trains_through_the_collector(
        streamed: bool, proxy: RolloutProxy, default_client: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentgym.harness.proxy as proxy_module

    sent: list[dict[str, Any]] = []  # the bodies the SDK posted to /responses (not /chat/completions)
    monkeypatch.setattr(proxy_module, "parse_request", lambda body: sent.append(body) or parse_request(body))
    tokenizer = build_tiny_model()[1]
    policy = Scripted(tokenizer, [CALL, "17 * 23 = 391."])
    renderer = PromptSettings(max_new_tokens=64).renderer(tokenizer, "raw")
    run = _sdk_agent(streamed)
    collector = Collector(lambda: HarnessEnv(run, [TASK], proxy=proxy, timeout_s=60), policy, renderer,
                          action_format="raw")
    try:
        [group] = collector.collect([0], 1, SamplingParams(max_new_tokens=64))
    finally:
        collector.close()
    [trajectory] = group.trajectories
    assert "harness_error" not in trajectory.turns[-1].info, trajectory.turns[-1].info
    assert len(trajectory.turns) == 2 and trajectory.turns[-1].reward == 1.0 and trajectory.success
    infos = [trajectory.first_info, trajectory.turns[0].info]
    for info, turn in zip(infos, trajectory.turns, strict=True):
        assert [tool["function"]["name"] for tool in info["tools"]] == ["calculator"]
        assert turn.prompt_ids == render_messages(tokenizer, info["messages"], info["tools"])
    messages = infos[1]["messages"]
    assert messages[0] == {"role": "system", "content": SYSTEM}  # the agent's instructions
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    [call] = messages[-2]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"expression": "17 * 23"}
    assert messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": "391"}
    assert "<tool_response>\n391\n</tool_response>" in tokenizer.decode(trajectory.turns[1].prompt_ids)
    assert len(sent) == 2 and all(body.get("stream", False) is streamed for body in sent)
    assert [item["type"] for item in sent[1]["input"][1:]] == ["function_call", "function_call_output"]

