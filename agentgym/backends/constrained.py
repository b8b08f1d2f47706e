"""``ConstraintMask``: a ``DecodingConstraint`` applied to a decoding batch, as a logit mask per step."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch

from agentgym.rollout.constraints import DecodingConstraint


def token_pieces(tokenizer: Any, vocab_size: int) -> dict[int, str]:
    """The text of every ordinary token id below ``vocab_size`` (special tokens and ids whose text is not
    whole characters, such as a lone byte of a multi-byte character, are left out).

    Example:
        >>> from agentgym.backends.tiny import ByteTokenizer
        >>> pieces = token_pieces(ByteTokenizer(), 260)
        >>> pieces[ord("a")], 0xC3 in pieces, 259 in pieces  # a letter, half of "é", <|im_end|>
        ('a', False, False)
    """
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    pieces = {}
    for token in range(vocab_size):
        if token in special:
            continue
        text = tokenizer.decode([token], skip_special_tokens=True)
        if text and "\ufffd" not in text:
            pieces[token] = text
    return pieces


class _TokenTrie:
    """Every token's text as a path of characters: the tokens whose text ends at a node (``ends``), and
    below it (``below``, gathered on first use)."""

    __slots__ = ("children", "ends", "_below")

    def __init__(self) -> None:
        self.children: dict[str, _TokenTrie] = {}
        self.ends: list[int] = []
        self._below: list[int] | None = None

    @classmethod
    def of(cls, pieces: dict[int, str]) -> _TokenTrie:
        root = cls()
        for token, text in pieces.items():
            node = root
            for char in text:
                node = node.children.setdefault(char, cls())
            node.ends.append(token)
        return root

    def below(self) -> list[int]:
        """The tokens whose text runs on past this node."""
        if self._below is None:
            self._below = [t for child in self.children.values() for t in (*child.ends, *child.below())]
        return self._below


#: The trie of the last ``pieces`` asked for (a policy's pieces are computed once; held, so its id stays its).
_LAST_TRIE: tuple[dict[int, str], _TokenTrie] | None = None


def _trie_of(pieces: dict[int, str]) -> _TokenTrie:
    global _LAST_TRIE
    if _LAST_TRIE is None or _LAST_TRIE[0] is not pieces:
        _LAST_TRIE = (pieces, _TokenTrie.of(pieces))
    return _LAST_TRIE[1]


class ConstraintMask:
    """The tokens a constraint allows at each step of one batch, as an additive logit mask.

    A token is allowed when each character of its text is allowed in turn; the end-of-turn tokens
    when the constraint says the response may end, or when nothing else is allowed (so a response
    that cannot continue ends instead of running to ``max_new_tokens``). The tokens are found by walking
    a trie of their texts, descending only along allowed characters: the rule is asked once per prefix
    that can still be allowed, not once per character of every token (with a 49k vocabulary, most tokens
    are ruled out at their first character).

    Args:
        constraint: the rule.
        tokenizer: decodes the prompts (special tokens left out: the rule sees their text only).
        prompts: the batch's prompt ids.
        pieces: ``token_pieces`` of the tokenizer (computed once per policy).
        stop_token_ids: the end-of-turn ids.
        vocab_size: logits width.

    Example:
        >>> from agentgym.backends.tiny import ByteTokenizer
        >>> from agentgym.rollout.constraints import TagSpans
        >>> tok = ByteTokenizer()
        >>> prompt = tok.encode("Who founded Zorvex Labs?", add_special_tokens=False)
        >>> mask = ConstraintMask(TagSpans(), tok, [prompt], token_pieces(tok, 260), {259}, 260)
        >>> for ch in "<search>Zorvex Labs</search>":
        ...     mask.advance(0, ord(ch))
        >>> [i for i, v in enumerate(mask.step([0])[0].tolist()) if v == 0]  # only <|im_end|> is left
        [259]
    """

    def __init__(self, constraint: DecodingConstraint, tokenizer: Any, prompts: Sequence[Sequence[int]],
                 pieces: dict[int, str], stop_token_ids: Collection[int], vocab_size: int) -> None:
        self.constraint = constraint
        self.prompts = [tokenizer.decode(list(p), skip_special_tokens=True) for p in prompts]
        self.responses = ["" for _ in prompts]
        self.pieces = pieces
        self.trie = _trie_of(pieces)
        self.stop_ids = sorted(stop_token_ids)
        self.vocab_size = vocab_size

    def advance(self, row: int, token: int) -> None:
        """Record that prompt ``row`` generated ``token``."""
        self.responses[row] += self.pieces.get(token, "")

    def allowed(self, row: int) -> list[int] | None:
        """Token ids prompt ``row`` may generate next; None when the rule allows anything."""
        prompt, response = self.prompts[row], self.responses[row]
        chars = self.constraint.next_chars(prompt, response)
        if chars is None:
            return None
        ids: list[int] = []
        # (node, the text from the response's end to it, the characters allowed after that text)
        stack: list[tuple[_TokenTrie, str, frozenset[str]]] = [(self.trie, "", chars)]
        while stack:
            node, text, allowed = stack.pop()
            for char in (allowed if len(allowed) < len(node.children) else node.children):
                child = node.children.get(char)
                if child is None or char not in allowed:
                    continue
                ids.extend(child.ends)
                if child.children:
                    after = self.constraint.next_chars(prompt, response + text + char)
                    if after is None:  # anything may follow: every longer token through here is allowed
                        ids.extend(child.below())
                    elif after:
                        stack.append((child, text + char, after))
        if not ids or self.constraint.may_end(prompt, response):
            ids += self.stop_ids
        return ids

    def step(self, rows: Sequence[int | None], device: torch.device | str | None = None) -> torch.Tensor:
        """``(len(rows), vocab)`` float32 on ``device``: 0 where allowed, ``-inf`` elsewhere; a ``None`` row
        (a finished one kept in the batch) allows everything. Built where the logits are, so only the
        allowed ids cross to a GPU, not a vocabulary-wide row per step."""
        mask = torch.zeros((len(rows), self.vocab_size), device=device)
        for j, row in enumerate(rows):
            ids = None if row is None else self.allowed(row)
            if ids is not None:
                mask[j].fill_(float("-inf"))
                mask[j, ids] = 0.0
        return mask
