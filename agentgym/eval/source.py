"""``EnvSource``: where the envs of a training run or an evaluation come from, and which task seeds are
held out.

Training (``agentgym.training.run.setup``) and ``agentgym eval`` (``agentgym.eval.harness``) describe their
envs with the same fields (id, arguments, turn budget, env services) and build them here, so both
make the same envs the same way: in-process (``agentgym.make``), sessions on an env service
(``RemoteEnv``), a fleet of services stepped through their batched routes (``EnvFleet``), or Ray
actors (``RayEnvPool``). The action format an env asks for is read from its spec, or from its
service when it runs on one. The module lives in the evaluation package because both users may
import it and it needs the HTTP client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import agentgym
from agentgym.core import Env
from agentgym.rollout.pool import EnvPool

if TYPE_CHECKING:
    from agentgym.http.client import EnvClient

#: Task seeds from here on are held out: training draws its task seeds below it, and evaluations
#: (training's held-out ones, ``eval.seed_offset``, and `agentgym eval`'s default) start here.
HELD_OUT_SEED_START = 1_000_000


@dataclass(frozen=True)
class EnvSource:
    """One env, and where its instances run.

    Example:
        >>> source = EnvSource("maze-v0", {"size": 2}, max_turns=3)
        >>> env = source.factory()()
        >>> (env.reset(seed=1)[1]["state_key"]
        ...  == agentgym.make("maze-v0", size=2).reset(seed=1)[1]["state_key"])
        True
        >>> source.action_format()
        'plain'
    """

    id: str
    """Registered env id."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Env constructor arguments."""
    max_turns: int | None = None
    """Override of the spec's turn budget."""
    urls: tuple[str, ...] = ()
    """Env services holding the env; empty: in-process envs."""
    token: str | None = None
    """Bearer token of the services."""
    timeout_s: float = 60.0
    """Per-request deadline on the services."""
    backend: Literal["local", "ray"] = "local"
    """Where in-process envs run: ``local`` (this process) or ``ray`` (Ray actors)."""
    ray_address: str | None = None
    """For ``ray``: the cluster to join (None: a local instance)."""
    ray_workers: int | None = None
    """For ``ray``: env actors (None: one per CPU, at most 16)."""

    def client(self) -> EnvClient:
        """A client of the first service (the caller closes it).

        Raises:
            ValueError: the source has no service.
        """
        from agentgym.http.client import EnvClient

        if not self.urls:
            raise ValueError(f"env {self.id} runs in-process; it has no service to connect to")
        return EnvClient(self.urls[0], token=self.token, timeout_s=self.timeout_s)

    def factory(self, client: EnvClient | None = None) -> Callable[[], Env]:
        """Stand-alone envs, one per call: in-process, or sessions on the first service (through
        ``client`` when given, so many sessions share its connections)."""
        if self.urls:
            from agentgym.http.client import RemoteEnv

            shared = client if client is not None else self.client()
            return lambda: RemoteEnv(self.id, client=shared, max_turns=self.max_turns, **self.kwargs)
        return lambda: agentgym.make(self.id, max_turns=self.max_turns, **self.kwargs)

    def pool(self) -> Callable[[], Env] | EnvPool:
        """What a collector steps in batches; every answer is also a zero-argument env factory.

        - services: an ``EnvFleet`` over them (one batched request per service per turn;
          least-loaded placement; a dead service's episodes replayed on another);
        - ``backend: ray``: a ``RayEnvPool`` (envs inside Ray actors);
        - else in-process envs (``agentgym.make``).
        """
        if self.urls:
            from agentgym.http.fleet import EnvFleet

            return EnvFleet(list(self.urls), self.id, kwargs=self.kwargs, max_turns=self.max_turns,
                            token=self.token, timeout_s=self.timeout_s)
        if self.backend == "ray":
            from agentgym.rollout.ray_pool import RayEnvPool

            return RayEnvPool(self.id, kwargs=self.kwargs, max_turns=self.max_turns,
                              num_workers=self.ray_workers, address=self.ray_address)
        return self.factory()

    def action_format(self, client: EnvClient | None = None) -> str:
        """The action format the env's spec asks for (its service's spec when it runs on one), else
        ``plain``."""
        if self.urls:
            if client is not None:
                wanted = client.env_detail(self.id).get("action_format")
            else:
                with self.client() as own:
                    wanted = own.env_detail(self.id).get("action_format")
        else:
            wanted = getattr(agentgym.spec(self.id), "action_format", None)
        return wanted or "plain"
