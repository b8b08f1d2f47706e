"""WebSocket and client measurements of ``env_server.py --scale ws clients``.

* ``ws``: one step per message over WebSocket sessions on ``maze-v0``: agentgym's OpenEnv route
  (``/openenv/maze-v0/ws``) against OpenEnv's own server (``openenv-core``'s ``create_fastapi_app``
  over the same env), both as shipped (``uvicorn`` defaults), each pinned to core 0 while a lean
  client (hand-built WebSocket frames) drives it from core 1.
* ``clients``: at 64 sessions against one agentgym service (pinned the same way): the lean HTTP
  client of env_server.py, our ``AsyncEnvClient`` (httpx over its lean transport), our
  ``AsyncSocketEnv`` and the lean WebSocket client, one step per request or message.

Also ``python env_scale_sockets.py --openenv-server PORT`` serves maze-v0 with OpenEnv's server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym.service_kit.launcher import free_port, start_service, stop_service

HOST = "127.0.0.1"
SEED_RANGE = 2**31


# --- a lean WebSocket client --------------------------------------------------------------------


class RawWebSocket:
    """Just enough of RFC 6455 for a benchmark: text frames, a zero mask, no fragmentation."""

    async def open(self, port: int, path: str) -> RawWebSocket:
        self.reader, self.writer = await asyncio.open_connection(HOST, port, limit=2**22)
        key = base64.b64encode(os.urandom(16))
        self.writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + f"{HOST}:{port}".encode()
                          + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key
                          + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"no WebSocket upgrade: {head[:200]!r}")
        return self

    async def ask(self, payload: bytes) -> bytes:
        n = len(payload)
        length = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        self.writer.write(b"\x81" + length + b"\0\0\0\0" + payload)
        _, second = await self.reader.readexactly(2)
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(await self.reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await self.reader.readexactly(8), "big")
        return await self.reader.readexactly(size)

    async def close(self) -> None:
        self.writer.write(b"\x88\x80\0\0\0\0")
        self.writer.close()


# --- load generators (run in a child pinned to core 1) ------------------------------------------


async def _ws_load(port: int, path: str, sessions: int, warmup_s: float, duration_s: float,
                   client: str) -> dict[str, Any]:
    rng = random.Random(0)

    async def connect() -> Any:
        if client == "ours":
            from agentgym.http.socket_client import AsyncSocketEnv

            return await AsyncSocketEnv.connect(f"http://{HOST}:{port}", "maze-v0")
        return await RawWebSocket().open(port, path)

    async def reset(conn: Any) -> list[str]:
        if client == "ours":
            return (await conn.reset(seed=rng.randrange(SEED_RANGE)))[1]["admissible_actions"]
        request = {"type": "reset", "data": {"seed": rng.randrange(SEED_RANGE)}}
        data = json.loads(await conn.ask(json.dumps(request).encode()))["data"]
        return data["observation"]["info"]["admissible_actions"]

    async def step(conn: Any, action: str) -> tuple[bool, list[str]]:
        if client == "ours":
            _, _, terminated, truncated, info = await conn.step(action)
            return terminated or truncated, info["admissible_actions"]
        message = b'{"type":"step","data":{"action":"' + action.encode() + b'"}}'
        data = json.loads(await conn.ask(message))["data"]
        return data["done"], data["observation"]["info"]["admissible_actions"]

    conns = [await connect() for _ in range(sessions)]
    actions = [await reset(c) for c in conns]
    start = time.perf_counter() + warmup_s
    end = start + duration_s
    counted = [0]

    async def drive(i: int) -> None:
        r = random.Random(i)
        while True:
            now = time.perf_counter()
            if now >= end:
                return
            done, actions[i] = await step(conns[i], r.choice(actions[i]))
            if start <= time.perf_counter() < end:
                counted[0] += 1
            if done:
                actions[i] = await reset(conns[i])

    await asyncio.gather(*(drive(i) for i in range(sessions)))
    for conn in conns:
        await conn.close()
    return {"steps_per_s": counted[0] / duration_s}


def _http_load(port: int, client: str, sessions: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    from http_load import load

    spec = {"port": port, "mode": "single", "client": client, "sessions": sessions, "seed": 0,
            "warmup_s": warmup_s, "duration_s": duration_s}
    out = asyncio.run(load(spec, None))
    return {"steps_per_s": out["steps"] / duration_s}


def _pinned_child(target: Callable[..., dict[str, Any]], args: tuple[Any, ...], queue: Any) -> None:
    try:
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
        queue.put(target(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def pinned(target: Callable[..., dict[str, Any]], *args: Any, timeout_s: float = 300) -> dict[str, Any]:
    """Run ``target(*args)`` in a forked child on core 1; its result."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_pinned_child, args=(target, args, queue), daemon=True)
    child.start()
    try:
        out = queue.get(timeout=timeout_s)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def _ws_child(*args: Any) -> dict[str, Any]:
    return asyncio.run(_ws_load(*args))


# --- servers ------------------------------------------------------------------------------------


def _start(command: list[str], port: int, quiet: bool = False) -> Any:
    import subprocess

    pin = ["taskset", "-c", "0"] if (os.cpu_count() or 1) > 1 else []
    streams = {"stdout": subprocess.DEVNULL, **({"stderr": subprocess.DEVNULL} if quiet else {})}
    return start_service(pin + command, f"http://{HOST}:{port}", timeout_s=120, **streams)


def agentgym_server(port: int) -> Any:
    return _start([str(Path(sys.executable).parent / "agentgym"), "serve", "maze-v0", "--port", str(port),
                   "--max-sessions", "4096", "--log-level", "error"], port)


def openenv_server(port: int) -> Any:
    # quiet: OpenEnv's server logs a traceback for every client that closes its connection
    return _start([sys.executable, str(Path(__file__).resolve()), "--openenv-server", str(port)], port,
                  quiet=True)


def serve_openenv(port: int) -> None:
    """maze-v0 behind OpenEnv's own server (``create_fastapi_app``), run by uvicorn with its defaults."""
    import uvicorn
    from openenv.core.env_server import Environment, create_fastapi_app
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    import agentgym

    class MazeAction(Action):
        action: str

    class MazeObservation(Observation):
        text: str = ""
        info: dict[str, Any] = Field(default_factory=dict)

    class MazeEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = agentgym.make("maze-v0")

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  **kwargs: Any) -> MazeObservation:
            obs, info = self.env.reset(seed=seed)
            return MazeObservation(text=obs, info=info, done=False, reward=None)

        def step(self, action: MazeAction, timeout_s: float | None = None, **kwargs: Any) -> MazeObservation:
            obs, reward, terminated, truncated, info = self.env.step(action.action)
            return MazeObservation(text=obs, info=info, done=terminated or truncated, reward=reward)

        @property
        def state(self) -> State:
            return State(step_count=self.env.turn)

    app = create_fastapi_app(MazeEnvironment, MazeAction, MazeObservation, max_concurrent_envs=4096)
    uvicorn.run(app, host=HOST, port=port, log_level="error")


# --- the sections -------------------------------------------------------------------------------


def compare_ws(session_counts: Sequence[int], duration_s: float) -> list[dict[str, Any]]:
    rows = []
    servers = {"agentgym /openenv/maze-v0/ws": (agentgym_server, "/openenv/maze-v0/ws"),
               "OpenEnv's own server /ws": (openenv_server, "/ws")}
    for name, (start, path) in servers.items():
        port = free_port()
        process = start(port)
        try:
            for n in session_counts:
                out = pinned(_ws_child, port, path, n, 1.0, duration_s, "lean")
                rows.append({"server": name, "sessions": n, "steps_per_s": out["steps_per_s"],
                             "load": round(os.getloadavg()[0], 2)})
                print(f"  ws {name:32} sessions={n:<3} {out['steps_per_s']:>9,.0f} steps/s", flush=True)
        finally:
            stop_service(process)
    for row in rows:
        theirs = next(r for r in rows
                      if r["sessions"] == row["sessions"] and r["server"].startswith("OpenEnv"))
        row["vs_openenv"] = row["steps_per_s"] / theirs["steps_per_s"]
    return rows


def ws_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| server | sessions | steps/s | vs OpenEnv's server | load avg |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['server']} | {r['sessions']} | {r['steps_per_s']:,.0f} | {r['vs_openenv']:.2f}× | "
              f"{r['load']} |" for r in rows]
    return "\n".join(lines)


def compare_clients(sessions: int, duration_s: float) -> list[dict[str, Any]]:
    port = free_port()
    process = agentgym_server(port)
    rows = []
    try:
        runs = {
            "lean HTTP client (one request per step)": (_http_load, (port, "raw", sessions, 1.0, duration_s)),
            "AsyncEnvClient, httpx + lean transport (one request per step)":
                (_http_load, (port, "httpx", sessions, 1.0, duration_s)),
            "AsyncSocketEnv (one message per step)":
                (_ws_child, (port, "/openenv/maze-v0/ws", sessions, 1.0, duration_s, "ours")),
            "lean WebSocket client (one message per step)":
                (_ws_child, (port, "/openenv/maze-v0/ws", sessions, 1.0, duration_s, "lean")),
        }
        for name, (target, args) in runs.items():
            out = pinned(target, *args)
            rows.append({"client": name, "sessions": sessions, "steps_per_s": out["steps_per_s"],
                         "load": round(os.getloadavg()[0], 2)})
            print(f"  client {name:48} {out['steps_per_s']:>9,.0f} steps/s", flush=True)
    finally:
        stop_service(process)
    lean = rows[0]["steps_per_s"]
    for row in rows:
        row["vs_lean_http"] = row["steps_per_s"] / lean
    return rows


def clients_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| client | sessions | steps/s | ÷ lean HTTP client | load avg |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['client']} | {r['sessions']} | {r['steps_per_s']:,.0f} | {r['vs_lean_http']:.2f} | "
              f"{r['load']} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openenv-server", type=int, metavar="PORT", required=True)
    serve_openenv(parser.parse_args().openenv_server)
