"""The load generator of the env-service benchmarks: a lean asyncio HTTP/1.1 client and httpx's, driving
``agentgym serve`` sessions over ``single`` (one step per request) or ``batch`` (``/batch/step``) requests
from worker processes, and the in-process reference. ``env_server.py`` tabulates what it measures;
``env_scale.py`` and ``env_scale_sockets.py`` reuse it.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
ENV_ID = "maze-v0"
SEED_RANGE = 2**31


# --- the lean client ----------------------------------------------------------------------------


class HTTPError(RuntimeError):
    pass


class RawConnection:
    """One keep-alive HTTP/1.1 connection that speaks just enough of the protocol for the service.

    Requests are built by hand; responses are framed by Content-Length (the service always sends
    one). No retries, no redirects, no chunked encoding: a benchmark client, not a general one.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._host_line = f"Host: {HOST}:{port}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        return self

    async def post(self, path: str, body: bytes) -> Any:
        assert self.reader is not None and self.writer is not None
        self.writer.write(
            b"POST " + path.encode() + b" HTTP/1.1\r\n" + self._host_line
            + b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        at = head.lower().find(b"\r\ncontent-length:")
        if at < 0:
            raise HTTPError(f"response without Content-Length: {head[:200]!r}")
        end = head.find(b"\r\n", at + 2)
        data = await self.reader.readexactly(int(head[at + 17 : end]))
        if status >= 300:
            raise HTTPError(f"POST {path} -> {status}: {data[:300]!r}")
        return json.loads(data)

    async def delete(self, path: str) -> None:
        assert self.reader is not None and self.writer is not None
        self.writer.write(b"DELETE " + path.encode() + b" HTTP/1.1\r\n" + self._host_line
                          + b"Content-Length: 0\r\n\r\n")
        head = await self.reader.readuntil(b"\r\n\r\n")
        at = head.lower().find(b"\r\ncontent-length:")
        if at >= 0:
            end = head.find(b"\r\n", at + 2)
            await self.reader.readexactly(int(head[at + 17 : end]))

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (ConnectionError, OSError):
                pass


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class RawAPI:
    """The service's routes over ``RawConnection``s (one per session in ``single`` mode)."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def connect(self) -> RawConnection:
        return await RawConnection(self.port).open()

    @staticmethod
    async def create(conn: RawConnection) -> str:
        return (await conn.post("/sessions", _dumps({"env_id": ENV_ID})))["session_id"]

    @staticmethod
    async def reset(conn: RawConnection, sid: str, seed: int) -> dict[str, Any]:
        return await conn.post(f"/sessions/{sid}/reset", _dumps({"seed": seed}))

    @staticmethod
    async def step(conn: RawConnection, sid: str, action: str) -> dict[str, Any]:
        return await conn.post(f"/sessions/{sid}/step", _dumps({"action": action}))

    @staticmethod
    async def batch_step(conn: RawConnection, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
        body = _dumps({"steps": [{"session_id": s, "action": a} for s, a in items]})
        return _checked((await conn.post("/batch/step", body))["results"])

    @staticmethod
    async def batch_reset(conn: RawConnection, items: list[tuple[str, int]]) -> list[dict[str, Any]]:
        body = _dumps({"resets": [{"session_id": s, "seed": seed} for s, seed in items]})
        return _checked((await conn.post("/batch/reset", body))["results"])

    @staticmethod
    async def delete(conn: RawConnection, sid: str) -> None:
        await conn.delete(f"/sessions/{sid}")

    @staticmethod
    async def close(conn: RawConnection) -> None:
        await conn.close()


class HttpxAPI:
    """The same calls through ``AsyncEnvClient`` (httpx); one client, its pool holds the connections."""

    def __init__(self, port: int) -> None:
        from agentgym.http.client import AsyncEnvClient

        self.client = AsyncEnvClient(f"http://{HOST}:{port}", retries=0)

    async def connect(self) -> Any:
        return self.client

    @staticmethod
    async def create(client: Any) -> str:
        return (await client.request("POST", "/sessions", {"env_id": ENV_ID}))["session_id"]

    @staticmethod
    async def reset(client: Any, sid: str, seed: int) -> dict[str, Any]:
        return await client.request("POST", f"/sessions/{sid}/reset", {"seed": seed})

    @staticmethod
    async def step(client: Any, sid: str, action: str) -> dict[str, Any]:
        return await client.request("POST", f"/sessions/{sid}/step", {"action": action})

    @staticmethod
    async def batch_step(client: Any, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return _checked(await client.batch_step(items))

    @staticmethod
    async def batch_reset(client: Any, items: list[tuple[str, int]]) -> list[dict[str, Any]]:
        return _checked(await client.batch_reset([(s, seed, None) for s, seed in items]))

    @staticmethod
    async def delete(client: Any, sid: str) -> None:
        await client.request("DELETE", f"/sessions/{sid}")

    async def close(self, _client: Any) -> None:
        pass

    async def aclose(self) -> None:
        await self.client.aclose()


def _checked(results: list[Any]) -> list[dict[str, Any]]:
    for r in results:
        if isinstance(r, Exception) or "error" in r:
            raise HTTPError(f"batch item failed: {r!r}")
    return results


# --- load generators (one per client process) ---------------------------------------------------


def install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


class Window:
    """The measured interval: [start, end) after the warm-up, on ``time.perf_counter``."""

    def __init__(self, warmup_s: float, duration_s: float) -> None:
        now = time.perf_counter()
        self.start = now + warmup_s
        self.end = self.start + duration_s
        self.cpu_start: float | None = None
        self.cpu_end: float | None = None

    def mark_cpu(self, now: float) -> None:
        if self.cpu_start is None and now >= self.start:
            self.cpu_start = time.process_time()
        if self.cpu_end is None and now >= self.end:
            self.cpu_end = time.process_time()


async def load(spec: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """Create ``spec["sessions"]`` sessions, wait at the barrier, drive them, report samples."""
    api = RawAPI(spec["port"]) if spec["client"] == "raw" else HttpxAPI(spec["port"])
    rng = random.Random(spec["seed"])
    n = spec["sessions"]
    batched = spec["mode"] == "batch"
    conns = [await api.connect() for _ in range(1 if batched else n)]
    sids: list[str] = []
    admissible: list[list[str]] = []
    for i in range(n):
        conn = conns[0 if batched else i]
        sid = await api.create(conn)
        sids.append(sid)
        first = await api.reset(conn, sid, rng.randrange(SEED_RANGE))
        admissible.append(first["info"]["admissible_actions"])
    if barrier is not None:
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
    window = Window(spec["warmup_s"], spec["duration_s"])
    latencies: list[float] = []
    counts = {"steps": 0, "resets": 0, "requests": 0}

    async def drive_one(i: int) -> None:
        conn, sid, acts = conns[i], sids[i], admissible[i]
        r = random.Random(rng.random())
        while True:
            t0 = time.perf_counter()
            if t0 >= window.end:
                window.mark_cpu(t0)
                return
            result = await api.step(conn, sid, r.choice(acts))
            t1 = time.perf_counter()
            window.mark_cpu(t0)
            if window.start <= t1 < window.end:  # counted by completion time
                latencies.append(t1 - t0)
                counts["steps"] += 1
                counts["requests"] += 1
            if result["terminated"] or result["truncated"]:
                acts = (await api.reset(conn, sid, r.randrange(SEED_RANGE)))["info"]["admissible_actions"]
                if window.start <= time.perf_counter() < window.end:
                    counts["resets"] += 1
            else:
                acts = result["info"]["admissible_actions"]

    async def drive_batch() -> None:
        conn = conns[0]
        while True:
            t0 = time.perf_counter()
            window.mark_cpu(t0)
            if t0 >= window.end:
                return
            results = await api.batch_step(conn, [(sid, rng.choice(acts))
                                                  for sid, acts in zip(sids, admissible, strict=True)])
            t1 = time.perf_counter()
            inside = window.start <= t1 < window.end  # counted by completion time
            if inside:
                latencies.append(t1 - t0)
                counts["steps"] += len(results)
                counts["requests"] += 1
            done = []
            for i, result in enumerate(results):
                if result["terminated"] or result["truncated"]:
                    done.append(i)
                else:
                    admissible[i] = result["info"]["admissible_actions"]
            if done:
                reset = await api.batch_reset(conn, [(sids[i], rng.randrange(SEED_RANGE)) for i in done])
                for i, result in zip(done, reset, strict=True):
                    admissible[i] = result["info"]["admissible_actions"]
                if inside:
                    counts["resets"] += len(done)

    if batched:
        await drive_batch()
    else:
        await asyncio.gather(*(drive_one(i) for i in range(n)))
    cpu_s = (window.cpu_end or time.process_time()) - (window.cpu_start or 0.0)
    for i, sid in enumerate(sids):
        await api.delete(conns[0 if batched else i], sid)
    for conn in conns:
        await api.close(conn)
    if isinstance(api, HttpxAPI):
        await api.aclose()
    return {"latencies": latencies, **counts, "client_cpu_s": cpu_s}


def _load_process(spec: dict[str, Any], barrier: Any, queue: Any) -> None:
    install_uvloop()
    try:
        queue.put(asyncio.run(load(spec, barrier)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def run_http_cell(port: int, server_pid: int, mode: str, client: str, sessions: int, procs: int,
                  warmup_s: float, duration_s: float, seed: int) -> dict[str, Any]:
    """Drive one (mode, client, sessions) cell from ``procs`` forked client processes."""
    ctx = mp.get_context("fork")
    procs = max(1, min(procs, sessions))
    barrier = ctx.Barrier(procs + 1)
    queue = ctx.Queue()
    shares = [sessions // procs + (1 if k < sessions % procs else 0) for k in range(procs)]
    workers = [
        ctx.Process(target=_load_process, daemon=True, args=({
            "port": port, "mode": mode, "client": client, "sessions": share, "seed": seed * 1000 + k,
            "warmup_s": warmup_s, "duration_s": duration_s,
        }, barrier, queue))
        for k, share in enumerate(shares)
    ]
    for w in workers:
        w.start()
    try:
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:  # a client failed while setting up: report its error
            outs = [queue.get(timeout=10)]
            raise RuntimeError(f"{mode}/{client}/{sessions}: client process failed: "
                               f"{outs[0].get('error')}") from None
        time.sleep(warmup_s)
        server_cpu0 = _process_cpu_s(server_pid)
        time.sleep(duration_s)
        server_cpu1 = _process_cpu_s(server_pid)
        outs = [queue.get(timeout=60 + duration_s) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        raise RuntimeError(f"{mode}/{client}/{sessions}: client process failed: {errors[0]}")
    latencies = [x for o in outs for x in o["latencies"]]
    steps = sum(o["steps"] for o in outs)
    return _summary(
        mode, client, sessions, procs, duration_s, steps, latencies,
        resets=sum(o["resets"] for o in outs), requests=sum(o["requests"] for o in outs),
        client_cpu_s=sum(o["client_cpu_s"] for o in outs), server_cpu_s=server_cpu1 - server_cpu0,
    )


def run_inproc_cell(sessions: int, warmup_s: float, duration_s: float, seed: int) -> dict[str, Any]:
    """``env.step`` on ``sessions`` local envs, round-robin, in this process."""
    import agentgym

    rng = random.Random(seed)
    envs = [agentgym.make(ENV_ID) for _ in range(sessions)]
    admissible = [env.reset(seed=rng.randrange(SEED_RANGE))[1]["admissible_actions"] for env in envs]
    window = Window(warmup_s, duration_s)
    latencies: list[float] = []
    steps = resets = 0
    clock = time.perf_counter
    while True:
        for i, env in enumerate(envs):
            action = rng.choice(admissible[i])
            t0 = clock()
            _obs, _reward, terminated, truncated, info = env.step(action)
            t1 = clock()
            if window.start <= t1 < window.end:
                latencies.append(t1 - t0)
                steps += 1
            if terminated or truncated:
                info = env.reset(seed=rng.randrange(SEED_RANGE))[1]
                resets += window.start <= t1 < window.end
            admissible[i] = info["admissible_actions"]
        window.mark_cpu(t1)
        if t1 >= window.end:
            break
    for env in envs:
        env.close()
    cpu_s = (window.cpu_end or time.process_time()) - (window.cpu_start or 0.0)
    return _summary("inproc", "-", sessions, 1, duration_s, steps, latencies, resets=resets, requests=0,
                    client_cpu_s=cpu_s, server_cpu_s=None)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def _summary(mode: str, client: str, sessions: int, procs: int, duration_s: float, steps: int,
             latencies: list[float], *, resets: int, requests: int, client_cpu_s: float,
             server_cpu_s: float | None) -> dict[str, Any]:
    latencies.sort()
    return {
        "mode": mode, "client": client, "sessions": sessions, "client_procs": procs,
        "steps_per_s": steps / duration_s, "p50_ms": _percentile(latencies, 50) * 1e3,
        "p99_ms": _percentile(latencies, 99) * 1e3, "steps": steps, "resets": resets,
        "requests": requests, "requests_per_s": requests / duration_s, "latency_samples": len(latencies),
        "client_cpu_pct": 100 * client_cpu_s / duration_s,
        "server_cpu_pct": None if server_cpu_s is None else 100 * server_cpu_s / duration_s,
        # CPU the server spent per step: robust to other load on the machine, unlike steps/s.
        "server_cpu_us_per_step": None if server_cpu_s is None or not steps else 1e6 * server_cpu_s / steps,
    }


# --- the server process -------------------------------------------------------------------------


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its threads (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
