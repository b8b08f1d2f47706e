"""The tool-call parser: tag and ``<tool_call>`` JSON forms, several calls, and every malformed case."""

from __future__ import annotations

import json

from agentgym.envs.tools.tool_calls import (
    ParseError,
    ToolCall,
    parse_tool_calls,
    tool_spec,
    validate_arguments,
)

TOOLS = [
    tool_spec("search", "Search.", {"query": {"type": "string"}}),
    tool_spec("answer", "Answer.", {"answer": {"type": "string"}}),
    tool_spec("python", "Run code.", {"code": {"type": "string"}}),
    tool_spec("lookup", "Look up.", {"title": {"type": "string"}, "k": {"type": "integer"},
                                     "mode": {"type": "string", "enum": ["fast", "full"]}},
              required=["title"]),
]


def test_tag_forms_in_text_order() -> None:
    parsed = parse_tool_calls("<think>maybe <answer>no</answer></think>Let me look.\n"
                              "<search> Zorvex Labs </search><python>print(1)</python>", TOOLS)
    assert parsed.ok
    assert parsed.calls == (ToolCall("search", {"query": "Zorvex Labs"}, "tag"),
                            ToolCall("python", {"code": "print(1)"}, "tag"))


def test_json_form_with_several_calls_and_string_arguments() -> None:
    lookup = json.dumps({"name": "lookup", "arguments": json.dumps({"title": "b", "k": 2})})
    text = ('<tool_call>\n{"name": "search", "arguments": {"query": "a"}}\n</tool_call>\n'
            f'<tool_call>{lookup}</tool_call>'
            '<answer>c</answer>')
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.ok
    assert [(c.name, c.arguments, c.form) for c in parsed.calls] == [
        ("search", {"query": "a"}, "json"), ("lookup", {"title": "b", "k": 2}, "json"),
        ("answer", {"answer": "c"}, "tag")]


def messages(text: str, tools: list = TOOLS) -> list[str]:
    parsed = parse_tool_calls(text, tools)
    assert all(isinstance(e, ParseError) for e in parsed.errors)
    return [e.message for e in parsed.errors]


def test_malformed_calls_are_errors_never_exceptions() -> None:
    assert "not valid JSON" in messages(
        '<tool_call>{"name": "search", "arguments": {"query": }</tool_call>')[0]
    assert messages(
        '<tool_call>{"name": "fetch", "arguments": {}}</tool_call>')[0].startswith("unknown tool 'fetch'")
    assert messages('<tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call>') == [
        "tool 'lookup' is missing the required argument 'title'"]
    assert messages('<tool_call>{"name": "lookup", "arguments": {"title": "x", "k": true}}</tool_call>') == [
        "tool 'lookup': argument 'k' must be integer, got boolean"]
    assert "must be one of" in messages(
        '<tool_call>{"name": "lookup", "arguments": {"title": "x", "mode": "slow"}}</tool_call>')[0]
    assert "has no argument 'q'" in messages(
        '<tool_call>{"name": "search", "arguments": {"query": "x", "q": "x"}}</tool_call>')[0]
    assert "arguments string is not valid JSON" in messages(
        '<tool_call>{"name": "search", "arguments": "{oops"}</tool_call>')[0]
    assert 'no "name"' in messages('<tool_call>{"arguments": {}}</tool_call>')[0]
    assert "JSON object" in messages("<tool_call>[1, 2]</tool_call>")[0]
    assert "never closed" in messages("<search>Zorvex Labs")[0]
    assert "is empty" in messages("<search>  </search>")[0]
    assert messages("<python>1</python>", TOOLS[:2])[0].startswith("unknown tool 'python'")
    assert messages("The answer is 42.")[0].startswith("no tool call found")
    assert messages("")[0].startswith("no tool call found")
    # A call that is fine next to one that is not: both are reported.
    parsed = parse_tool_calls('<search>x</search><tool_call>{bad</tool_call>', TOOLS)
    assert len(parsed.calls) == 1 and len(parsed.errors) == 1 and not parsed.ok


def test_validate_arguments_needs_an_object() -> None:
    assert validate_arguments(TOOLS[0], ["x"]) == "tool 'search': arguments must be a JSON object, got array"
    assert validate_arguments(TOOLS[3], {"title": "x", "k": 3, "mode": "fast"}) is None
