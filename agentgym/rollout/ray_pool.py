"""``RayEnvPool``: envs inside Ray actors, for runs on a Ray cluster (``env.backend: ray``).

Each actor holds many envs (one Python process per env would cost hundreds of processes for a
batch; see DESIGN §8), and every pool call is one remote call per actor, run at once. Slots are
spread over the actors evenly; a fork stays in its parent's actor. Ray schedules the actors; the
pool does no scheduling of its own. Needs ``pip install 'agentgym-rl[ray]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import agentgym
from agentgym.core import Env
from agentgym.errors import AgentGymError, ConfigError, EnvContractError
from agentgym.rollout.pool import PoolEnv, StepResult


class EnvHost:
    """What runs inside one Ray actor: envs by id, called in batches. Failures come back as values,
    so one env's error does not hide the results of the others."""

    def __init__(self, env_id: str, kwargs: dict[str, Any], max_turns: int | None) -> None:
        self.env_id, self.kwargs, self.max_turns = env_id, kwargs, max_turns
        self.envs: dict[int, Any] = {}

    def open(self, ids: list[int]) -> None:
        for i in ids:
            self.envs[i] = agentgym.make(self.env_id, max_turns=self.max_turns, **self.kwargs)

    @staticmethod
    def _each(calls: list[Any]) -> list[tuple[bool, Any]]:
        out = []
        for call in calls:
            try:
                out.append((True, call()))
            except Exception as exc:  # noqa: BLE001 - sent back to the pool, which raises it there
                out.append((False, exc if isinstance(exc, AgentGymError) else
                            AgentGymError(f"{type(exc).__name__}: {exc}")))
        return out

    def reset(self, items: list[tuple[int, int | None, dict[str, Any] | None]]) -> list[tuple[bool, Any]]:
        return self._each([lambda i=i, s=s, o=o: self.envs[i].reset(seed=s, options=o) for i, s, o in items])

    def step(self, items: list[tuple[int, str]]) -> list[tuple[bool, Any]]:
        return self._each([lambda i=i, a=a: self.envs[i].step(a) for i, a in items])

    def fork(self, items: list[tuple[int, int]]) -> list[tuple[bool, Any]]:
        def fork_one(source: int, child: int) -> None:
            self.envs[child] = self.envs[source].fork()

        return self._each([lambda s=s, c=c: fork_one(s, c) for s, c in items])

    def release(self, ids: list[int]) -> None:
        for i in ids:
            env = self.envs.pop(i, None)
            if env is not None:
                env.close()


@dataclass(eq=False)
class RaySlot:
    """One env: the index of the actor that holds it and its id there."""

    actor: int
    env: int


class RayEnvPool:
    """An ``EnvPool`` of envs in ``num_workers`` Ray actors.

    Args:
        env_id: the env every slot runs.
        kwargs: env constructor arguments.
        max_turns: override the spec's turn budget.
        num_workers: actors; None: one per CPU of the cluster, at most 16.
        address: the Ray cluster (``ray.init(address=...)``); None joins the running instance or
            starts a local one. A pool that started Ray shuts it down on ``close``.

    Raises:
        ConfigError: Ray is not installed, or a bad argument.
    """

    def __init__(self, env_id: str, *, kwargs: dict[str, Any] | None = None, max_turns: int | None = None,
                 num_workers: int | None = None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("env.backend: ray needs Ray: pip install 'agentgym-rl[ray]'") from None
        if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                        or num_workers < 1):
            raise ConfigError(f"num_workers must be a positive integer or None, got {num_workers!r}")
        agentgym.spec(env_id)  # an unknown id fails here, with suggestions, not inside an actor
        self._ray = ray
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        count = num_workers or min(16, cpus)
        host = ray.remote(EnvHost).options(num_cpus=min(1.0, cpus / count))
        self.actors = [host.remote(env_id, dict(kwargs or {}), max_turns) for _ in range(count)]
        self.env_id, self.kwargs, self.max_turns = env_id, dict(kwargs or {}), max_turns
        self._next_id = 0
        self._load = [0] * count
        self._open: dict[int, RaySlot] = {}

    def __call__(self) -> Env:
        return PoolEnv(self)

    def _new(self, actor: int) -> RaySlot:
        slot = RaySlot(actor, self._next_id)
        self._next_id += 1
        self._load[actor] += 1
        self._open[id(slot)] = slot
        return slot

    def _calls(self, method: str, slots: Sequence[RaySlot], items: Sequence[Any]) -> list[tuple[bool, Any]]:
        """One remote call per actor over its share of ``items``; per item (ok, value or error)."""
        shares: dict[int, list[int]] = {}
        for index, slot in enumerate(slots):
            shares.setdefault(slot.actor, []).append(index)
        refs = {a: getattr(self.actors[a], method).remote([items[i] for i in idx])
                for a, idx in shares.items()}
        results: list[Any] = [None] * len(slots)
        for actor, answers in zip(refs, self._ray.get(list(refs.values())), strict=True):
            for index, answer in zip(shares[actor], answers, strict=True):
                results[index] = answer
        return results

    @staticmethod
    def _values(results: list[tuple[bool, Any]]) -> list[Any]:
        for ok, value in results:
            if not ok:
                raise value
        return [value for _, value in results]

    def open(self, count: int) -> list[RaySlot]:
        slots = [self._new(min(range(len(self.actors)), key=lambda a: self._load[a])) for _ in range(count)]
        shares: dict[int, list[int]] = {}
        for slot in slots:
            shares.setdefault(slot.actor, []).append(slot.env)
        self._ray.get([self.actors[a].open.remote(ids) for a, ids in shares.items()])
        return slots

    def reset(self, slots: Sequence[RaySlot], seeds: Sequence[int | None],
              options: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
        return self._values(self._calls("reset", slots, [(s.env, seed, options)
                                                         for s, seed in zip(slots, seeds, strict=True)]))

    def step(self, slots: Sequence[RaySlot], actions: Sequence[str]) -> list[StepResult]:
        return self._values(self._calls("step", slots,
                                        [(s.env, a) for s, a in zip(slots, actions, strict=True)]))

    def fork(self, slots: Sequence[RaySlot]) -> list[RaySlot]:
        for slot in slots:
            if id(slot) not in self._open:
                raise EnvContractError("this env slot was released; open a new one")
        children = [self._new(slot.actor) for slot in slots]
        results = self._calls("fork", slots, [(s.env, c.env) for s, c in zip(slots, children, strict=True)])
        if not all(ok for ok, _ in results):
            self.release(children)
        self._values(results)
        return children

    def release(self, slots: Sequence[RaySlot]) -> None:
        shares: dict[int, list[int]] = {}
        for slot in slots:
            if self._open.pop(id(slot), None) is not None:
                self._load[slot.actor] -= 1
                shares.setdefault(slot.actor, []).append(slot.env)
        if shares:
            self._ray.get([self.actors[a].release.remote(ids) for a, ids in shares.items()])

    def close(self) -> None:
        """Close every env and the actors; shut Ray down if this pool started it (idempotent)."""
        if not self.actors:
            return
        self.release(list(self._open.values()))
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
