"""Throughput and latency of the env service (``agentgym serve``) on ``maze-v0``.

    python benchmarks/env_server.py [--sessions 1 16 64] [--duration-s 5] [--out benchmarks/results/env_server.json]

For each number of concurrent sessions it measures steps/s and p50/p99 latency of

* ``single``: one step per HTTP request (``POST /sessions/{id}/step``), one keep-alive connection
  per session, every session stepping as fast as its answers come back;
* ``batch``: every session's step in one ``POST /batch/step`` (steps/s counts items; latency is
  per batch request);
* ``inproc``: ``agentgym.make("maze-v0").step`` in this process, for reference.

HTTP modes run twice: with ``raw``, a minimal asyncio HTTP/1.1 client (hand-built request bytes,
Content-Length framing, keep-alive) that costs a few tens of microseconds per request, so the
numbers measure the server; and with ``httpx`` (``agentgym.http.client.AsyncEnvClient``), what a
user's client gets (httpx's API over ``agentgym.http.transport.LeanAsyncTransport``: about a
hundred microseconds of client CPU per request, where httpx's own transport spent ~1 ms). The server is a separate process (``python -m agentgym serve``), so it does not share
a GIL with the load generator -- but it does share the machine's cores, which the output states.

Actions are drawn with a seeded RNG from ``info["admissible_actions"]``. An episode ends when the
goal is reached or after 50 turns; its session is then reset (``/reset`` or ``/batch/reset``).
Resets are not counted as steps and their latency is not sampled, but their time is inside the
measured window, so steps/s is net of reset traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentgym.http.launcher import free_port, start_service, stop_service

HOST = "127.0.0.1"
ENV_ID = "maze-v0"
RESULTS = Path(__file__).resolve().parent / "results"
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
        self.writer.write(b"DELETE " + path.encode() + b" HTTP/1.1\r\n" + self._host_line + b"Content-Length: 0\r\n\r\n")
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


def _install_uvloop() -> bool:
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


async def _load(spec: dict[str, Any], barrier: Any) -> dict[str, Any]:
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
        admissible.append((await api.reset(conn, sid, rng.randrange(SEED_RANGE)))["info"]["admissible_actions"])
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
            results = await api.batch_step(conn, [(sid, rng.choice(acts)) for sid, acts in zip(sids, admissible)])
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
                for i, result in zip(done, reset):
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
    _install_uvloop()
    try:
        queue.put(asyncio.run(_load(spec, barrier)))
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
            raise RuntimeError(f"{mode}/{client}/{sessions}: client process failed: {outs[0].get('error')}") from None
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


def server_command(port: int, max_sessions: int, workers: int | None, custom: str | None) -> list[str]:
    if custom:  # A/B runs of a modified server: a command line with {port} and {python} in it
        return shlex.split(custom.format(port=port, python=sys.executable))
    command = [sys.executable, "-m", "agentgym", "serve", ENV_ID, "--host", HOST, "--port", str(port),
               "--max-sessions", str(max_sessions), "--log-level", "warning"]
    if workers is not None:
        command += ["--threads", str(workers)]
    return command


def start_server(command: list[str], port: int) -> subprocess.Popen[bytes]:
    """``command`` started, and healthy at ``http://HOST:port``; stop it with ``stop_server``."""
    return start_service(command, f"http://{HOST}:{port}")


stop_server = stop_service


# --- output -------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 1 else f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    header = "| mode | client | sessions | steps/s | p50 ms | p99 ms | server CPU % | client CPU % | server CPU µs/step |"
    lines = [header,
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        client = r["client"] + (f" x{r['client_procs']}" if r["client_procs"] > 1 else "")
        server = "-" if r["server_cpu_pct"] is None else f"{r['server_cpu_pct']:.0f}"
        per_step = "-" if r["server_cpu_us_per_step"] is None else f"{r['server_cpu_us_per_step']:.0f}"
        lines.append(
            f"| {r['mode']} | {client} | {r['sessions']} | {r['steps_per_s']:,.0f} | {_ms(r['p50_ms'])} | "
            f"{_ms(r['p99_ms'])} | {server} | {r['client_cpu_pct']:.0f} | {per_step} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = r["mode"] if r["mode"] == "inproc" else f"{r['mode']} / {r['client']}"
        series.setdefault(label, []).append((r["sessions"], r["steps_per_s"]))
    for label, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.axhline(20_000, color="grey", ls="--", lw=0.8)
    ax.axhline(2_500, color="grey", ls=":", lw=0.8)
    ax.text(1, 20_000, " target: batch", va="bottom", fontsize=8, color="grey")
    ax.text(1, 2_500, " target: single @64", va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["sessions"] for r in rows}), [str(n) for n in sorted({r["sessions"] for r in rows})])
    ax.set_yscale("log")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("steps/s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main ---------------------------------------------------------------------------------------


#: Client CPU (% of one core) above which a raw single-step cell is repeated from two client
#: processes: the client, not the server, may then be the limit.
CLIENT_SATURATED_PCT = 80.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64], help="concurrent sessions per cell")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each cell")
    parser.add_argument("--modes", nargs="+", default=["single", "batch", "inproc"],
                        choices=["single", "batch", "inproc"])
    parser.add_argument("--clients", nargs="+", default=["raw", "httpx"], choices=["raw", "httpx"])
    parser.add_argument("--raw-procs", default="auto",
                        help="client processes for the raw client in single mode: a number, or auto (1; the cell "
                             f"is repeated with 2 when the client used over {CLIENT_SATURATED_PCT:g}%% of a core)")
    parser.add_argument("--server-workers", type=int, default=None,
                        help="--threads of the served app (threads running env code); default: the server's")
    parser.add_argument("--server-cmd", default=None,
                        help="serve with this command instead (A/B runs of a modified server); {port} and "
                             "{python} are filled in, e.g. '{python} my_server.py --port {port}'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "env_server.json", help="JSON results; the PNG goes beside it")
    parser.add_argument("--note", default="", help="free text stored with the results (e.g. 'measured under load')")
    parser.add_argument("--scale", nargs="+", default=None, metavar="SECTION",
                        help="run the scale sections instead (benchmarks/env_scale.py): collector, workers, fleet, "
                             "ws, clients; results go to results/env_scale.json")
    parser.add_argument("--episodes", type=int, nargs="+", default=[16, 64, 256],
                        help="--scale collector: episodes per collection")
    parser.add_argument("--heavy-envs", nargs="+", default=["alfworld-v0", "textworld-v0"],
                        help="--scale workers: the envs served with --workers 1 and 2")
    args = parser.parse_args(argv)
    if args.scale:
        from env_scale import run_scale

        return run_scale(args.scale, episodes=args.episodes, duration_s=args.duration_s,
                         out=RESULTS / "env_scale.json", heavy_envs=args.heavy_envs)

    import agentgym

    cores = os.cpu_count() or 1
    uvloop_ok = _install_uvloop()
    asyncio.set_event_loop_policy(None)  # the parent runs no loop; forked clients install their own
    shared = (f"client and server share this machine's {cores} CPU cores" if cores <= 4
              else f"{cores} CPU cores")
    print(f"agentgym {agentgym.__version__}, Python {platform.python_version()}, {shared}; "
          f"load average at start {os.getloadavg()[0]:.2f}; client loop: {'uvloop' if uvloop_ok else 'asyncio'}",
          flush=True)

    started = time.monotonic()
    load_start = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    http_modes = [m for m in args.modes if m != "inproc"]
    if http_modes:
        port = free_port()
        command = server_command(port, 512, args.server_workers, args.server_cmd)
        server = start_server(command, port)
        try:
            for mode in http_modes:
                for client in args.clients:
                    for n in args.sessions:
                        tries = [1]
                        if client == "raw" and mode == "single":
                            tries = [1, 2] if args.raw_procs == "auto" else [int(args.raw_procs)]
                        for procs in tries:
                            if procs > 1 and args.raw_procs == "auto" and (
                                    n < 2 or rows[-1]["client_cpu_pct"] < CLIENT_SATURATED_PCT):
                                break
                            row = run_http_cell(port, server.pid, mode, client, n, procs,
                                                args.warmup_s, args.duration_s, args.seed)
                            rows.append(row)
                            print(f"  {mode:6} {client:5} x{row['client_procs']} sessions={n:<3} "
                                  f"{row['steps_per_s']:>9,.0f} steps/s  p50 {row['p50_ms']:.3f} ms  "
                                  f"p99 {row['p99_ms']:.3f} ms  server CPU {row['server_cpu_pct']:.0f}%  "
                                  f"client CPU {row['client_cpu_pct']:.0f}%  "
                                  f"server {row['server_cpu_us_per_step'] or 0:.0f} µs CPU/step", flush=True)
        finally:
            stop_server(server)
    if "inproc" in args.modes:
        for n in args.sessions:
            row = run_inproc_cell(n, args.warmup_s, args.duration_s, args.seed)
            rows.append(row)
            print(f"  inproc        sessions={n:<3} {row['steps_per_s']:>9,.0f} steps/s  "
                  f"p50 {row['p50_ms']:.4f} ms  p99 {row['p99_ms']:.4f} ms", flush=True)

    load_end = os.getloadavg()[0]
    meta = {
        "env_id": ENV_ID, "agentgym_version": agentgym.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpu_cores": cores, "client_loop": "uvloop" if uvloop_ok else "asyncio",
        "server_command": " ".join(server_command(0, 512, args.server_workers, args.server_cmd)).replace(
            "--port 0", "--port <free>") if http_modes else None,
        "duration_s": args.duration_s, "warmup_s": args.warmup_s, "seed": args.seed,
        "load_average_start": load_start, "load_average_end": load_end, "wall_s": time.monotonic() - started,
        "note": args.note,
        "notes": [
            f"client and server processes share the same {cores} CPU cores" if cores <= 4 else f"{cores} cores",
            "steps/s counts steps only; resets (on terminated/truncated) are extra requests inside the window",
            "batch: latency is per /batch/step request carrying every session's step",
            "raw: minimal asyncio HTTP/1.1 client; httpx: agentgym.http.client.AsyncEnvClient",
            "client_procs > 1: the load came from that many forked processes; latency samples merged",
        ],
    }
    table = markdown_table(rows)
    print()
    print(f"maze-v0 env service, {shared}" + (f" ({args.note})" if args.note else ""))
    print()
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    png = args.out.with_suffix(".png")
    plot(rows, png, f"agentgym serve {ENV_ID}: steps/s ({shared})" + (f"\n{args.note}" if args.note else ""))
    print(f"\nwrote {args.out} and {png} in {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
