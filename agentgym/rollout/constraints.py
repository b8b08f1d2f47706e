"""Constrained decoding: the ``DecodingConstraint`` protocol, its registry and ``TagSpans`` (``tag_spans``).

A constraint is a rule on whole responses that a backend enforces while it generates: at every
position only tokens that keep the response valid may be drawn. ``SamplingParams.constraint`` (and
``rollout.constraint`` in a training config) names a registered constraint, optionally with
arguments after a colon (``"tag_spans:python,answer"``: the factory gets ``("python", "answer")``);
``None`` generates freely. This module is torch-free; ``agentgym.backends`` applies the rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentgym.errors import ConfigError, UnknownPlugin
from agentgym.plugins import PluginRegistry


@runtime_checkable
class DecodingConstraint(Protocol):
    """Contract of a constraint: which characters may come next, and whether the response may end.

    ``next_chars(prompt, response)`` gets the prompt's text (special tokens left out) and the
    response text generated so far, and returns the characters that may follow, or ``None`` when
    any may. ``may_end(prompt, response)`` says whether the response may stop here: the backend
    allows its end-of-turn token only then, and ends a response that may neither continue nor end.
    Both are pure functions of their arguments (a backend may call them in any order, many times).
    A backend allows a multi-character token only when each of its characters is allowed in turn.
    """

    def next_chars(self, prompt: str, response: str) -> frozenset[str] | None: ...

    def may_end(self, prompt: str, response: str) -> bool: ...


def _is_word(char: str) -> bool:
    return char.isalnum()


#: A span never crosses these: it stays on one line of the prompt's text and out of markup (the chat
#: template's role lines, ``</information>``), so a copied argument is never "Labs?\nassistant".
_SPAN_BREAKS = frozenset("\n<>")


@functools.lru_cache(maxsize=512)
def _word_initials(prompt: str) -> frozenset[str]:
    return frozenset(c for i, c in enumerate(prompt)
                     if _is_word(c) and (i == 0 or not _is_word(prompt[i - 1])))


def _leads_to_a_word(prompt: str, pos: int) -> bool:
    """Copying ``prompt[pos]`` can still end on a whole word: a word character comes at or after
    ``pos`` before any span break (so no copy ever runs into a dead end it cannot close)."""
    for char in prompt[pos:]:
        if char in _SPAN_BREAKS:
            return False
        if _is_word(char):
            return True
    return False


def _span_starts(prompt: str, text: str) -> list[int]:
    """Where ``text`` occurs in ``prompt`` starting at the beginning of a word."""
    found, start = [], prompt.find(text)
    while start >= 0:
        if _is_word(prompt[start]) and (start == 0 or not _is_word(prompt[start - 1])):
            found.append(start)
        start = prompt.find(text, start + 1)
    return found


def is_word_span(prompt: str, text: str) -> bool:
    """``text`` is a run of whole words of ``prompt``: it occurs there starting at the beginning of a
    word and ending at the end of one.

    Example:
        >>> [is_word_span("Kampyn is a city in Birsel.\\nuser", text)
        ...  for text in ("city in Birsel", "Kamp", "Birsel.", "", "Birsel.\\nuser")]
        [True, False, False, False, False]
    """
    if not text or not _is_word(text[-1]) or not _SPAN_BREAKS.isdisjoint(text):
        return False
    end = len(text)
    return any(s + end == len(prompt) or not _is_word(prompt[s + end]) for s in _span_starts(prompt, text))


@dataclass(frozen=True)
class TagSpans:
    """``tag_spans``: a response is exactly one ``<tag>text</tag>`` call whose text is copied from the prompt.

    The tag is one of ``tags``; the text is a run of whole words of one line of the prompt, outside
    markup (``is_word_span``):
    a search query taken from the question, an answer taken from a retrieved document, or a Python
    expression taken from the question (``tag_spans:python,answer`` on ``code-math-v0``). This turns
    writing an argument character by character into choosing where to start copying and where to
    stop, which a tiny model learns from a few hundred demonstration turns; a model that cannot yet
    copy reliably still produces only well-formed calls. It suits tag-protocol envs whose arguments
    are extractive (``search-qa-v0``); JSON or computed values cannot be written under it.

    Raises:
        ConfigError: ``tags`` is empty or a tag is not a plain name (letters, digits, ``_``, ``-``).

    Example:
        >>> rule, prompt = TagSpans(), "Question: Who founded Zorvex Labs?"
        >>> sorted(rule.next_chars(prompt, "<"))
        ['a', 's']
        >>> sorted(rule.next_chars(prompt, "<search>Zorvex"))
        [' ', '<']
        >>> done = "<search>Zorvex Labs</search>"
        >>> rule.next_chars(prompt, done), rule.may_end(prompt, done)
        (frozenset(), True)
        >>> rule.may_end(prompt, "<search>Zorv</search>")  # not a whole word: never generated
        False
    """

    tags: tuple[str, ...] = ("search", "answer")
    """Tag names a response may use (``tag_spans:<tag>,<tag>,...`` chooses them by name)."""

    def __post_init__(self) -> None:
        tags = tuple(self.tags)
        if not tags or any(not isinstance(t, str) or not t.replace("_", "").replace("-", "").isalnum()
                           for t in tags):
            raise ConfigError(f"tag_spans needs tag names made of letters, digits, '_' or '-', "
                              f"e.g. 'tag_spans:search,answer'; got {self.tags!r}")
        object.__setattr__(self, "tags", tags)

    def next_chars(self, prompt: str, response: str) -> frozenset[str] | None:
        allowed: set[str] = set()
        for tag in self.tags:
            opening, closing = f"<{tag}>", f"</{tag}>"
            if len(response) < len(opening):
                if opening.startswith(response):
                    allowed.add(opening[len(response)])
                continue
            if not response.startswith(opening):
                continue
            rest = response[len(opening):]
            if rest.endswith(closing) and is_word_span(prompt, rest[: -len(closing)]):
                return frozenset()  # the call is complete
            if not rest:
                allowed |= _word_initials(prompt)
                continue
            for start in _span_starts(prompt, rest):  # copy on, never past the prompt's last word
                if _leads_to_a_word(prompt, start + len(rest)):
                    allowed.add(prompt[start + len(rest)])
            for k in range(len(closing)):  # close the tag after a whole-word span
                if rest.endswith(closing[:k]) and is_word_span(prompt, rest[: len(rest) - k]):
                    allowed.add(closing[k])
        return frozenset(allowed)

    def may_end(self, prompt: str, response: str) -> bool:
        for tag in self.tags:
            opening, closing = f"<{tag}>", f"</{tag}>"
            if response.startswith(opening) and response.endswith(closing) and \
                    len(response) > len(opening) + len(closing) and \
                    is_word_span(prompt, response[len(opening): -len(closing)]):
                return True
        return False


def _tag_spans(*tags: str) -> TagSpans:
    return TagSpans(tags) if tags else TagSpans()


_CONSTRAINTS: PluginRegistry[Callable[..., DecodingConstraint]] = PluginRegistry(
    "decoding constraint", unknown_error=UnknownPlugin)
_CONSTRAINTS.register("tag_spans", _tag_spans)


def register_constraint(name: str, factory: Callable[..., DecodingConstraint], *,
                        override: bool = False) -> None:
    """Make ``factory()`` the constraint that ``SamplingParams.constraint=name`` applies; with
    ``name:a,b`` the constraint is ``factory("a", "b")``.

    Raises:
        RegistryError: ``name`` is empty, or taken by another factory and ``override`` is false.

    Example:
        >>> register_constraint("tag_spans", TagSpans)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.RegistryError: decoding constraint 'tag_spans' ...; pass override=True to replace it
    """
    _CONSTRAINTS.register(name, factory, override=override)


def list_constraints() -> list[str]:
    """Registered constraint names, sorted."""
    return _CONSTRAINTS.names()


def make_constraint(spec: str) -> DecodingConstraint:
    """The registered constraint ``spec`` names: ``"name"``, or ``"name:arg,arg,..."`` to pass
    arguments (strings) to its factory.

    Raises:
        UnknownPlugin: no constraint has that name (a ``RegistryError`` and a ``ConfigError``; the
            message suggests the nearest and lists all).
        ConfigError: ``spec`` is not a string, or the factory refuses the arguments.

    Example:
        >>> make_constraint("tag_spans:python,answer").tags
        ('python', 'answer')
        >>> make_constraint("tag_span")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        agentgym.errors.UnknownPlugin: no decoding constraint named 'tag_span'. Did you mean 'tag_spans'? ...
    """
    if not isinstance(spec, str):
        raise ConfigError(f"a decoding constraint is named by a string such as 'tag_spans', got {spec!r}")
    name, _, arguments = spec.partition(":")
    args = tuple(a.strip() for a in arguments.split(",")) if arguments else ()
    factory = _CONSTRAINTS.get(name)
    try:
        return factory(*args)
    except TypeError as exc:  # the factory's signature refuses these arguments
        raise ConfigError(f"decoding constraint {name!r} does not take the arguments {list(args)}: {exc}") \
            from None
