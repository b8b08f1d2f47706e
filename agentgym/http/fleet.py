"""``EnvFleet``: sessions of one env on one or more env services, driven in batches, surviving a dead service.

An ``EnvFleet`` is an ``agentgym.rollout.pool.EnvPool`` (the collector's plug point): each reset,
step or fork of many envs becomes one ``/batch/...`` request per service, sent to all services at
once. New sessions go to the least-loaded live service (the fewest sessions, counting other
clients' as of the last health check, never past a service's ``max_sessions``).

Every slot keeps its episode's record: seed, options and actions. When a service stops answering
(connection refused, timeouts, 503 past the retries, malformed answers) it is marked dead and every
episode it held is restarted from its seed on another service and replayed up to where it was; its
state is checked against the last one seen (``state_key``), so a non-deterministic env fails loudly
instead of silently diverging. The step that was in flight is then sent once, to the new session:
no episode is lost and none is counted twice. A dead service is probed again (``GET /health``)
every ``health_interval_s`` and takes new sessions once it answers. A session that vanished from a
live service (``SessionLost`` after a worker process died, ``UnknownSession`` after a restart) is
replayed the same way. With every service dead the call fails with an error naming each one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.core import TaskSplit
from agentgym.errors import (
    AgentGymError,
    AuthenticationError,
    ConfigError,
    EnvContractError,
    RemoteEnvError,
    RequestRejected,
    SessionCapacityError,
    SessionLost,
    UnknownSession,
)
from agentgym.http.client import DEFAULT_TIMEOUT_S, EnvClient, RemoteEnv, _reset_body, _step_body
from agentgym.service_kit.base import RetryPolicy

StepResult = tuple[str, float, bool, bool, dict[str, Any]]

#: Item errors that mean "the session is gone, not the env's fault": the episode is replayed.
_SESSION_GONE = (SessionLost, UnknownSession)
#: The keys of a well-formed answer item, per batch route.
_ANSWER_KEYS = {"reset": ("observation", "info", "episode_seed"),
                "step": ("observation", "reward", "terminated", "truncated", "info"),
                "fork": ("session_id",)}
#: Request errors that say nothing about the service's health: they are raised as they are.
_CALLER_ERRORS = (RequestRejected, AuthenticationError, ConfigError)


@dataclass(eq=False)
class Replica:
    """One env service of the fleet and what the fleet knows about it."""

    index: int
    url: str
    client: EnvClient
    alive: bool = True
    placed: int = 0
    """Open sessions of this fleet on the service."""
    others: int = 0
    """Sessions of other clients at the last health check."""
    max_sessions: int | None = None
    served: list[str] | None = None
    """The env ids the service said it serves."""
    last_error: str = ""
    checked_at: float = 0.0

    @property
    def load(self) -> int:
        return self.placed + self.others

    def has_room(self) -> bool:
        return self.max_sessions is None or self.load < self.max_sessions


@dataclass(eq=False)
class FleetSlot:
    """One env of the fleet: where its session lives and the record that can rebuild it anywhere."""

    replica: Replica | None = None
    session_id: str | None = None
    seed: int | None = None
    options: dict[str, Any] | None = None
    actions: list[str] = field(default_factory=list)
    started: bool = False
    state_key: str | None = None
    """``info["state_key"]`` of the latest answer: a replay must arrive there."""
    closed: bool = False

    def where(self) -> str:
        url = self.replica.url if self.replica is not None else "no service"
        return f"{url} session {self.session_id}"


class _ReplicaDown(Exception):
    """Internal: a request to ``replica`` failed in a way that says the service is unusable."""

    def __init__(self, replica: Replica, error: BaseException) -> None:
        super().__init__(f"{replica.url}: {error}")
        self.replica = replica
        self.error = error if replica.url in str(error) else type(error)(f"{replica.url}: {error}")


class EnvFleet:
    """Sessions of ``env_id`` on one or more env services, as an ``EnvPool``.

    Args:
        urls: the services' root URLs (``env.urls`` of the training config; one URL works too).
        env_id: the env every session runs.
        kwargs: env constructor arguments.
        max_turns: override the spec's turn budget.
        token: bearer token of the services.
        timeout_s: per-request deadline; a service that does not answer within it counts as dead.
        retries: extra attempts of a request that is safe to send again (transport errors before
            the request left, 503 with ``Retry-After``) before the service counts as dead.
        health_interval_s: how often a dead service is probed again.
        fork_mode: how services fork sessions (``auto``, ``snapshot`` or ``replay``).
        clients: ``EnvClient``s to use instead of making them (one per URL, same order).

    Raises:
        ConfigError: no URL, a URL that is not http(s), a bad argument value.
        RemoteEnvError: no service answered its health check (every URL and its error named).

    Example (needs running services)::

        fleet = EnvFleet(["http://10.0.0.5:8000", "http://10.0.0.6:8000"], "maze-v0")
        collector = Collector(fleet, policy, renderer)
    """

    def __init__(self, urls: Sequence[str], env_id: str, *, kwargs: dict[str, Any] | None = None,
                 max_turns: int | None = None, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = 2, health_interval_s: float = 5.0, fork_mode: str = "auto",
                 clients: Sequence[EnvClient] | None = None) -> None:
        if isinstance(urls, str) or not isinstance(urls, Sequence) or not urls:
            raise ConfigError(f"urls must be a non-empty list of env service URLs, got {urls!r}")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"urls lists a service twice: {list(urls)}")
        if clients is not None and len(clients) != len(urls):
            raise ConfigError(f"clients must give one EnvClient per URL ({len(urls)}), got {len(clients)}")
        if fork_mode not in ("auto", "snapshot", "replay"):
            raise ConfigError(f"fork_mode must be 'auto', 'snapshot' or 'replay', got {fork_mode!r}")
        if isinstance(health_interval_s, bool) or not isinstance(health_interval_s, (int, float)) \
                or health_interval_s < 0:
            raise ConfigError(f"health_interval_s must be a non-negative number, got {health_interval_s!r}")
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})
        self.max_turns = max_turns
        self.fork_mode = fork_mode
        self.health_interval_s = float(health_interval_s)
        self._create_body = {"env_id": env_id, "kwargs": self.kwargs, "max_turns": max_turns}
        self.replicas: list[Replica] = []
        for index, url in enumerate(urls):
            client = clients[index] if clients is not None else EnvClient(
                url, token=token, timeout_s=timeout_s, retries=retries)
            client.retry = RetryPolicy(retries=retries, busy_retries=retries)
            self.replicas.append(Replica(index, client.base_url, client))
        self._threads = (ThreadPoolExecutor(len(urls), thread_name_prefix="agentgym-fleet") if len(urls) > 1
                         else None)
        self._slots: dict[int, FleetSlot] = {}
        self.recovered = 0
        """Episodes moved to a new session (replayed) so far."""
        self.replayed_steps = 0
        for replica in self.replicas:
            self._probe(replica)
        self._live()  # raises, naming every URL, when none answered
        for replica in self.replicas:
            served = replica.served if replica.alive else None
            if served is not None and self.env_id not in served:
                raise ConfigError(f"the env service at {replica.url} does not serve {env_id!r} (it serves "
                                  f"{', '.join(served)}); start it with `agentgym serve {env_id}`")

    # --- health and placement -------------------------------------------------------------------

    def _probe(self, replica: Replica) -> bool:
        replica.checked_at = time.monotonic()
        try:
            health = replica.client.request("GET", "/health")
            if not isinstance(health, dict) or not isinstance(health.get("active_sessions"), int):
                raise RemoteEnvError(f"GET {replica.url}/health answered a body that is not the service's "
                                     "health")
        except AgentGymError as exc:
            replica.alive, replica.last_error = False, f"{type(exc).__name__}: {exc}"
            return False
        replica.alive, replica.last_error = True, ""
        replica.others = max(0, health["active_sessions"] - replica.placed)
        replica.max_sessions = (health.get("max_sessions") if isinstance(health.get("max_sessions"), int)
                                else None)
        replica.served = health["envs"] if isinstance(health.get("envs"), list) else None
        return True

    def _live(self) -> list[Replica]:
        """The live services, after probing again the dead ones whose last probe is old enough."""
        now = time.monotonic()
        for replica in self.replicas:
            if not replica.alive and now - replica.checked_at >= self.health_interval_s:
                self._probe(replica)
        live = [r for r in self.replicas if r.alive]
        if not live:
            detail = "; ".join(f"{r.url} ({r.last_error or 'dead'})" for r in self.replicas)
            raise RemoteEnvError(f"no env service of the fleet answers: {detail}. "
                                 "Start them, or fix env.urls")
        return live

    def _mark_dead(self, replica: Replica, error: BaseException) -> None:
        replica.alive = False
        replica.last_error = f"{type(error).__name__}: {error}"
        replica.checked_at = time.monotonic()
        for slot in self._slots.values():
            if slot.replica is replica:
                slot.session_id = None  # rebuilt elsewhere when next used
                replica.placed -= 1
                slot.replica = None

    def _pick(self, exclude: set[int] | None = None) -> Replica:
        candidates = [r for r in self._live() if r.index not in (exclude or ()) and r.has_room()]
        if not candidates:
            full = ", ".join(f"{r.url} ({r.load}/{r.max_sessions})" for r in self.replicas if r.alive)
            raise SessionCapacityError(f"every live env service of the fleet is full: {full}; "
                                       "start more services or raise their --max-sessions")
        return min(candidates, key=lambda r: (r.load, r.index))

    # --- talking to one service -----------------------------------------------------------------

    def _call(self, replica: Replica, method: str, path: str, body: Any = None) -> Any:
        try:
            return replica.client.request(method, path, body)
        except _CALLER_ERRORS:
            raise
        except RemoteEnvError as exc:
            raise _ReplicaDown(replica, exc) from exc

    def _batch(self, replica: Replica, route: str, key: str, items: list[dict[str, Any]]) -> list[Any]:
        """``POST /batch/{route}``; per item the answer dict or the ``AgentGymError`` it reported."""
        from agentgym.http.client import _item_or_error

        try:
            answer = self._call(replica, "POST", f"/batch/{route}", {key: items})
        except SessionCapacityError as exc:  # still busy after the Retry-After waits: overloaded
            raise _ReplicaDown(replica, exc) from exc
        results = answer.get("results") if isinstance(answer, dict) else None
        if isinstance(results, list) and len(results) == len(items):
            results = [_item_or_error(r) for r in results]
            if all(isinstance(r, AgentGymError) or all(k in r for k in _ANSWER_KEYS[route]) for r in results):
                return results
        raise _ReplicaDown(replica, RemoteEnvError(
            f"POST {replica.url}/batch/{route} answered a malformed body (expected {len(items)} results with "
            f"{', '.join(_ANSWER_KEYS[route])})"))

    @staticmethod
    def _answer(replica: Replica, route: str, answer: Any) -> dict[str, Any]:
        if not isinstance(answer, dict) or not all(k in answer for k in _ANSWER_KEYS[route]):
            raise _ReplicaDown(replica, RemoteEnvError(f"{replica.url} answered a {route} "
                                                       "with a malformed body"))
        return answer

    def _create(self, replica: Replica) -> str:
        session = self._call(replica, "POST", "/sessions", self._create_body)
        if not isinstance(session, dict) or not isinstance(session.get("session_id"), str):
            raise _ReplicaDown(replica, RemoteEnvError(f"POST {replica.url}/sessions "
                                                       "answered a malformed body"))
        return session["session_id"]

    def _fan(self, fn: Callable[[Replica, list[int]], Any], groups: dict[Replica, list[int]]
             ) -> dict[Replica, Any]:
        """``fn(replica, indices)`` for every service at once; a ``_ReplicaDown`` is returned, not raised."""
        def run(replica: Replica) -> Any:
            try:
                return fn(replica, groups[replica])
            except _ReplicaDown as down:
                return down

        if self._threads is None or len(groups) < 2:
            return {replica: run(replica) for replica in groups}
        return dict(zip(groups, self._threads.map(run, list(groups)), strict=True))

    # --- rebuilding an episode on a new session -------------------------------------------------

    def _place(self, slots: list[FleetSlot]) -> None:
        """Give every slot without a session one on the least-loaded live service, replaying its episode."""
        for slot in slots:
            tried: set[int] = set()
            while slot.session_id is None:
                replica = self._pick(tried)
                try:
                    slot.session_id = self._create(replica)
                    slot.replica = replica
                    replica.placed += 1
                    if slot.started:
                        self._replay(slot)
                except SessionCapacityError:
                    tried.add(replica.index)
                    replica.others = max(replica.others,
                                         (replica.max_sessions or replica.load) - replica.placed)
                    replica.max_sessions = replica.load  # full until its next health check says otherwise
                except _ReplicaDown as down:
                    tried.add(replica.index)
                    self._mark_dead(down.replica, down.error)

    def _replay(self, slot: FleetSlot) -> None:
        """Reset the slot's new session with its seed and options and step its actions again."""
        replica = slot.replica
        assert replica is not None and slot.session_id is not None
        path = f"/sessions/{slot.session_id}"
        info = self._answer(replica, "reset", self._call(replica, "POST", f"{path}/reset",
                                                          _reset_body(slot.seed, slot.options)))["info"]
        for turn, action in enumerate(slot.actions):
            result = self._answer(replica, "step",
                                  self._call(replica, "POST", f"{path}/step", _step_body(action)))
            info = result["info"]
            self.replayed_steps += 1
            if (result["terminated"] or result["truncated"]) and turn < len(slot.actions) - 1:
                raise EnvContractError(
                    f"replaying {self.env_id} (seed {slot.seed}) on {slot.where()} ended after {turn + 1} of "
                    f"{len(slot.actions)} actions: the env is not deterministic, so its episode cannot move "
                    "to another service")
        if info.get("state_key") != slot.state_key:
            raise EnvContractError(
                f"replaying {self.env_id} (seed {slot.seed}, {len(slot.actions)} actions) on {slot.where()} "
                f"reached state {info.get('state_key')!r}, not {slot.state_key!r}: the env is not "
                "deterministic, so its episode cannot move to another service")
        self.recovered += 1

    # --- the EnvPool calls ----------------------------------------------------------------------

    def __call__(self) -> RemoteEnv:
        """One stand-alone ``RemoteEnv`` session on the least-loaded live service."""
        replica = self._pick()
        return RemoteEnv(self.env_id, client=replica.client, max_turns=self.max_turns, **self.kwargs)

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """The task splits of the fleet's env (made with its kwargs), as a live service's env says."""
        return self._ask_env(lambda env: env.task_splits())

    def task(self, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split`` of the fleet's env, described by a live service (``Env.task``)."""
        return self._ask_env(lambda env: env.task(split, index))

    def _ask_env(self, query: Callable[[RemoteEnv], Any]) -> Any:
        """``query`` over a session of the fleet's env on the least-loaded live service, closed after."""
        env = self()
        try:
            return query(env)
        finally:
            env.close()

    def open(self, count: int) -> list[FleetSlot]:
        slots = [FleetSlot() for _ in range(count)]
        for slot in slots:
            self._slots[id(slot)] = slot
        self._place(slots)
        return slots

    def _run(self, slots: Sequence[FleetSlot], route: str, key: str,
             item: Callable[[int, FleetSlot], dict[str, Any]]) -> list[Any]:
        """One batched call per service over ``slots``; dead services' slots move and go again.

        Returns the per-slot answers (dicts); raises the first item error that is the env's own,
        after every answer has been returned to its slot's caller via ``answers``.
        """
        for slot in slots:
            if slot.closed:
                raise EnvContractError("this env slot was released; open a new one")
        answers: list[Any] = [None] * len(slots)
        pending = list(range(len(slots)))
        for _ in range(2 * len(self.replicas) + 2):
            self._place([slots[i] for i in pending])
            groups: dict[Replica, list[int]] = {}
            for i in pending:
                groups.setdefault(slots[i].replica, []).append(i)  # type: ignore[arg-type]
            outcomes = self._fan(
                lambda replica, idx: self._batch(replica, route, key, [item(i, slots[i]) for i in idx]),
                groups)
            pending = []
            for replica, outcome in outcomes.items():
                if isinstance(outcome, _ReplicaDown):
                    self._mark_dead(outcome.replica, outcome.error)
                    pending += groups[replica]
                    continue
                for i, result in zip(groups[replica], outcome, strict=True):
                    if isinstance(result, _SESSION_GONE):
                        replica.placed -= 1
                        slots[i].replica, slots[i].session_id = None, None
                        pending.append(i)
                    elif isinstance(result, AgentGymError):
                        answers[i] = type(result)(f"{slots[i].where()}: {result}")
                    else:
                        answers[i] = result
            if not pending:
                return answers
        raise RemoteEnvError(f"{route} of {len(pending)} sessions kept failing over; services: "
                             + "; ".join(f"{r.url} ({'live' if r.alive else r.last_error})"
                                         for r in self.replicas))

    @staticmethod
    def _raise_first(answers: list[Any]) -> None:
        for answer in answers:
            if isinstance(answer, AgentGymError):
                raise answer

    def reset(self, slots: Sequence[FleetSlot], seeds: Sequence[int | None],
              options: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
        bodies = [_reset_body(seed, options) for seed in seeds]
        for slot in slots:  # a reset discards the episode: a session lost meanwhile needs no replay
            slot.started, slot.actions = False, []
        answers = self._run(slots, "reset", "resets",
                            lambda i, slot: {"session_id": slot.session_id, **bodies[i]})
        for slot, answer, body in zip(slots, answers, bodies, strict=True):
            if isinstance(answer, dict):
                slot.seed, slot.options, slot.actions = answer["episode_seed"], body["options"], []
                slot.started, slot.state_key = True, answer["info"].get("state_key")
        self._raise_first(answers)
        return [(a["observation"], a["info"]) for a in answers]

    def step(self, slots: Sequence[FleetSlot], actions: Sequence[str]) -> list[StepResult]:
        bodies = [_step_body(action) for action in actions]
        answers = self._run(slots, "step", "steps",
                            lambda i, slot: {"session_id": slot.session_id, **bodies[i]})
        for slot, answer, action in zip(slots, answers, actions, strict=True):
            if isinstance(answer, dict):
                slot.actions.append(action)
                slot.state_key = answer["info"].get("state_key")
        self._raise_first(answers)
        return [(a["observation"], a["reward"], a["terminated"], a["truncated"], a["info"]) for a in answers]

    def fork(self, slots: Sequence[FleetSlot]) -> list[FleetSlot]:
        answers = self._run(slots, "fork", "forks",
                            lambda i, slot: {"session_id": slot.session_id, "mode": self.fork_mode})
        children = []
        for slot, answer in zip(slots, answers, strict=True):
            if isinstance(answer, dict):
                child = FleetSlot(slot.replica, answer["session_id"], slot.seed, slot.options,
                                  list(slot.actions), slot.started, slot.state_key)
                slot.replica.placed += 1  # type: ignore[union-attr]
                self._slots[id(child)] = child
                children.append(child)
        if len(children) < len(slots):
            self.release(children)
            self._raise_first(answers)
        return children

    def release(self, slots: Sequence[FleetSlot]) -> None:
        groups: dict[Replica, list[int]] = {}
        for i, slot in enumerate(slots):
            if slot.closed:
                continue
            slot.closed = True
            self._slots.pop(id(slot), None)
            if slot.replica is not None and slot.session_id is not None:
                slot.replica.placed -= 1
                groups.setdefault(slot.replica, []).append(i)

        def delete(replica: Replica, indices: list[int]) -> None:
            for i in indices:
                try:
                    replica.client.request("DELETE", f"/sessions/{slots[i].session_id}")
                except AgentGymError:
                    pass  # gone already (reaped, or the service died): nothing left to close

        self._fan(delete, groups)

    def close(self) -> None:
        """Delete every open session and close the connections (idempotent)."""
        self.release(list(self._slots.values()))
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None
        for replica in self.replicas:
            replica.client.close()

    def describe(self) -> list[dict[str, Any]]:
        """Per service: URL, alive, this fleet's sessions there, the last error."""
        return [{"url": r.url, "alive": r.alive, "sessions": r.placed, "last_error": r.last_error}
                for r in self.replicas]
