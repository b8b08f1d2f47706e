"""Tool calls in model responses: ``parse_tool_calls`` (tag and ``<tool_call>`` JSON forms) and tool specs.

Two protocols are understood, in any mix and order within one response:

- **Tags** (Search-R1 / ARPO): ``<search>query</search>``, ``<python>code</python>``,
  ``<answer>text</answer>``. The tag names the tool; the text between the tags becomes the tool's
  single text argument (the first ``required`` property of its schema).
- **JSON** (Qwen / Hermes chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  ``arguments`` may itself be a JSON-encoded string, as some templates emit it.

Parsing never raises on model text: every problem (bad JSON, an unknown tool, a missing or
mistyped argument, an unclosed tag, no call at all) comes back as a ``ParseError`` with a message
that an env can show the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: Tag names recognised as tool calls in the tag protocol (when the tool is not offered, using the
#: tag is an "unknown tool" error; other tags such as ``<think>`` are ordinary text).
TAG_TOOLS = ("search", "python", "answer")
#: How the error of a response without any tool call starts (``ParsedResponse.no_call``).
NO_CALL_FOUND = "no tool call found"
#: Longest response the parser looks at (characters); the rest is ignored.
MAX_RESPONSE_CHARS = 100_000

_THINK_RE = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call of an offered tool."""

    name: str
    """The tool's name, as in its spec."""
    arguments: dict[str, Any]
    """Arguments, already validated against the tool's JSON schema (required keys and types)."""
    form: Literal["tag", "json"]
    """How the model wrote it: ``<name>…</name>`` or ``<tool_call>{json}</tool_call>``."""


@dataclass(frozen=True)
class ParseError:
    """A part of a response that was meant as a tool call but cannot be run."""

    message: str
    """What is wrong, written for the model (names the tool and the fix)."""
    snippet: str = ""
    """The offending text, shortened to 80 characters."""


@dataclass(frozen=True)
class ParsedResponse:
    """Everything ``parse_tool_calls`` found in one response, in text order."""

    calls: tuple[ToolCall, ...]
    """Well-formed calls."""
    errors: tuple[ParseError, ...]
    """Problems; a response with no call at all has exactly one error saying so."""

    @property
    def ok(self) -> bool:
        """At least one call and no errors."""
        return bool(self.calls) and not self.errors

    @property
    def no_call(self) -> bool:
        """The response attempted no tool call at all (its one error already lists the call forms)."""
        return not self.calls and len(self.errors) == 1 and self.errors[0].message.startswith(NO_CALL_FOUND)


def tool_spec(name: str, description: str, properties: Mapping[str, Mapping[str, Any]],
              required: Sequence[str] | None = None) -> dict[str, Any]:
    """A tool spec in OpenAI function format (``{"type": "function", "function": {...}}``).

    Args:
        name: the tool's name.
        description: one sentence for the model.
        properties: JSON-schema properties of the arguments object.
        required: required argument names (default: all of ``properties``).

    Example:
        >>> spec = tool_spec("search", "Search the corpus.", {"query": {"type": "string"}})
        >>> spec["function"]["parameters"]["required"]
        ['query']
    """
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: dict(value) for key, value in properties.items()},
                "required": list(properties) if required is None else list(required),
                "additionalProperties": False,
            },
        },
    }


def _function(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = spec.get("function", spec)
    return fn if isinstance(fn, Mapping) else {}


def _type_ok(value: Any, expected: Any) -> bool:
    kinds = expected if isinstance(expected, list) else [expected]
    for kind in kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:
            return True  # a type this validator does not know: do not reject on it
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue  # JSON true/false is not a number
        if isinstance(value, types):
            return True
    return False


def validate_arguments(spec: Mapping[str, Any], arguments: Any) -> str | None:
    """Check ``arguments`` against a tool spec's JSON schema; the problem as a message, or ``None``.

    Covers what tool schemas use in practice: an object with ``required`` keys, each property's
    ``type`` (or list of types) and ``enum``, and ``additionalProperties: false``. Nested schemas
    are checked for their top-level type only.

    Example:
        >>> spec = tool_spec("search", "Search.", {"query": {"type": "string"}, "k": {"type": "integer"}},
        ...                  ["query"])
        >>> validate_arguments(spec, {"query": "x"}) is None
        True
        >>> validate_arguments(spec, {"k": 3})
        "tool 'search' is missing the required argument 'query'"
        >>> validate_arguments(spec, {"query": "x", "k": "3"})
        "tool 'search': argument 'k' must be integer, got string"
    """
    fn = _function(spec)
    name = fn.get("name", "?")
    schema = fn.get("parameters") or {}
    if not isinstance(arguments, dict):
        return f"tool {name!r}: arguments must be a JSON object, got {_json_kind(arguments)}"
    properties = schema.get("properties") or {}
    for key in schema.get("required") or ():
        if key not in arguments:
            return f"tool {name!r} is missing the required argument {key!r}"
    for key, value in arguments.items():
        prop = properties.get(key)
        if prop is None:
            if schema.get("additionalProperties") is False:
                known = ", ".join(properties) or "none"
                return f"tool {name!r} has no argument {key!r} (arguments: {known})"
            continue
        if "type" in prop and not _type_ok(value, prop["type"]):
            return f"tool {name!r}: argument {key!r} must be {prop['type']}, got {_json_kind(value)}"
        if "enum" in prop and value not in prop["enum"]:
            return f"tool {name!r}: argument {key!r} must be one of {prop['enum']}, got {value!r}"
    return None


def _json_kind(value: Any) -> str:
    for kind, types in _JSON_TYPES.items():
        if isinstance(value, types) and not (isinstance(value, bool) and kind in ("integer", "number")):
            return kind
    return type(value).__name__


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


def _text_argument(spec: Mapping[str, Any]) -> str | None:
    """The argument a tag's text fills: the only required property (else the only property).

    A tool with several required arguments has no such argument: a tag cannot say which text is which.
    """
    schema = _function(spec).get("parameters") or {}
    required = list(schema.get("required") or ())
    if required:
        return str(required[0]) if len(required) == 1 else None
    properties = list(schema.get("properties") or {})
    return properties[0] if len(properties) == 1 else None


def _tag_call(name: str, body: str, specs: Mapping[str, Mapping[str, Any]]) -> ToolCall | ParseError:
    spec = specs.get(name)
    if spec is None:
        return ParseError(f"unknown tool {name!r}; available tools: {', '.join(specs) or 'none'}",
                          f"<{name}>")
    key = _text_argument(spec)
    if key is None:
        schema = _function(spec).get("parameters") or {}
        wanted = ", ".join(schema.get("required") or schema.get("properties") or ()) or "none"
        return ParseError(f"tool {name!r} takes several arguments ({wanted}); call it as "
                          f'<tool_call>{{"name": "{name}", "arguments": {{...}}}}</tool_call>', f"<{name}>")
    text = body.strip()
    if not text:
        return ParseError(f"<{name}></{name}> is empty; put the {key} between the tags", f"<{name}></{name}>")
    arguments = {key: text}
    problem = validate_arguments(spec, arguments)
    return ParseError(problem, _snippet(body)) if problem else ToolCall(name, arguments, "tag")


def _json_call(body: str, specs: Mapping[str, Mapping[str, Any]]) -> ToolCall | ParseError:
    snippet = _snippet(body)
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return ParseError(f"the <tool_call> body is not valid JSON ({exc})"[:300], snippet)
    if not isinstance(payload, dict):
        return ParseError('a <tool_call> must hold a JSON object {"name": ..., "arguments": {...}}', snippet)
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ParseError('the <tool_call> object has no "name" string', snippet)
    spec = specs.get(name)
    if spec is None:
        return ParseError(f"unknown tool {name!r}; available tools: {', '.join(specs) or 'none'}", snippet)
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some chat templates JSON-encode the arguments a second time
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return ParseError(f"tool {name!r}: the arguments string is not valid JSON", snippet)
    problem = validate_arguments(spec, arguments)
    return ParseError(problem, snippet) if problem else ToolCall(name, dict(arguments), "json")


def parse_tool_calls(response: str, tools: Sequence[Mapping[str, Any]]) -> ParsedResponse:
    """Every tool call in ``response``, validated against ``tools`` (OpenAI function specs).

    ``<think>…</think>`` blocks are skipped (reasoning may mention tags). Tag calls are recognised
    for the names in ``TAG_TOOLS`` and for every offered tool; an unclosed tag is an error.

    Args:
        response: the model's text for one turn.
        tools: the tool specs offered (``tool_spec`` output or any OpenAI-format spec).

    Returns:
        The calls and errors in text order; with neither, one error saying no call was found.

    Example:
        >>> tools = [tool_spec("search", "Search.", {"query": {"type": "string"}}),
        ...          tool_spec("answer", "Answer.", {"answer": {"type": "string"}})]
        >>> parsed = parse_tool_calls('<search>Zorvex Labs</search> <tool_call>{"name": "answer", '
        ...                           '"arguments": "{\\\\"answer\\\\": \\\\"Ostavia\\\\"}"}</tool_call>',
        ...                           tools)
        >>> [(c.name, c.arguments, c.form) for c in parsed.calls]
        [('search', {'query': 'Zorvex Labs'}, 'tag'), ('answer', {'answer': 'Ostavia'}, 'json')]
        >>> message = parse_tool_calls("I think it is Ostavia.", tools).errors[0].message
        >>> print(message)  # doctest: +NORMALIZE_WHITESPACE
        no tool call found; use <search>...</search>, <answer>...</answer> or
        <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    """
    specs: dict[str, Mapping[str, Any]] = {}
    for spec in tools:
        name = _function(spec).get("name")
        if isinstance(name, str):
            specs[name] = spec
    text = response[:MAX_RESPONSE_CHARS] if isinstance(response, str) else ""
    text = _THINK_RE.sub(" ", text)
    tags = sorted({*TAG_TOOLS, *(n for n in specs if re.fullmatch(r"[A-Za-z_][\w-]*", n))},
                  key=len, reverse=True)
    opener = re.compile(r"<(tool_call|" + "|".join(re.escape(t) for t in tags) + r")>")
    found: list[ToolCall | ParseError] = []
    pos = 0
    while True:
        match = opener.search(text, pos)
        if match is None:
            break
        name = match.group(1)
        close = f"</{name}>"
        end = text.find(close, match.end())
        if end < 0:
            found.append(ParseError(f"<{name}> is never closed; end it with {close}",
                                    _snippet(text[match.start():])))
            break
        body = text[match.end():end]
        found.append(_json_call(body, specs) if name == "tool_call" else _tag_call(name, body, specs))
        pos = end + len(close)
    if not found:
        offered = ", ".join(f"<{n}>...</{n}>" for n in specs if n in TAG_TOOLS)
        found.append(ParseError(
            f"{NO_CALL_FOUND}; use {offered + ' or ' if offered else ''}"
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
            _snippet(text),
        ))
    return ParsedResponse(
        calls=tuple(item for item in found if isinstance(item, ToolCall)),
        errors=tuple(item for item in found if isinstance(item, ParseError)),
    )


def work_or_answer(parsed: ParsedResponse, work_tool: str, work_argument: str, max_work: int, *,
                   work_verb: str, work_noun: str) -> tuple[list[Any], str | None, str | None]:
    """Split a turn of a "use a tool, then answer once" env into its tool work and its answer.

    The rule such envs (``search-qa-v0``, ``code-math-v0``) share: a turn either makes up to
    ``max_work`` calls of ``work_tool`` or gives one ``answer``, never both.

    Returns:
        ``(work, answer, problem)``: the ``work_argument`` of each ``work_tool`` call, the answer
        text (``None`` when the turn does not answer), and what is wrong with the turn (``None``
        when it is well-formed), written for the model.

    Example:
        >>> tools = [tool_spec("search", "S.", {"query": {"type": "string"}}),
        ...          tool_spec("answer", "A.", {"answer": {"type": "string"}})]
        >>> def split(text):
        ...     return work_or_answer(parse_tool_calls(text, tools), "search", "query", 2,
        ...                           work_verb="searches", work_noun="searches")
        >>> split("<search>a</search><search>b</search>")
        (['a', 'b'], None, None)
        >>> split("<search>a</search><answer>x</answer>")[2]
        'a turn either searches or answers, not both'
    """
    work = [call.arguments[work_argument] for call in parsed.calls if call.name == work_tool]
    answers = [call.arguments["answer"] for call in parsed.calls if call.name == "answer"]
    answer = answers[0] if answers else None
    if parsed.errors:
        return work, answer, parsed.errors[0].message
    if work and answers:
        return work, answer, f"a turn either {work_verb} or answers, not both"
    if len(answers) > 1:
        return work, answer, "answer once, with a single <answer>...</answer>"
    if len(work) > max_work:
        return work, answer, f"at most {max_work} {work_noun} per turn, got {len(work)}"
    return work, answer, None
