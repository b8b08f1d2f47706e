"""Action parsing: turn a policy's response text into the action string sent to the env.

Formats:
    ``plain``  the response itself (first non-empty line, stripped).
    ``tag``    the content of the last ``<action>…</action>``; a response without one is invalid.

A response that does not parse is still sent to the env (as its stripped text, so the env can
explain what was wrong) and the turn is flagged invalid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ActionFormat = Literal["plain", "tag"]
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

    Example:
        >>> parse_action("I should go up.\\n<action>up</action>", "tag")
        ParsedAction(action='up', valid=True)
        >>> parse_action("up", "tag")
        ParsedAction(action='up', valid=False)
        >>> parse_action("  left \\nbecause...", "plain")
        ParsedAction(action='left', valid=True)
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
    raise ValueError(f"unknown action format {fmt!r}; use 'plain' or 'tag'")
