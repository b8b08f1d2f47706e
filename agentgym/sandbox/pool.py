"""``WarmPool``: sandboxed workers spawned ahead of time, each used for one run and then discarded."""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING

from agentgym.errors import ConfigError
from agentgym.sandbox.backends import Backend
from agentgym.sandbox.limits import Limits, Result
from agentgym.sandbox.worker import Worker

if TYPE_CHECKING:
    from typing_extensions import Self


class WarmPool:
    """Keeps ``size`` idle workers of ``backend`` waiting on stdin, refilled by a background thread.

    A run takes an idle worker (or spawns one when none is ready), so it skips the sandbox and
    interpreter start-up. Every worker serves exactly one run and is then killed with its scratch
    dir, so nothing of one run (files, modules, globals, processes) reaches the next. Limits are
    applied by the worker after it receives the request, so one pool serves any ``Limits`` — except
    the size of the scratch space, fixed when a worker starts: warm workers have ``limits.disk_mb``,
    and a run asking for another size gets a freshly spawned worker.

    Example:
        >>> from agentgym.sandbox import SubprocessBackend
        >>> with WarmPool(SubprocessBackend(), size=1) as pool:
        ...     pool.run("print(6 * 7)").stdout
        '42\\n'
    """

    def __init__(self, backend: Backend, size: int = 2, limits: Limits | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"WarmPool size must be an integer >= 0, got {size!r}")
        self.backend = backend
        self.size = size
        self.limits = limits or Limits()
        self._idle: collections.deque[Worker] = collections.deque()
        self._lock = threading.Condition()
        self._closed = False
        self.spawn_errors = 0
        self._thread = threading.Thread(target=self._refill, name="sandbox-warm-pool", daemon=True)
        if size:
            self._thread.start()

    @property
    def idle(self) -> int:
        """Workers ready now."""
        with self._lock:
            return len(self._idle)

    def acquire(self, limits: Limits | None = None) -> Worker:
        """A ready worker for ``limits`` (default: the pool's), or a freshly spawned one when none is."""
        limits = limits or self.limits
        if limits.disk_mb == self.limits.disk_mb:
            with self._lock:
                while self._idle:
                    worker = self._idle.popleft()
                    self._lock.notify_all()
                    if worker.alive():
                        return worker
                    worker.discard()
        return self.backend.spawn(limits)

    def run(self, code: str, stdin: str | bytes = "", limits: Limits | None = None) -> Result:
        """Run ``code`` on a warm worker (same contract as ``run_code``)."""
        limits = limits or self.limits
        return self.acquire(limits).execute(code, stdin, limits)

    def _refill(self) -> None:
        while True:
            with self._lock:
                while not self._closed and len(self._idle) >= self.size:
                    self._lock.wait()
                if self._closed:
                    return
            try:
                worker = self.backend.spawn(self.limits)
            except OSError:
                self.spawn_errors += 1
                with self._lock:
                    self._lock.wait(timeout=1.0)  # do not spin on a broken backend
                continue
            with self._lock:
                if self._closed:
                    worker.discard()
                    return
                self._idle.append(worker)

    def close(self) -> None:
        """Stop refilling and kill every idle worker."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
            self._lock.notify_all()
        for worker in idle:
            worker.discard()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
