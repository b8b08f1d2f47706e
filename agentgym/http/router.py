"""``WorkerRouter``: the public face of ``agentgym serve --workers N`` (an ASGI app).

Every request is passed to the env-worker process that holds its session (``agentgym.http.workers``)
over a keep-alive HTTP/1.1 connection on that worker's Unix socket; the answer comes back as the
worker gave it, with the worker's session ids turned into public ones. ``POST /sessions`` goes to
the worker with the fewest sessions; a batch (``/batch/step|reset|fork``) is split by worker, the
parts run at once, and the answers come back merged in the request's order. ``GET /health`` sums
the workers' sessions and lists the workers; ``GET /metrics`` is every worker's, labelled
``worker="<index>"``. Routes the router does not know (``/envs``, ``/docs``...) go to any worker.

Bounded waits on a frozen worker (one that stops answering while its process lives, e.g. SIGSTOP):
``/health`` and ``/metrics`` ask every worker at once and wait ``health_timeout_s`` at most; a
worker that does not answer is listed with ``"responding": false`` and the status is ``degraded``
(``unavailable``, HTTP 503, when no worker answers). ``POST /sessions`` goes to responding workers
only; a create already waiting on a worker that then stays silent for ``silent_after_s`` goes to
another worker, and the session the silent one may still create is deleted when it answers. A step
or reset on a frozen worker's session waits up to ``timeout_s`` (504): it may have run, so it is
never sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import Any

import agentgym
from agentgym.errors import AgentGymError, RemoteEnvError, RemoteTimeout, SessionCapacityError, SessionLost
from agentgym.http.workers import Worker, WorkerSet
from agentgym.service_kit.responses import dumps, error_payload

_BATCH_KEYS = {"/batch/step": "steps", "/batch/reset": "resets", "/batch/fork": "forks"}
_DROPPED = {b"content-length", b"transfer-encoding", b"connection", b"keep-alive", b"date", b"server"}
_FORWARDED = {b"content-type", b"authorization", b"accept"}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?( .*)$")


class WorkerGone(Exception):
    """Internal: the connection to a worker broke (it died while handling the request)."""


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


async def _read_response(reader: asyncio.StreamReader) -> tuple[Answer, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = []
    length = None
    chunked, keep = False, True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            keep = value.lower() != b"close"
        if name not in _DROPPED:
            headers.append((name, value))
    if chunked:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(p[:-2] for p in parts)
    else:
        body = await reader.readexactly(length or 0)
    return (status, headers, body), keep


class WorkerRouter:
    """The ASGI app of ``agentgym serve --workers N``; starts and stops its ``WorkerSet`` with its lifespan.

    Args:
        workers: the worker processes (not started yet).
        max_body_bytes: larger request bodies get 413 here, before any worker sees them.
        timeout_s: longest wait for a worker's answer (a frozen process answers nothing; the
            workers' own step timeout answers a slow env long before). Past it: 504.
        health_timeout_s: longest wait for a worker's ``/health`` or ``/metrics`` answer; a worker
            that does not answer within it is reported as not responding.
    """

    def __init__(self, workers: WorkerSet, *, max_body_bytes: int = 8 * 1024 * 1024,
                 timeout_s: float = 300.0, health_timeout_s: float = 2.0) -> None:
        self.workers = workers
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.health_timeout_s = health_timeout_s
        self._withdrawn: set[asyncio.Task[None]] = set()

    # --- talking to one worker ----------------------------------------------------------------

    def _pooled(self, worker: Worker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A pooled connection safe to reuse, or ``None``.

        The worker closes a connection idle for ``keep_alive_s``; reusing one it has closed (or is
        closing at that moment) would fail the request although the worker is fine. So connections
        idle for ``reuse_within_s`` (half of it) are closed here first, and so is any the worker has
        closed anyway.
        """
        cutoff = time.monotonic() - self.workers.reuse_within_s
        while worker.idle and worker.idle[0][2] < cutoff:  # oldest first
            worker.idle.pop(0)[1].close()
        while worker.idle:
            reader, writer, _ = worker.idle.pop()
            if not (reader.at_eof() or writer.is_closing()):
                return reader, writer
            writer.close()
        return None

    async def forward(self, worker: Worker, method: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: bytes, *, timeout_s: float | None = None) -> Answer:
        """Send one request to ``worker`` and return its answer (status, headers, body).

        Args:
            timeout_s: longest wait for the answer (default: the router's ``timeout_s``).

        Raises:
            WorkerGone: the connection broke (the process died, or was killed while handling it).
            RemoteTimeout: no answer within the timeout.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            reader, writer = self._pooled(worker) or await asyncio.open_unix_connection(
                worker.socket_path, limit=2**24)
        except OSError as exc:
            raise WorkerGone(str(exc)) from exc
        request = [f"{method} {target} HTTP/1.1\r\nhost: worker\r\ncontent-length: {len(body)}\r\n".encode()]
        request += [name + b": " + value + b"\r\n" for name, value in headers if name in _FORWARDED]
        try:
            writer.write(b"".join(request) + b"\r\n" + body)
            answer, keep = await asyncio.wait_for(self._exchange(reader, writer), timeout_s)
        except asyncio.TimeoutError:
            writer.close()
            assert worker.process is not None
            raise RemoteTimeout(f"env-worker process {worker.index} (pid {worker.process.pid}) did not "
                                f"answer {method} {target.split('?')[0]} within {timeout_s:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            writer.close()
            raise WorkerGone(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:  # cancelled mid-exchange: the connection's state is unknown
            writer.close()
            raise
        if keep and worker.ready:
            worker.idle.append((reader, writer, time.monotonic()))
        else:
            writer.close()
        return answer

    @staticmethod
    async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[Answer, bool]:
        await writer.drain()
        return await _read_response(reader)

    # --- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1011})  # WebSockets: serve without --workers
            return
        body = await self._body(scope, receive, send)
        if body is None:
            return
        try:
            answer = await self._route(scope, body)
        except AgentGymError as exc:
            answer = _error(exc)
        status, headers, payload = answer
        headers = [*headers, (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.workers.start()
                except Exception as exc:  # noqa: BLE001 - reported to uvicorn, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in list(self._withdrawn):
                    task.cancel()
                await self.workers.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _body(self, scope: dict[str, Any], receive: Any, send: Any) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                status, headers, payload = _error_body(
                    413, "RequestRejected", f"request body exceeds the limit of {self.max_body_bytes} bytes")
                await send({"type": "http.response.start", "status": status,
                            "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
                await send({"type": "http.response.body", "body": payload})
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # --- routing ------------------------------------------------------------------------------

    async def _route(self, scope: dict[str, Any], body: bytes) -> Answer:
        method, path = scope["method"], scope["path"]
        headers = scope["headers"]
        target = path + (("?" + scope["query_string"].decode("latin-1")) if scope.get("query_string") else "")
        if path == "/health" and method == "GET":
            return await self._health(headers)
        if path == "/metrics" and method == "GET":
            return await self._metrics(headers)
        if path == "/sessions" and method == "POST":
            return await self._create(target, headers, body)
        if path.startswith("/sessions/"):
            public_id, _, verb = path[len("/sessions/"):].partition("/")
            worker, inner = self.workers.owner(public_id)
            answer = await self._send(worker, public_id, method,
                                      f"/sessions/{inner}" + target[len("/sessions/") + len(public_id):],
                                      headers, body)
            status = answer[0]
            if status == 204 and method == "DELETE":
                worker.sessions = max(0, worker.sessions - 1)
            if status in (200, 201) and (verb == "fork" or (not verb and method == "GET")):
                worker.sessions += verb == "fork"
                return _with_public_id(answer, worker)
            return answer if status < 400 else _public_error(answer, inner, public_id)
        if path in _BATCH_KEYS and method == "POST":
            return await self._batch(path, headers, body)
        return await self._send(self.workers.least_loaded(), None, method, target, headers, body)

    async def _create(self, target: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        """``POST /sessions`` on the least loaded responding worker; on another one when that one died
        or went silent before answering."""
        tried: set[Worker] = set()
        while len(tried) < self.workers.num_workers:
            try:
                worker = self.workers.least_loaded(excluding=tried)
            except SessionCapacityError:
                if not tried:
                    raise
                break
            tried.add(worker)
            pending = asyncio.ensure_future(self.forward(worker, "POST", target, headers, body))
            try:
                answer = await self._unless_silent(worker, pending)
            except WorkerGone:
                self._check_alive(worker)
                continue
            except asyncio.CancelledError:
                self._withdraw(worker, pending, headers)
                raise
            if answer is None:  # the worker went silent: its late session, if any, is deleted
                self._withdraw(worker, pending, headers)
                continue
            if answer[0] == 201:
                worker.sessions += 1
                return _with_public_id(answer, worker)
            return answer
        raise SessionCapacityError("every env-worker process failed to create the session (they are "
                                   "restarting or not answering); retry in a second")

    async def _unless_silent(self, worker: Worker, pending: asyncio.Future[Answer]) -> Answer | None:
        """``pending``'s answer, or ``None`` once ``worker`` has answered no health check for
        ``silent_after_s``."""
        while True:
            left = self.workers.silent_after_s - worker.silent_s()
            done, _ = await asyncio.wait({pending}, timeout=max(left, 0.0) + 0.05)
            if done:
                return pending.result()
            if not self.workers.responding(worker):
                return None

    def _withdraw(self, worker: Worker, pending: asyncio.Future[Answer],
                  headers: list[tuple[bytes, bytes]]) -> None:
        """Let a create nobody waits for finish in the background, and delete the session it makes."""
        async def delete_late_session() -> None:
            with contextlib.suppress(WorkerGone, RemoteTimeout):
                status, _, payload = await pending
                if status == 201:
                    inner = json.loads(payload)["session_id"]
                    await self.forward(worker, "DELETE", f"/sessions/{inner}", headers, b"")

        task = asyncio.get_running_loop().create_task(delete_late_session())
        self._withdrawn.add(task)
        task.add_done_callback(self._withdrawn.discard)

    async def _send(self, worker: Worker, public_id: str | None, method: str, target: str,
                    headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        try:
            return await self.forward(worker, method, target, headers, body)
        except WorkerGone as exc:
            self._check_alive(worker)
            if method == "GET" and worker.ready:  # reads change nothing: one more try on a new connection
                with contextlib.suppress(WorkerGone):
                    return await self.forward(worker, method, target, headers, body)
                self._check_alive(worker)
            assert worker.process is not None
            where = f"env-worker process {worker.index} (pid {worker.process.pid})"
            if public_id is None:
                raise RemoteEnvError(f"{where} failed while handling {method} {target}: {exc}; "
                                     "retry") from None
            raise SessionLost(f"session {public_id!r} lived in {where}, which died while handling {method} "
                              f"{target.split('?')[0]}; its episode is lost: create a new session") from None

    @staticmethod
    def _check_alive(worker: Worker) -> None:
        """A worker whose connection broke and whose process has ended takes no more requests."""
        if worker.process is not None and worker.process.poll() is not None:
            worker.ready = False

    async def _batch(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        key = _BATCH_KEYS[path]
        try:
            items = json.loads(body)[key]
            ids = [item["session_id"] for item in items]
            if not all(isinstance(i, str) for i in ids):
                raise TypeError
        except (ValueError, KeyError, TypeError):  # let a worker give the exact 422 for this body
            return await self._send(self.workers.least_loaded(), None, "POST", path, headers, body)
        results: list[Any] = [None] * len(items)
        parts: dict[Worker, list[int]] = {}
        for index, public_id in enumerate(ids):
            try:
                worker, inner = self.workers.owner(public_id)
            except AgentGymError as exc:
                results[index] = error_payload(type(exc).__name__, str(exc))
                continue
            items[index] = {**items[index], "session_id": inner}
            parts.setdefault(worker, []).append(index)

        async def run(worker: Worker, indices: list[int]) -> None:
            part = dumps({key: [items[i] for i in indices]})
            try:
                status, _, payload = await self.forward(worker, "POST", path, headers, part)
            except WorkerGone:
                self._check_alive(worker)
                for i in indices:
                    results[i] = _lost(worker, ids[i], path)
                return
            except RemoteTimeout as exc:  # a frozen worker fails its own items only
                for i in indices:
                    results[i] = error_payload("RemoteTimeout", f"session {ids[i]!r}: {exc}")
                return
            if status != 200:
                raise _Rejected((status, [(b"content-type", b"application/json")], payload))
            for i, result in zip(indices, json.loads(payload)["results"], strict=True):
                if key == "forks" and isinstance(result, dict) and "session_id" in result:
                    worker.sessions += 1
                    result["session_id"] = worker.prefix + result["session_id"]
                elif isinstance(result, dict) and isinstance(result.get("error"), dict):
                    error = result["error"]
                    error["message"] = str(error.get("message", "")).replace(items[i]["session_id"], ids[i])
                results[i] = result

        try:
            await asyncio.gather(*(run(w, idx) for w, idx in parts.items()))
        except _Rejected as rejected:
            return rejected.answer
        return 200, [(b"content-type", b"application/json")], dumps({"results": results})

    async def _ask_all(self, target: str,
                       headers: list[tuple[bytes, bytes]]) -> list[tuple[Worker, Answer | None]]:
        """``GET target`` of every ready, responding worker at once, each bounded by ``health_timeout_s``;
        ``None`` for a worker that broke the connection or did not answer in time."""
        async def ask(worker: Worker) -> Answer | None:
            if not (worker.ready and self.workers.responding(worker)):
                return None
            try:
                return await self.forward(worker, "GET", target, headers, b"",
                                          timeout_s=self.health_timeout_s)
            except (WorkerGone, RemoteTimeout):
                return None

        slots = list(self.workers.slots)
        return list(zip(slots, await asyncio.gather(*(ask(w) for w in slots)), strict=True))

    async def _health(self, headers: list[tuple[bytes, bytes]]) -> Answer:
        active, listed, statuses = 0, [], []
        for worker, answer in await self._ask_all("/health", headers):
            described = worker.describe(self.workers.silent_after_s)
            if answer is not None and answer[0] in (200, 503):
                health = json.loads(answer[2])
                worker.sessions = health["active_sessions"]
                statuses.append(health["status"])
            else:  # restarting, silent for a while, or silent within health_timeout_s just now
                described["responding"] = False
                statuses.append("unavailable")
            active += worker.sessions
            listed.append(described)
        if all(s == "ok" for s in statuses):
            status = "ok"
        else:
            status = "unavailable" if all(s == "unavailable" for s in statuses) else "degraded"
        served = self.workers.app_kwargs.get("env_ids") or [s.id for s in agentgym.list_envs()]
        return 503 if status == "unavailable" else 200, [(b"content-type", b"application/json")], dumps({
            "status": status, "version": agentgym.__version__, "active_sessions": active,
            "max_sessions": self.workers.app_kwargs["max_sessions"] * self.workers.num_workers,
            "envs": served,
            "workers": listed, "worker_restarts": self.workers.restarts,
        })

    async def _metrics(self, headers: list[tuple[bytes, bytes]]) -> Answer:
        lines: list[str] = []
        seen: set[str] = set()
        for worker, answer in await self._ask_all("/metrics", headers):
            if answer is None:
                continue
            status, _, payload = answer
            if status != 200:
                return status, [(b"content-type", b"application/json")], payload
            for line in payload.decode().splitlines():
                if line.startswith("#"):
                    if line not in seen:
                        seen.add(line)
                        lines.append(line)
                    continue
                match = _SAMPLE.match(line)
                if match:
                    name, labels, rest = match.groups()
                    inner = f'worker="{worker.index}"' + (("," + labels[1:-1]) if labels and labels != "{}"
                                                          else "")
                    lines.append(f"{name}{{{inner}}}{rest}")
        return (200, [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")],
                ("\n".join(lines) + "\n").encode())


class _Rejected(Exception):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer


def _lost(worker: Worker, public_id: str, path: str) -> dict[str, Any]:
    assert worker.process is not None
    return error_payload("SessionLost", f"session {public_id!r} lived in env-worker process {worker.index} "
                         f"(pid {worker.process.pid}), which died while handling {path}; "
                         "its episode is lost")


def _with_public_id(answer: Answer, worker: Worker) -> Answer:
    status, headers, payload = answer
    info = json.loads(payload)
    info["session_id"] = worker.prefix + info["session_id"]
    return status, headers, dumps(info)


def _public_error(answer: Answer, inner: str, public_id: str) -> Answer:
    status, headers, payload = answer
    return status, headers, payload.replace(inner.encode(), public_id.encode())


def _error_body(status: int, kind: str, message: str) -> Answer:
    headers = [(b"content-type", b"application/json")]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    return status, headers, dumps(error_payload(kind, message))


def _error(exc: AgentGymError) -> Answer:
    return _error_body(exc.http_status, type(exc).__name__, str(exc))
