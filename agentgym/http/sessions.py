"""``SessionStore``: the env service's sessions — creation, capacity, idle reaping, serialization.

Each session owns one env (an ``EpisodeGuard``) and an ``asyncio.Lock``: requests to one session
run one at a time, requests to different sessions run concurrently. Env code runs in a thread pool
so it never blocks the event loop. A step that runs past its deadline poisons its session (the env
is in an unknown state); the session then answers every request with an error until deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake_threadsafe(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(_wake, waiter)


class SessionStore:
    """Sessions by id, with a capacity limit, an idle TTL and a thread pool for env code."""

    def __init__(
        self,
        *,
        max_sessions: int = 1024,
        ttl_s: float = 600.0,
        step_timeout_s: float | None = 60.0,
        num_workers: int = 8,
        allowed_env_ids: list[str] | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.step_timeout_s = step_timeout_s
        self.allowed_env_ids = allowed_env_ids
        self.sessions: dict[str, Session] = {}
        self.executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="agentgym-env")
        self._pending_creates = 0
        self.reaped_total = 0
        self._reaper: asyncio.Task[None] | None = None

    # --- running env code ---------------------------------------------------------------------

    async def run(
        self, session: Session | None, fn: Callable[[], T], *,
        unfinished: Callable[[], list[Session]] | None = None,
    ) -> T:
        """Run env code in the pool, bounded by ``step_timeout_s``.

        On timeout the request gets ``RemoteTimeout``; ``session`` (and the sessions ``unfinished``
        names, for batches) are poisoned, and their envs — plus an env ``fn`` was building — are
        closed in the pool once the stuck call returns.
        """
        loop = asyncio.get_running_loop()
        if self.step_timeout_s is None:
            return await loop.run_in_executor(self.executor, fn)
        # One waiter woken by whichever comes first, the pool thread finishing or the deadline: the
        # same outcome as ``wait_for(shield(run_in_executor(...)))`` at about half its event-loop cost
        # (no wrapping asyncio future, no shield, no wait_for bookkeeping). As with ``shield``,
        # cancelling the request leaves the call running in the pool.
        call = self.executor.submit(fn)
        waiter = loop.create_future()
        call.add_done_callback(lambda _: _wake_threadsafe(loop, waiter))
        deadline = loop.call_later(self.step_timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            deadline.cancel()
        if call.done():
            if call.cancelled():  # the pool was shut down before the call started
                raise asyncio.CancelledError()
            return call.result()
        stuck = [session] if session is not None else []
        if unfinished is not None:
            stuck += unfinished()
        for item in stuck:
            item.poisoned = (
                f"a request to session {item.session_id!r} ran past the {self.step_timeout_s:g} s step "
                "timeout and its env is in an unknown state; DELETE the session and create a new one"
            )
        # Runs in the pool thread once the stuck call returns (or at once, if it just did).
        call.add_done_callback(lambda done: self._close_after_timeout(done, stuck))
        raise RemoteTimeout(f"env code ran past the service's step timeout of {self.step_timeout_s:g} s")

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
        """Raise ``UnknownEnv``/``VersionNotFound`` (with suggestions) if this service does not serve the id."""
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
        for reserved, fix in (("max_turns", "the request's max_turns field"), ("env_id", "the request's env_id")):
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
            raise UnknownSession(f"session {session.session_id!r} was closed while this request waited for it")

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
                await asyncio.get_running_loop().run_in_executor(self.executor, session.env.close)

    # --- reaping ------------------------------------------------------------------------------

    async def reap_idle(self) -> int:
        """Close sessions idle longer than ``ttl_s``; returns how many were closed."""
        now = time.monotonic()
        stale = [s for s in list(self.sessions.values()) if now - s.last_used > self.ttl_s and not s.lock.locked()]
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
        self.executor.shutdown(wait=False, cancel_futures=True)
