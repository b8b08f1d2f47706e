"""Action parsing: ``parse_action`` turns a policy's response text into the action sent to the env.

Formats (``ActionFormat``):
    ``plain``  the first non-empty line of the response, stripped (one-line actions: games, mazes).
    ``tag``    the content of the last ``<action>…</action>``; a response without one is invalid.
    ``raw``    the whole response, stripped. The env parses it and says with
               ``info["invalid_action"]`` whether it could (tool envs: a fenced code block or a
               multi-line ``<tool_call>`` must reach the env whole).

A response that does not parse is still sent to the env (as its stripped text, so the env can
explain what was wrong) and the turn is flagged invalid. End-of-turn markers that a tokenizer
decodes as text are removed first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

ActionFormat = Literal["plain", "tag", "raw"]
ACTION_FORMATS: tuple[str, ...] = get_args(ActionFormat)
_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of parsing one response."""

    action: str
    """What to send to the env."""
    valid: bool
    """False when the response did not follow the format."""


def parse_action(text: str, fmt: ActionFormat = "plain") -> ParsedAction:
    """Extract the action from a response.

    Raises:
        ValueError: an unknown format.

    Example:
        >>> parse_action("I should go up.\\n<action>up</action>", "tag")
        ParsedAction(action='up', valid=True)
        >>> parse_action("up", "tag")
        ParsedAction(action='up', valid=False)
        >>> parse_action("  left \\nbecause...", "plain")
        ParsedAction(action='left', valid=True)
        >>> parse_action("<search>\\nwho founded X\\n</search><|im_end|>", "raw")
        ParsedAction(action='<search>\\nwho founded X\\n</search>', valid=True)
    """
    for marker in _END_MARKERS:
        text = text.replace(marker, "")
    if fmt == "tag":
        found = _TAG.findall(text)
        if found:
            return ParsedAction(found[-1].strip(), True)
        return ParsedAction(text.strip(), False)
    if fmt == "plain":
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        return ParsedAction(lines[0] if lines else "", bool(lines))
    if fmt == "raw":
        whole = text.strip()
        return ParsedAction(whole, bool(whole))
    raise ValueError(f"unknown action format {fmt!r}; use one of {', '.join(map(repr, ACTION_FORMATS))}")
