"""``AsyncSocketEnv``: an env session over one persistent WebSocket (the service's OpenEnv route).

One message per reset or step on a connection that stays open: no HTTP request to build, route
and parse per step. It speaks the protocol of ``agentgym.http.openenv`` (OpenEnv's), so it also
plays any OpenEnv server whose action is ``{"action": text}``; the answers come back as
``RemoteEnv``'s do, and an error the service reports raises the ``agentgym.errors`` class it names.
Needs the ``websockets`` package (installed with the ``server`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from agentgym.errors import ERRORS_BY_NAME, ConfigError, EnvCrashed, RemoteEnvError, RemoteTimeout
from agentgym.http.client import _reset_body, _step_body


class AsyncSocketEnv:
    """One env session per connection: ``await AsyncSocketEnv.connect(url, "maze-v0")``.

    Args (of ``connect``):
        base_url: the env service root, e.g. ``"http://127.0.0.1:8000"``.
        env_id: a served env id.
        token: bearer token, if the service has one.
        timeout_s: deadline of each answer (and of connecting).

    Example (needs a running service)::

        env = await AsyncSocketEnv.connect("http://127.0.0.1:8000", "maze-v0")
        obs, info = await env.reset(seed=0)
        obs, reward, terminated, truncated, info = await env.step("up")
        await env.close()
    """

    def __init__(self, connection: Any, url: str, timeout_s: float) -> None:
        self._ws = connection
        self.url = url
        self.timeout_s = timeout_s
        self.turn = 0
        self.episode_over = True

    @classmethod
    async def connect(cls, base_url: str, env_id: str, *, token: str | None = None,
                      timeout_s: float = 60.0) -> AsyncSocketEnv:
        try:
            from websockets.asyncio.client import connect
        except ImportError:
            raise ConfigError("AsyncSocketEnv needs the websockets package: "
                              "pip install 'agentgym-rl[server]'") from None
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        url = "ws" + base_url.rstrip("/")[4:] + f"/openenv/{env_id}/ws"
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            connection = await connect(url, additional_headers=headers, open_timeout=timeout_s,
                                       max_size=2**26, compression=None)
        except (OSError, asyncio.TimeoutError) as exc:
            raise RemoteEnvError(f"could not open {url}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # websockets' handshake errors (401, 404...)
            raise RemoteEnvError(f"could not open {url}: {exc}") from exc
        return cls(connection, url, timeout_s)

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            await self._ws.send(json.dumps(message))
            raw = await asyncio.wait_for(self._ws.recv(), self.timeout_s)
        except asyncio.TimeoutError:
            raise RemoteTimeout(f"{self.url}: no answer to {message['type']} "
                                f"within {self.timeout_s:g} s") from None
        except Exception as exc:  # the connection closed
            raise RemoteEnvError(f"{self.url}: {message['type']} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        answer = json.loads(raw)
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            cls = ERRORS_BY_NAME.get(str(data.get("type")), RemoteEnvError)
            if cls is EnvCrashed:
                self.episode_over = True
            raise cls(f"{self.url}: {data.get('message')} ({data.get('code')})")
        return answer["data"]

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                    ) -> tuple[str, dict[str, Any]]:
        body = _reset_body(seed, options)
        data = {"seed": body["seed"]} if body["options"] is None else body
        observation = (await self._ask({"type": "reset", "data": data}))["observation"]
        self.turn, self.episode_over = 0, False
        return observation["text"], observation["info"]

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = await self._ask({"type": "step", "data": _step_body(action)})
        observation = answer["observation"]
        self.turn = observation["turn"]
        self.episode_over = answer["done"]
        return (observation["text"], answer["reward"], observation["terminated"], observation["truncated"],
                observation["info"])

    async def state(self) -> dict[str, Any]:
        """``{"episode_id", "step_count", "env_id", "episode_seed", "episode_over"}``."""
        return await self._ask({"type": "state"})

    async def close(self) -> None:
        """Close the connection; the service deletes the session."""
        with contextlib.suppress(Exception):  # already closed: nothing left to close
            await self._ws.send(json.dumps({"type": "close"}))
        await self._ws.close()
