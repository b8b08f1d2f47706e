"""``ChatActor``: a chat-API endpoint as the ``Collector``'s actor, one concurrent request per live episode.

The collector renders every prompt with a ``PromptRenderer`` over a ``MessageCodec``
(``agentgym.eval.messages``), so the endpoint sees the messages a local model would; the endpoint's
own chat template does the tokenizing. Each turn the actor sends the requests of all live episodes at
once from a thread pool, so the endpoint gets as many concurrent requests as there are live episodes.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

from agentgym.backends.openai_backend import ContextLengthExceeded
from agentgym.eval.messages import MessageCodec, render_messages
from agentgym.rollout.actions import ActionFormat, parse_action
from agentgym.rollout.actors import ActorTurn, TurnRequest
from agentgym.rollout.policy import SamplingParams


class ChatActor:
    """A chat-API endpoint (an ``agentgym.backends.openai_backend.OpenAIEndpoint``).

    Args:
        endpoint: answers ``chat(messages, params, tools=...)``.
        action_format: how replies become actions.
        send_tools: pass tool envs' specs as ``tools=``; otherwise they are written into the system
            message (for servers that refuse ``tools`` without a tool parser).
        concurrency: requests in flight at once (threads).

    A seeded ``sampling`` gets a distinct seed per episode and turn. Turns record the server's token
    ids (when it returns them) as ``response_ids``, no prompt ids, and in ``extras`` the prompt and
    reply as text and ``completion_tokens``. A prompt the model's context cannot hold ends the episode
    (``ActorTurn.cut``), as the prompt budget does for local models.
    """

    def __init__(self, endpoint: Any, action_format: ActionFormat = "plain", *, send_tools: bool = True,
                 concurrency: int = 32) -> None:
        self.endpoint = endpoint
        self.codec = MessageCodec()
        self.action_format = action_format
        self.send_tools = send_tools
        self._threads = ThreadPoolExecutor(max_workers=max(1, concurrency),
                                           thread_name_prefix="agentgym-chat")

    def act(self, requests: Sequence[TurnRequest], sampling: SamplingParams) -> list[ActorTurn]:
        futures = [self._threads.submit(self._turn, request, sampling) for request in requests]
        try:
            pending: Any = futures
            while pending:
                # A timed wait: the calling thread wakes up regularly, so Ctrl-C is handled at once.
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                for future in done:
                    error = future.exception()
                    if error is not None:
                        raise error
        except BaseException:
            for future in futures:
                future.cancel()  # requests not yet sent are dropped; those in flight end at their timeout
            raise
        return [future.result() for future in futures]

    def _turn(self, request: TurnRequest, sampling: SamplingParams) -> ActorTurn:
        messages, tools = self.codec.messages(request.prompt_ids)
        if tools and not self.send_tools:
            listing = f"Available tools (JSON schema):\n{json.dumps(tools)}"
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{listing}\n\n{messages[0]['content']}"}
            else:
                messages.insert(0, {"role": "system", "content": listing})
            tools = None
        params = sampling
        if params.seed is not None:
            episode = f"{request.group_id}/{request.member}"
            params = replace(params, seed=zlib.crc32(f"{params.seed}:{episode}:{request.turn}".encode()))
        try:
            reply = self.endpoint.chat(messages, params, tools=tools)
        except ContextLengthExceeded:
            return ActorTurn(cut="the prompt outgrew the model's context")
        parsed = parse_action(reply.text, self.action_format)
        tokens = (reply.completion_tokens if reply.completion_tokens is not None
                  else len(reply.token_ids or ()))
        extras = {"prompt_text": render_messages(messages), "response_text": reply.text,
                  "completion_tokens": int(tokens)}
        return ActorTurn(parsed.action, list(reply.token_ids or ()), [], parsed.valid, extras,
                         history_ids=self.codec.encode(reply.text), prompt_ids=[])

    def close(self) -> None:
        """Stop the request threads (waits for requests in flight)."""
        self._threads.shutdown(wait=True, cancel_futures=True)
