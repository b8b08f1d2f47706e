"""``WorkerPool``: the threads that run env code for the env service, and ``Call``, one call on them.

A thread pool that knows when each call *started* (so a deadline can count from then, and a call
still waiting in the queue can be withdrawn untouched), and that replaces threads stuck in calls
their callers gave up on (``abandon``), up to a bound, so a few hung envs cannot take the pool.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from agentgym.errors import ConfigError


class Call:
    """One function submitted to a ``WorkerPool``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()
        """Its outcome; ``cancel()`` succeeds only while the call is still queued."""
        self.started_at: float | None = None
        """``time.monotonic()`` when a thread started it; ``None`` while queued."""
        self.abandoned = False
        """The caller stopped waiting (its deadline passed); the thread running it is counted as stuck."""


class WorkerPool:
    """``num_workers`` threads for env calls, plus up to ``max_spare`` that stand in for stuck ones.

    ``abandon(call)`` marks a running call as stuck: the pool may then run one more thread, so the
    other sessions keep ``num_workers`` threads; when the stuck call finally returns, its thread
    retires and the pool shrinks back. Past ``num_workers + max_spare`` threads, new calls wait.

    Example:
        >>> pool = WorkerPool(num_workers=2)
        >>> call = pool.submit(lambda: 6 * 7)
        >>> call.future.result(timeout=5), call.started_at is not None
        (42, True)
        >>> pool.shutdown()
    """

    def __init__(self, num_workers: int = 8, max_spare: int | None = None,
                 name: str = "agentgym-env") -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        self.num_workers = num_workers
        self.max_spare = num_workers if max_spare is None else max_spare
        if isinstance(self.max_spare, bool) or not isinstance(self.max_spare, int) or self.max_spare < 0:
            raise ConfigError(f"max_spare must be an integer >= 0, got {max_spare!r}")
        self.name = name
        self._queue: collections.deque[Call] = collections.deque()
        self._cond = threading.Condition()
        self._threads = 0
        self._idle = 0
        self._stuck = 0
        self._shutdown = False
        self._names = 0

    # --- what the service reports ---------------------------------------------------------------

    @property
    def stuck(self) -> int:
        """Threads still running calls their callers abandoned."""
        return self._stuck

    @property
    def threads(self) -> int:
        """Threads running now (``num_workers`` at most, plus spares while calls are stuck)."""
        return self._threads

    @property
    def queued(self) -> int:
        """Calls waiting for a thread."""
        return len(self._queue)

    @property
    def available(self) -> int:
        """Threads that could take a call now or once they finish their current one (not stuck)."""
        return max(self._target() - self._stuck, 0)

    # --- calls ----------------------------------------------------------------------------------

    def submit(self, fn: Callable[[], Any]) -> Call:
        """Queue ``fn``; a thread runs it as soon as one is free."""
        call = Call(fn)
        with self._cond:
            if self._shutdown:
                raise RuntimeError("the worker pool is shut down")
            self._queue.append(call)
            if self._idle == 0 and self._threads < self._target():
                self._start_thread()
            else:
                self._cond.notify()
        return call

    def abandon(self, call: Call) -> None:
        """The caller gave up on a running ``call``: count its thread as stuck and stand a spare in."""
        with self._cond:
            if call.abandoned or call.future.done():
                return
            call.abandoned = True
            self._stuck += 1
            if self._queue and self._idle == 0 and self._threads < self._target():
                self._start_thread()

    def shutdown(self, cancel_futures: bool = True) -> None:
        """Stop taking calls; queued ones are cancelled; threads exit once idle (none is waited for)."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft().future.cancel()
            self._cond.notify_all()

    # --- threads --------------------------------------------------------------------------------

    def _target(self) -> int:
        return min(self.num_workers + self._stuck, self.num_workers + self.max_spare)

    def _start_thread(self) -> None:
        self._threads += 1
        self._names += 1
        threading.Thread(target=self._serve, name=f"{self.name}-{self._names}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._shutdown or self._threads > self._target():
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                call = self._queue.popleft()
            if not call.future.set_running_or_notify_cancel():
                continue  # withdrawn while queued
            call.started_at = time.monotonic()
            try:
                result = call.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                call.future.set_exception(exc)
            else:
                call.future.set_result(result)
            with self._cond:
                if call.abandoned:
                    self._stuck -= 1
                if self._threads > self._target() and not (self._queue and self._idle == 0):
                    self._threads -= 1  # a spare whose stuck call returned: the pool shrinks back
                    return


__all__ = ["Call", "WorkerPool"]
