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


class ConstraintMask:
    """The tokens a constraint allows at each step of one batch, as an additive logit mask.

    A token is allowed when each character of its text is allowed in turn; the end-of-turn tokens
    when the constraint says the response may end, or when nothing else is allowed (so a response
    that cannot continue ends instead of running to ``max_new_tokens``).

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
        self.stop_ids = sorted(stop_token_ids)
        self.vocab_size = vocab_size
        self.by_char: dict[str, list[int]] = {}
        self.longer: dict[str, list[tuple[int, str]]] = {}
        for token, text in pieces.items():
            if len(text) == 1:
                self.by_char.setdefault(text, []).append(token)
            else:
                self.longer.setdefault(text[0], []).append((token, text))

    def advance(self, row: int, token: int) -> None:
        """Record that prompt ``row`` generated ``token``."""
        self.responses[row] += self.pieces.get(token, "")

    def allowed(self, row: int) -> list[int] | None:
        """Token ids prompt ``row`` may generate next; None when the rule allows anything."""
        prompt, response = self.prompts[row], self.responses[row]
        chars = self.constraint.next_chars(prompt, response)
        if chars is None:
            return None
        ids = [token for char in chars for token in self.by_char.get(char, ())]
        for char in chars:
            for token, text in self.longer.get(char, ()):
                if all(self._may_follow(prompt, response + text[:k], text[k]) for k in range(1, len(text))):
                    ids.append(token)
        if not ids or self.constraint.may_end(prompt, response):
            ids += self.stop_ids
        return ids

    def _may_follow(self, prompt: str, response: str, char: str) -> bool:
        chars = self.constraint.next_chars(prompt, response)
        return chars is None or char in chars

    def step(self, rows: Sequence[int | None]) -> torch.Tensor:
        """``(len(rows), vocab)`` float32: 0 where allowed, ``-inf`` elsewhere; a ``None`` row (a finished
        one kept in the batch) allows everything."""
        mask = torch.zeros((len(rows), self.vocab_size))
        for j, row in enumerate(rows):
            ids = None if row is None else self.allowed(row)
            if ids is not None:
                mask[j].fill_(float("-inf"))
                mask[j, ids] = 0.0
        return mask
