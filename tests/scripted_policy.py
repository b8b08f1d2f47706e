"""A policy that answers at once: it picks a maze move from a hash of the prompt and the seed.

Not a stand-in for a model: a real ``Policy`` whose answers are cheap and deterministic, so tests of
env transport (fleets, Ray actors) spend their time on envs and requests, and two collections with
the same seeds must give the same trajectories whatever carried the envs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from agentgym.rollout.policy import Generation, SamplingParams

MOVES = ("up", "down", "left", "right")


class ByteChatTokenizer:
    """UTF-8 bytes as token ids (0 is end of turn); chat messages joined as ``role: content`` lines."""

    eos_token_id = 0
    pad_token_id = 0

    def apply_chat_template(self, conversation: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in conversation)
        if add_generation_prompt:
            text += "\nassistant:"
        return list(text.encode()) if tokenize else text

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return bytes(t for t in token_ids if t).decode(errors="replace")


class ScriptedPolicy:
    """Moves chosen by ``sha256(seed, prompt)``: the same prompt and seed give the same move."""

    def __init__(self, moves: Sequence[str] = MOVES) -> None:
        self.tokenizer = ByteChatTokenizer()
        self.moves = tuple(moves)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for index, prompt in enumerate(prompts):
            digest = hashlib.sha256(f"{params.seed}|{index}|".encode() + bytes(prompt[-400:])).digest()
            ids = [*self.moves[digest[0] % len(self.moves)].encode(), 0]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def sync_weights(self, state_dict: Any) -> None:
        pass
