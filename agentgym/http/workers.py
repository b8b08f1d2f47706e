"""Env-worker processes behind one address: ``WorkerSet`` starts, watches and replaces them.

``agentgym serve --workers N`` runs N worker processes, each a whole env service (``create_app``)
listening on its own Unix socket, and one router (``agentgym.http.router``) on the public address.
A session lives in the process that created it; its public id names that process and the process's
generation (``w1g0-<id>``), so ids of different processes, or of a process and its replacement,
can never collide, and a request always reaches the env it names. When a worker dies (a crash, an
out-of-memory kill, SIGKILL), ``WorkerSet`` starts a replacement at once; the dead worker's sessions
answer ``SessionLost`` (HTTP 410) naming the process and how it died, every other session goes on.

Connections: a worker keeps an idle connection open for ``keep_alive_s``; the router reuses a pooled
connection only while it has been idle for less than half that, so a worker never closes a
connection the router is about to reuse. Liveness: every worker answers a health check each
``heartbeat_s``; one that has answered none for ``silent_after_s`` (a frozen or SIGSTOPped process)
is *unresponsive*: it gets no new sessions, and ``/health`` reports it, until it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigError, RemoteEnvError, SessionCapacityError
from agentgym.service_kit.launcher import python_command

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the worker gets SIGTERM when the router dies, so no worker outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def how_it_ended(returncode: int | None) -> str:
    """``"exited with code 3"`` or ``"was killed by SIGKILL"``.

    Example:
        >>> how_it_ended(-9), how_it_ended(1)
        ('was killed by SIGKILL', 'exited with code 1')
    """
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


@dataclass(eq=False)
class Worker:
    """One env-worker process (one generation of worker slot ``index``)."""

    index: int
    generation: int
    socket_path: str
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    sessions: int = 0
    """Sessions the router placed here (kept in step with the worker's own count by the monitor)."""
    died: str | None = None
    """How the process ended, once it has."""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = field(default_factory=list)
    """Keep-alive connections to the worker, free for the next request, oldest first, each with the
    ``time.monotonic()`` at which it went idle."""
    last_answer: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` of the last health check the process answered (at first: when it started)."""

    @property
    def prefix(self) -> str:
        return f"w{self.index}g{self.generation}-"

    def silent_s(self) -> float:
        """Seconds since the process last answered a health check."""
        return time.monotonic() - self.last_answer

    def describe(self, silent_after_s: float) -> dict[str, Any]:
        return {"index": self.index, "generation": self.generation, "ready": self.ready,
                "responding": self.silent_s() <= silent_after_s, "silent_s": round(self.silent_s(), 1),
                "pid": self.process.pid if self.process else None, "sessions": self.sessions}


class WorkerSet:
    """N env-worker processes serving ``create_app(**app_kwargs)`` on Unix sockets; dead ones replaced.

    Args:
        num_workers: how many processes (>= 1).
        app_kwargs: ``create_app`` arguments of every worker (JSON-serialisable), ``max_sessions``
            being the service's total (each worker gets its share).
        start_timeout_s: how long a worker may take to answer its first health check.
        keep_alive_s: how long a worker keeps an idle connection open; the router reuses one only
            within half of it (``reuse_within_s``).
        heartbeat_s: how often every worker is sent a health check.
        silent_after_s: a worker that has answered no health check for this long is unresponsive
            (frozen, stopped or starved): it gets no new sessions, and creates waiting on it go to
            another worker, until it answers again.

    Raises:
        ConfigError: a count or duration is out of range.
    """

    def __init__(self, num_workers: int, app_kwargs: dict[str, Any], *, start_timeout_s: float = 120.0,
                 keep_alive_s: float = 60.0, heartbeat_s: float = 1.0, silent_after_s: float = 5.0) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"--workers must be a positive integer, got {num_workers!r}")
        for name, value in (("keep_alive_s", keep_alive_s), ("heartbeat_s", heartbeat_s),
                            ("silent_after_s", silent_after_s)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
        if silent_after_s <= heartbeat_s:
            raise ConfigError(f"silent_after_s ({silent_after_s:g}) must be longer than heartbeat_s "
                              f"({heartbeat_s:g}), or every worker would count as unresponsive between "
                              "checks")
        self.num_workers = num_workers
        total = int(app_kwargs.get("max_sessions", 1024))
        self.app_kwargs = {**app_kwargs, "max_sessions": max(1, -(-total // num_workers))}
        self.start_timeout_s = start_timeout_s
        self.keep_alive_s = keep_alive_s
        self.heartbeat_s = heartbeat_s
        self.silent_after_s = silent_after_s
        self.directory = tempfile.mkdtemp(prefix="agentgym-workers-")
        self.slots: list[Worker] = []
        self.by_prefix: dict[str, Worker] = {}
        self.restarts = 0
        self._monitor: asyncio.Task[None] | None = None
        self._starting: set[asyncio.Task[None]] = set()
        self._heartbeats: set[asyncio.Task[None]] = set()
        self._stopping = False

    @property
    def reuse_within_s(self) -> float:
        """A pooled connection idle longer than this is closed, not reused: half the workers'
        keep-alive, so the router always drops a connection long before the worker would."""
        return self.keep_alive_s / 2

    # --- processes ----------------------------------------------------------------------------

    def _spawn(self, index: int, generation: int) -> Worker:
        worker = Worker(index, generation, os.path.join(self.directory, f"w{index}g{generation}.sock"))
        spec = json.dumps({"socket": worker.socket_path, "app": self.app_kwargs,
                           "keep_alive_s": self.keep_alive_s})
        worker.process = subprocess.Popen(python_command("-m", "agentgym.http.workers", spec),
                                          # prctl only, no locks taken: safe between fork and exec
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)  # noqa: PLW1509
        self.by_prefix[worker.prefix] = worker
        return worker

    async def _until_ready(self, worker: Worker) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert worker.process is not None
            if worker.process.poll() is not None:
                raise RemoteEnvError(f"env-worker process {worker.index} "
                                     f"{how_it_ended(worker.process.returncode)} while starting; "
                                     "run `agentgym serve` without --workers to see why")
            # A process stopped while starting answers nothing: every wait ends by the deadline.
            with contextlib.suppress(OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                reader, writer = await asyncio.open_unix_connection(worker.socket_path)
                writer.write(b"GET /health HTTP/1.1\r\nHost: worker\r\n\r\n")
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                                  max(0.1, deadline - time.monotonic()))
                finally:
                    writer.close()
                if head.startswith(b"HTTP/1.1 200"):
                    worker.last_answer = time.monotonic()
                    worker.ready = True
                    self._beat(worker)
                    return
            if time.monotonic() > deadline:
                raise RemoteEnvError(f"env-worker process {worker.index} did not answer within "
                                     f"{self.start_timeout_s:g} s")
            await asyncio.sleep(0.05)

    async def start(self) -> None:
        """Start every worker and wait until all answer; then watch them."""
        self.slots = [self._spawn(i, 0) for i in range(self.num_workers)]
        try:
            await asyncio.gather(*(self._until_ready(w) for w in self.slots))
        except BaseException:
            await self.stop()
            raise
        self._monitor = asyncio.get_running_loop().create_task(self._watch())

    def _beat(self, worker: Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._heartbeat(worker))
        self._heartbeats.add(task)
        task.add_done_callback(self._heartbeats.discard)

    async def _heartbeat(self, worker: Worker) -> None:
        """Health-check ``worker`` every ``heartbeat_s`` until its process ends."""
        assert worker.process is not None
        while not self._stopping and worker.process.poll() is None:
            began = time.monotonic()
            if await self._answers(worker):
                worker.last_answer = time.monotonic()
            await asyncio.sleep(max(0.0, self.heartbeat_s - (time.monotonic() - began)))

    async def _answers(self, worker: Worker) -> bool:
        """Whether the worker answers a health check (any status) within ``silent_after_s``."""
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(worker.socket_path),
                                                    self.silent_after_s)
            writer.write(b"GET /health HTTP/1.1\r\nhost: worker\r\nconnection: close\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.silent_after_s)
            return head.startswith(b"HTTP/1.1 ")
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return False
        finally:
            if writer is not None:
                writer.close()

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.1)
            for worker in list(self.slots):
                assert worker.process is not None
                if worker.process.poll() is None or self._stopping:
                    continue
                worker.ready = False
                worker.died = how_it_ended(worker.process.returncode)
                self._close_connections(worker)
                with contextlib.suppress(OSError):
                    os.unlink(worker.socket_path)
                replacement = self._spawn(worker.index, worker.generation + 1)
                self.slots[worker.index] = replacement
                self.restarts += 1
                self._starting.add(asyncio.get_running_loop().create_task(self._start_quietly(replacement)))

    async def _start_quietly(self, worker: Worker) -> None:
        """Wait for a replacement; one that fails to start is replaced again by the monitor."""
        with contextlib.suppress(RemoteEnvError):
            await self._until_ready(worker)

    @staticmethod
    def _close_connections(worker: Worker) -> None:
        for _, writer, _ in worker.idle:
            writer.close()
        worker.idle.clear()

    async def stop(self) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after 10 s) and remove their sockets."""
        self._stopping = True
        for task in [self._monitor, *self._starting, *self._heartbeats]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for worker in self.slots:
            self._close_connections(worker)
            if worker.process is not None and worker.process.poll() is None:
                worker.process.terminate()
        for worker in self.slots:
            if worker.process is None:
                continue
            try:
                await asyncio.get_running_loop().run_in_executor(None, worker.process.wait, 10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- lookup -------------------------------------------------------------------------------

    def ready(self) -> list[Worker]:
        return [w for w in self.slots if w.ready]

    def responding(self, worker: Worker) -> bool:
        """Whether ``worker`` answered a health check within the last ``silent_after_s``."""
        return worker.silent_s() <= self.silent_after_s

    def least_loaded(self, excluding: set[Worker] | frozenset[Worker] = frozenset()) -> Worker:
        """The ready, responding worker with the fewest sessions, ``excluding`` aside.

        Raises:
            SessionCapacityError: no such worker (every one is restarting, unresponsive or excluded).
        """
        ready = [w for w in self.ready() if w not in excluding]
        if not ready:
            raise SessionCapacityError("no env-worker process is running (they are restarting); "
                                       "retry in a second")
        responding = [w for w in ready if self.responding(w)]
        if not responding:
            silent = ", ".join(f"{w.index} (pid {w.process.pid if w.process else None}) for "
                               f"{w.silent_s():.0f} s" for w in ready)
            raise SessionCapacityError("every env-worker process has stopped answering "
                                       f"(frozen or overloaded: {silent}); retry later")
        return min(responding, key=lambda w: (w.sessions, w.index))

    def owner(self, public_id: str) -> tuple[Worker, str]:
        """The worker holding a public session id, and the worker's own id for it.

        Raises:
            SessionLost: the id names a worker generation that died.
            UnknownSession: the id names no worker of this service.
        """
        from agentgym.errors import SessionLost, UnknownSession

        prefix, dash, inner = public_id.partition("-")
        worker = self.by_prefix.get(prefix + dash) if dash else None
        if worker is None:
            raise UnknownSession(f"no live session {public_id!r}: this service's session ids start with "
                                 "w<worker>g<generation>-; create one with POST /sessions")
        if worker.died is not None or not worker.ready:
            assert worker.process is not None
            reason = worker.died or "is restarting"
            raise SessionLost(f"session {public_id!r} lived in env-worker process {worker.index} "
                              f"(pid {worker.process.pid}), which {reason}; its episode is lost: "
                              "create a new session")
        return worker, inner


def main(argv: list[str] | None = None) -> None:
    """A worker process: ``python -m agentgym.http.workers '{"socket": PATH, "app": {...}}'``."""
    import uvicorn

    from agentgym.http.server import create_app

    spec = json.loads((argv or sys.argv[1:])[0])
    app = create_app(**spec["app"])
    uvicorn.run(app, uds=spec["socket"], log_level="warning", access_log=False,
                timeout_keep_alive=spec["keep_alive_s"])


if __name__ == "__main__":
    main()
