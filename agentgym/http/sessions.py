"""``SessionStore``: the env service's sessions — creation, capacity, idle reaping, serialization.

Each session owns one env (an ``EpisodeGuard``) and an ``asyncio.Lock``: requests to one session
run one at a time, requests to different sessions run concurrently. Env code runs in a
``WorkerPool`` so it never blocks the event loop. The step deadline counts from when the env call
*starts*: a call that ran past it poisons its session (the env is in an unknown state; the session
then answers every request with an error until deleted), and its thread is replaced (boundedly).
A call that never got a thread within the deadline is withdrawn untouched: 503 with Retry-After,
the session as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentgym.errors import (
    AgentGymError,
    ConfigError,
    EnvCrashed,
    RegistryError,
    RemoteTimeout,
    SessionCapacityError,
    UnknownEnv,
    UnknownSession,
    VersionNotFound,
)
from agentgym.guard import EpisodeGuard
from agentgym.http.threadpool import Call, WorkerPool
from agentgym.registry import make
from agentgym.spec import parse_env_id

T = TypeVar("T")


@dataclass
class Session:
    """One live env on the service."""

    session_id: str
    env_id: str
    env: EpisodeGuard
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    poisoned: str | None = None
    """Why the session is unusable (a step outlived its deadline), or None."""
    reset_failure: str | None = None
    """Why the last reset was rejected, until a reset succeeds (step's 409 then says so)."""

    def describe(self) -> dict[str, Any]:
        env = self.env
        return {
            "session_id": self.session_id,
            "env_id": self.env_id,
            "max_turns": env.max_turns,
            "turn": env.turn,
            "episode_over": env.episode_over,
            "episode_seed": env.episode_seed,
            "has_expert": bool(env.has_expert),
            "supports_snapshot": bool(env.supports_snapshot),
            "idle_s": round(time.monotonic() - self.last_used, 3),
        }


def _check_positive(name: str, value: Any, *, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ConfigError(f"{name} must be {'an integer' if integer else 'a number'} > 0, got {value!r}")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake_threadsafe(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(_wake, waiter)


class SessionStore:
    """Sessions by id, with a capacity limit, an idle TTL and a thread pool for env code.

    Args:
        max_sessions: capacity; one more create answers 503.
        ttl_s: sessions idle longer than this are closed by the reaper.
        step_timeout_s: deadline of one env call, counted from when it starts (``None``: none).
        num_workers: threads that run env code.
        allowed_env_ids: the env ids served (``None``: every registered one).
        max_spare_workers: threads that may stand in for ones stuck in calls past their deadline
            (default ``num_workers``); past that, new calls wait for a thread.

    Raises:
        ConfigError: a value out of range (the message names it).

    Changed in v0.1: the deadline counts from the start of the env call, not from its submission,
    because with every worker hung, queued calls of healthy sessions timed out and poisoned them.
    """

    def __init__(
        self,
        *,
        max_sessions: int = 1024,
        ttl_s: float = 600.0,
        step_timeout_s: float | None = 60.0,
        num_workers: int = 8,
        allowed_env_ids: list[str] | None = None,
        max_spare_workers: int | None = None,
    ) -> None:
        _check_positive("max_sessions", max_sessions, integer=True)
        _check_positive("ttl_s", ttl_s)
        if step_timeout_s is not None:
            _check_positive("step_timeout_s", step_timeout_s)
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.step_timeout_s = step_timeout_s
        self.allowed_env_ids = allowed_env_ids
        self.sessions: dict[str, Session] = {}
        self.executor = WorkerPool(num_workers, max_spare_workers)
        self._pending_creates = 0
        self.reaped_total = 0
        self._reaper: asyncio.Task[None] | None = None

    # --- running env code ---------------------------------------------------------------------

    async def run(
        self, session: Session | None, fn: Callable[[], T], *,
        unfinished: Callable[[], list[Session]] | None = None,
    ) -> T:
        """Run env code in the pool, bounded by ``step_timeout_s`` from the moment it starts.

        Raises:
            SessionCapacityError: no thread took the call within ``step_timeout_s`` (every one is
                busy or stuck); the call was withdrawn before it started, nothing changed (503).
            RemoteTimeout: the call ran past ``step_timeout_s``. ``session`` (and the sessions
                ``unfinished`` names, for batches) are poisoned, and their envs — plus an env ``fn``
                was building — are closed in the pool once the stuck call returns.
        """
        loop = asyncio.get_running_loop()
        call = self.executor.submit(fn)
        timeout = self.step_timeout_s
        # One waiter, woken by whichever comes first: the call finishing (from its thread) or the
        # timer. The timer first bounds the wait for a thread, then, re-armed, the call's own run.
        # As with ``shield``, cancelling the request leaves a started call running in the pool.
        waiter: list[asyncio.Future[None]] = [loop.create_future()]
        call.future.add_done_callback(lambda _: _wake_threadsafe(loop, waiter[0]))
        timer = loop.call_later(timeout, _wake, waiter[0]) if timeout is not None else None
        try:
            while not call.future.done():
                await waiter[0]
                if call.future.done() or timeout is None:
                    break
                started = call.started_at
                if started is None and call.future.cancel():  # still queued: withdraw it, untouched
                    raise SessionCapacityError(self._busy_message())
                remaining = (started or time.monotonic()) + timeout - time.monotonic()
                if remaining <= 0:
                    break
                waiter[0] = loop.create_future()
                timer = loop.call_later(remaining, _wake, waiter[0])
        except asyncio.CancelledError:
            call.future.cancel()  # the request went away: a call still queued never runs
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if call.future.done():
            if call.future.cancelled():  # the pool was shut down before the call started
                raise asyncio.CancelledError()
            return call.future.result()
        return self._give_up(call, session, unfinished)

    def _busy_message(self) -> str:
        pool = self.executor
        return (f"no env worker took this call within the {self.step_timeout_s:g} s step timeout "
                f"({pool.num_workers} workers, {pool.stuck} stuck in calls past their deadline, "
                f"{pool.queued} calls queued); nothing was run and the session is unchanged: "
                "retry after Retry-After")

    def _give_up(self, call: Call, session: Session | None,
                 unfinished: Callable[[], list[Session]] | None) -> Any:
        stuck = [session] if session is not None else []
        if unfinished is not None:
            stuck += unfinished()
        for item in stuck:
            item.poisoned = (
                f"a request to session {item.session_id!r} ran past the {self.step_timeout_s:g} s step "
                "timeout and its env is in an unknown state; DELETE the session and create a new one"
            )
        self.executor.abandon(call)  # a spare thread stands in while this one is stuck
        # Runs in the pool thread once the stuck call returns (or at once, if it just did).
        call.future.add_done_callback(lambda done: self._close_after_timeout(done, stuck))
        raise RemoteTimeout(f"env code ran past the service's step timeout of {self.step_timeout_s:g} s")

    @property
    def stuck_workers(self) -> int:
        """Worker threads still running calls that ran past their deadline."""
        return self.executor.stuck

    @property
    def available_workers(self) -> int:
        """Worker threads not stuck (busy or idle); 0 means no env call can run."""
        return self.executor.available

    def _close_after_timeout(self, done: Future[Any], stuck: list[Session]) -> None:
        envs = [s.env for s in stuck]
        if not done.cancelled() and done.exception() is None and isinstance(done.result(), EpisodeGuard):
            envs.append(done.result())  # built by create/fork after the client was told it failed

        def close_all() -> None:
            for env in envs:
                with contextlib.suppress(Exception):
                    env.close()

        with contextlib.suppress(RuntimeError):  # the pool is already shut down
            self.executor.submit(close_all)

    # --- lifecycle ----------------------------------------------------------------------------

    def check_served(self, env_id: str) -> None:
        """Raise ``UnknownEnv``/``VersionNotFound`` (with suggestions) if this service does not serve the
        id."""
        served = self.allowed_env_ids
        if served is None or env_id in served:
            return
        try:
            namespace, name, _ = parse_env_id(env_id)
        except RegistryError:
            namespace, name = None, None
        same_name = [i for i in served if name is not None and parse_env_id(i)[:2] == (namespace, name)]
        if same_name:
            raise VersionNotFound(
                f"this service does not serve {env_id!r}; it serves that env as: {', '.join(same_name)}"
            )
        close = difflib.get_close_matches(env_id, served, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownEnv(f"this service does not serve {env_id!r}.{hint} It serves: {', '.join(served)}")

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Hold one unit of capacity while a session is being built (create, fork)."""
        if len(self.sessions) + self._pending_creates >= self.max_sessions:
            raise SessionCapacityError(
                f"the service holds its maximum of {self.max_sessions} sessions; close sessions you no "
                "longer use (DELETE /sessions/{id}), retry later, or start it with a larger --max-sessions"
            )
        self._pending_creates += 1
        try:
            yield
        finally:
            self._pending_creates -= 1

    async def create(self, env_id: str, kwargs: dict[str, Any], max_turns: int | None) -> Session:
        self.check_served(env_id)
        for reserved, fix in (("max_turns", "the request's max_turns field"),
                              ("env_id", "the request's env_id")):
            if reserved in kwargs:
                raise ConfigError(f"kwargs may not contain {reserved!r}; use {fix} instead")

        def build() -> EpisodeGuard:
            try:
                return make(env_id, max_turns=max_turns, **kwargs)
            except AgentGymError:
                raise
            except Exception as exc:  # the env's constructor refused the client's kwargs
                raise ConfigError(
                    f"env {env_id!r} could not be built with kwargs {kwargs!r}: {type(exc).__name__}: {exc}"
                ) from exc

        with self.reserve():
            env = await self.run(None, build)
            return self.add(env_id, env)

    def add(self, env_id: str, env: EpisodeGuard) -> Session:
        """Register an env built elsewhere (``create``, ``fork``) under a fresh session id."""
        session = Session(session_id=secrets.token_hex(12), env_id=env_id, env=env)
        self.sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSession(
                f"no live session {session_id!r}: it was never created, was deleted, or was reaped after "
                f"{self.ttl_s:g} s idle; create a new one with POST /sessions"
            )
        if session.poisoned is not None:
            raise EnvCrashed(session.poisoned)
        session.last_used = time.monotonic()
        return session

    def check_live(self, session: Session) -> None:
        """Re-check a session once its lock is held: it may have been poisoned or closed meanwhile."""
        if session.poisoned is not None:
            raise EnvCrashed(session.poisoned)
        if self.sessions.get(session.session_id) is not session:
            raise UnknownSession(f"session {session.session_id!r} was closed while this request waited "
                                 "for it")

    async def delete(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise UnknownSession(f"no live session {session_id!r} to delete")
        await self._close(session)

    async def _close(self, session: Session) -> None:
        if session.poisoned is not None:
            return  # closed in the pool when the stuck call returns
        async with session.lock:
            if session.poisoned is not None:
                return
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(self.executor.submit(session.env.close).future)

    # --- reaping ------------------------------------------------------------------------------

    async def reap_idle(self) -> int:
        """Close sessions idle longer than ``ttl_s``; returns how many were closed."""
        now = time.monotonic()
        stale = [s for s in list(self.sessions.values())
                 if now - s.last_used > self.ttl_s and not s.lock.locked()]
        for session in stale:
            if self.sessions.pop(session.session_id, None) is not None:
                await self._close(session)
                self.reaped_total += 1
        return len(stale)

    async def _reap_forever(self) -> None:
        interval = max(min(self.ttl_s / 4, 30.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.reap_idle()

    def start(self) -> None:
        """Start the idle reaper on the running loop (again, if a previous loop has gone)."""
        loop = asyncio.get_running_loop()
        if self._reaper is None or self._reaper.done() or self._reaper.get_loop() is not loop:
            self._reaper = loop.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            if self._reaper.get_loop() is asyncio.get_running_loop():
                self._reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reaper
            self._reaper = None
        for session_id in list(self.sessions):
            session = self.sessions.pop(session_id)
            await self._close(session)
        self.executor.shutdown(cancel_futures=True)
