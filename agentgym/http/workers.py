"""Env-worker processes behind one address: ``WorkerSet`` starts, watches and replaces them.

``agentgym serve --workers N`` runs N worker processes, each a whole env service (``create_app``)
listening on its own Unix socket, and one router (``agentgym.http.router``) on the public address.
A session lives in the process that created it; its public id names that process and the process's
generation (``w1g0-<id>``), so ids of different processes, or of a process and its replacement,
can never collide, and a request always reaches the env it names. When a worker dies (a crash, an
out-of-memory kill, SIGKILL), ``WorkerSet`` starts a replacement at once; the dead worker's sessions
answer ``SessionLost`` (HTTP 410) naming the process and how it died, every other session goes on.
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

from agentgym.errors import ConfigError, RemoteEnvError

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
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    """Keep-alive connections to the worker, free for the next request."""

    @property
    def prefix(self) -> str:
        return f"w{self.index}g{self.generation}-"

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "generation": self.generation, "ready": self.ready,
                "pid": self.process.pid if self.process else None, "sessions": self.sessions}


class WorkerSet:
    """N env-worker processes serving ``create_app(**app_kwargs)`` on Unix sockets; dead ones replaced.

    Args:
        num_workers: how many processes (>= 1).
        app_kwargs: ``create_app`` arguments of every worker (JSON-serialisable), ``max_sessions``
            being the service's total (each worker gets its share).
        start_timeout_s: how long a worker may take to answer its first health check.
    """

    def __init__(self, num_workers: int, app_kwargs: dict[str, Any], *, start_timeout_s: float = 120.0) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"--workers must be a positive integer, got {num_workers!r}")
        self.num_workers = num_workers
        total = int(app_kwargs.get("max_sessions", 1024))
        self.app_kwargs = {**app_kwargs, "max_sessions": max(1, -(-total // num_workers))}
        self.start_timeout_s = start_timeout_s
        self.directory = tempfile.mkdtemp(prefix="agentgym-workers-")
        self.slots: list[Worker] = []
        self.by_prefix: dict[str, Worker] = {}
        self.restarts = 0
        self._monitor: asyncio.Task[None] | None = None
        self._starting: set[asyncio.Task[None]] = set()
        self._stopping = False

    # --- processes ----------------------------------------------------------------------------

    def _spawn(self, index: int, generation: int) -> Worker:
        worker = Worker(index, generation, os.path.join(self.directory, f"w{index}g{generation}.sock"))
        spec = json.dumps({"socket": worker.socket_path, "app": self.app_kwargs})
        worker.process = subprocess.Popen([sys.executable, "-m", "agentgym.http.workers", spec],
                                          # prctl only, no locks taken: safe between fork and exec
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)  # noqa: PLW1509
        self.by_prefix[worker.prefix] = worker
        return worker

    async def _until_ready(self, worker: Worker) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert worker.process is not None
            if worker.process.poll() is not None:
                raise RemoteEnvError(f"env-worker process {worker.index} {how_it_ended(worker.process.returncode)} "
                                     "while starting; run `agentgym serve` without --workers to see why")
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_unix_connection(worker.socket_path)
                writer.write(b"GET /health HTTP/1.1\r\nHost: worker\r\n\r\n")
                head = await reader.readuntil(b"\r\n\r\n")
                writer.close()
                if head.startswith(b"HTTP/1.1 200"):
                    worker.ready = True
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
        for _, writer in worker.idle:
            writer.close()
        worker.idle.clear()

    async def stop(self) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after 10 s) and remove their sockets."""
        self._stopping = True
        for task in [self._monitor, *self._starting]:
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

    def least_loaded(self) -> Worker:
        ready = self.ready()
        if not ready:
            from agentgym.errors import SessionCapacityError

            raise SessionCapacityError("no env-worker process is running (they are restarting); retry in a second")
        return min(ready, key=lambda w: (w.sessions, w.index))

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
            raise SessionLost(f"session {public_id!r} lived in env-worker process {worker.index} (pid "
                              f"{worker.process.pid}), which {reason}; its episode is lost: create a new session")
        return worker, inner


def main(argv: list[str] | None = None) -> None:
    """A worker process: ``python -m agentgym.http.workers '{"socket": PATH, "app": {...}}'``."""
    import uvicorn

    from agentgym.http.server import create_app

    spec = json.loads((argv or sys.argv[1:])[0])
    app = create_app(**spec["app"])
    uvicorn.run(app, uds=spec["socket"], log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
