"""A scripted OpenAI-shaped judge server (real FastAPI app on loopback) for the judge's tests and eval's."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from conftest import LiveServer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class ScriptedJudgeServer:
    """A real chat-completions server in a thread: answers ``script`` items first (status, text, delay,
    headers), then ``SCORE: <x>`` for the last ``want=<x>`` in the request's user message. It records
    every request body and the most requests it ever held at once."""

    def __init__(self) -> None:
        self.script: list[tuple[int, str, float, dict[str, str]]] = []
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.hold_until_in_flight = 0  # hold requests until this many are in flight at once (0: never)
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                deadline = time.monotonic() + 5.0
                while self.max_in_flight < self.hold_until_in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                status, text, delay_s, headers = (self.script.pop(0) if self.script
                                                  else (200, self.default_answer(body), 0.0, {}))
                if delay_s:
                    await asyncio.sleep(delay_s)
                if status != 200:
                    return JSONResponse({"error": {"message": text, "type": "server_error"}},
                                        status_code=status, headers=headers)
                return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            finally:
                self.in_flight -= 1

        self.live = LiveServer(app)
        self.url = f"{self.live.url}/v1"

    @staticmethod
    def default_answer(body: dict[str, Any]) -> str:
        user = body["messages"][1]["content"]
        want = user.rsplit("want=", 1)[1].split()[0] if "want=" in user else "0.5"
        return f"The agent did what was asked.\nSCORE: {want}"
