"""Clients of the env service: ``RemoteEnv`` (an ``agentgym.Env``), ``AsyncRemoteEnv``, ``EnvClient``,
``AsyncEnvClient``.

A ``RemoteEnv`` is a session on a service that behaves like the local env: same return values,
same exceptions (``ResetNeeded``, ``EpisodeFinished``, ``UnknownEnv``...), fork included. The
clients are ``agentgym.service_kit.base`` clients: errors come back as the class the service names, and
a request is sent again only where that is safe (create, reset, step and fork only when they never
reached the service), so a retried step can never run twice.
"""

from __future__ import annotations

import numbers
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from agentgym.core import Env, TaskSplit
from agentgym.errors import (
    AgentGymError,
    ConfigError,
    EnvContractError,
    EnvCrashed,
    RemoteEnvError,
)
from agentgym.service_kit.base import (
    AsyncServiceClient,
    RetryPolicy,
    ServiceClient,
    error_from_detail,
    quoted,
)

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_TIMEOUT_S = 60.0
_FORK_MODES = ("auto", "snapshot", "replay")


def _item_or_error(result: Any) -> dict[str, Any] | AgentGymError:
    """One item of a batch answer: the result, or the error the service reported for that item."""
    if isinstance(result, dict) and "error" not in result:
        return result
    error = error_from_detail(result.get("error") if isinstance(result, dict) else None)
    if error is None:
        return RemoteEnvError(f"a batch answer item is neither a result nor an error: {quoted(str(result))}")
    return error


# The checks a local ``EpisodeGuard`` makes before it talks to the env, made before the request, so a
# remote env raises the same classes (the service would answer 422 ``RequestRejected`` instead).


def _reset_body(seed: Any, options: Any) -> dict[str, Any]:
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ConfigError(f"seed must be a non-negative integer or None, got {seed!r}")
        if seed >= 2**63:
            raise ConfigError(f"seed must be below 2**63 for a remote env, got {seed}")
        seed = int(seed)  # numpy integers are not JSON
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"options must be a dict or None, got {type(options).__name__}")
    return {"seed": seed, "options": options}


def _step_body(action: Any) -> dict[str, Any]:
    if not isinstance(action, str):
        raise EnvContractError(f"action must be a str, got {type(action).__name__}")
    return {"action": action}


def _fork_body(mode: Any) -> dict[str, Any]:
    if mode not in _FORK_MODES:
        raise ConfigError(f"fork mode must be 'auto', 'snapshot' or 'replay', got {mode!r}")
    return {"mode": mode}


def _create_body(env_id: str, kwargs: dict[str, Any], max_turns: Any) -> dict[str, Any]:
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                  or max_turns < 1):
        raise ConfigError(f"max_turns must be a positive integer or None, got {max_turns!r}")
    return {"env_id": env_id, "kwargs": kwargs, "max_turns": max_turns}


def _task_path(split: Any, index: Any) -> str:
    """``{split}/{index}`` for a task route; the service checks both (unknown split, index out of range)."""
    if not isinstance(split, str) or not split:
        raise ConfigError(f"split must be a non-empty str, got {split!r}")
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise ConfigError(f"index must be an integer, got {index!r}")
    return f"{urllib.parse.quote(split, safe='')}/{int(index)}"


def _splits_from_json(body: Any) -> tuple[TaskSplit, ...]:
    return tuple(TaskSplit(**split) for split in body["splits"])


def _closed_error() -> EnvContractError:
    return EnvContractError("this env is closed (its session was deleted); make a new one")


class EnvClient(ServiceClient):
    """Synchronous client of one env service: service-level calls and session requests.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"`` (the default); ``None``: the ``client``'s base URL.
        token: bearer token, if the service was started with one.
        timeout_s: per-request timeout (connect, read, write).
        retries: extra attempts for requests that are safe to repeat
            (``agentgym.service_kit.base.RetryPolicy``).
        client: an ``httpx.Client`` to use instead (tests pass FastAPI's ``TestClient``).
        transport: an ``httpx`` transport for the client made here.

    ``request(method, path, json)`` sends any request and returns the answer's JSON (see ``ServiceClient``).
    """

    default_url = "http://127.0.0.1:8000"

    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2, client: httpx.Client | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s, retry=RetryPolicy(retries=retries),
                         limits=httpx.Limits(max_keepalive_connections=64, max_connections=256),
                         client=client, transport=transport)

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def list_envs(self) -> list[dict[str, Any]]:
        return self.request("GET", "/envs")

    def env_detail(self, env_id: str) -> dict[str, Any]:
        return self.request("GET", f"/envs/{env_id}")

    def task_splits(self, env_id: str) -> tuple[TaskSplit, ...]:
        """The task splits of ``env_id`` made with its default arguments (``Env.task_splits``)."""
        return _splits_from_json(self.request("GET", f"/envs/{env_id}/tasks"))

    def task(self, env_id: str, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split`` of ``env_id`` made with its default arguments (``Env.task``)."""
        return self.request("GET", f"/envs/{env_id}/tasks/{_task_path(split, index)}")

    def batch_step(self, steps: Sequence[tuple[str, str]]) -> list[dict[str, Any] | AgentGymError]:
        """Step many sessions in one request; each item is a step result or the error it raised."""
        body = {"steps": [{"session_id": sid, "action": action} for sid, action in steps]}
        results = self.request("POST", "/batch/step", body)["results"]
        return [_item_or_error(r) for r in results]

    def batch_reset(self, resets: Sequence[tuple[str, int | None, dict[str, Any] | None]]
                    ) -> list[dict[str, Any] | AgentGymError]:
        body = {"resets": [{"session_id": s, "seed": seed, "options": opt} for s, seed, opt in resets]}
        results = self.request("POST", "/batch/reset", body)["results"]
        return [_item_or_error(r) for r in results]

    def batch_fork(self, forks: Sequence[tuple[str, str]]) -> list[dict[str, Any] | AgentGymError]:
        """Fork many sessions in one request (``(session_id, mode)`` each); each item is the new
        session's info or the error its fork raised."""
        body = {"forks": [{"session_id": sid, "mode": _fork_body(mode)["mode"]} for sid, mode in forks]}
        results = self.request("POST", "/batch/fork", body)["results"]
        return [_item_or_error(r) for r in results]


class RemoteEnv(Env):
    """An env living in a session on an env service; use it exactly like a local env.

    Args:
        env_id: registered id on the service, e.g. ``"maze-v0"``.
        base_url, token, timeout_s, retries: see ``EnvClient`` (ignored when ``client`` is given).
        client: share one ``EnvClient`` between many envs (one connection pool).
        max_turns: override the spec's turn budget.
        **kwargs: env constructor arguments.

    Raises the same exceptions as a local env; transport failures raise ``RemoteEnvError``.

    Example (needs a running service)::

        env = RemoteEnv("maze-v0", base_url="http://127.0.0.1:8000")
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("up")
    """

    # reset options split/index travel to the service, whose env resolves them with its own splits.
    resolves_tasks: ClassVar[bool] = False

    def __init__(self, env_id: str, *, base_url: str = "http://127.0.0.1:8000", token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2, client: EnvClient | None = None,
                 max_turns: int | None = None, _session: dict[str, Any] | None = None, **kwargs: Any) -> None:
        body = _create_body(env_id, kwargs, max_turns)
        self.client = client or EnvClient(base_url, token=token, timeout_s=timeout_s, retries=retries)
        self._owns_client = client is None
        self._closed = False
        try:
            session = _session or self.client.request("POST", "/sessions", body)
        except BaseException:
            if self._owns_client:
                self.client.close()
            raise
        self._adopt(session)

    def _adopt(self, session: dict[str, Any]) -> None:
        self.session_id: str = session["session_id"]
        self.env_id: str = session["env_id"]
        self.max_turns: int | None = session["max_turns"]
        self.has_expert = session["has_expert"]  # type: ignore[misc]
        self.supports_snapshot = session["supports_snapshot"]  # type: ignore[misc]
        self.turn: int = session["turn"]
        self.episode_seed: int | None = session["episode_seed"]
        self.episode_over: bool = session["episode_over"]

    @property
    def _path(self) -> str:
        return f"/sessions/{self.session_id}"

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        if self._closed:
            raise _closed_error()
        try:
            return self.client.request("POST", f"{self._path}{path}", body)
        except EnvCrashed:
            self.episode_over = True
            raise

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        result = self._call("/reset", _reset_body(seed, options))
        self.turn, self.episode_seed, self.episode_over = 0, result["episode_seed"], False
        return result["observation"], result["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        r = self._call("/step", _step_body(action))
        self.turn, self.episode_over = r["turn"], r["terminated"] or r["truncated"]
        return r["observation"], r["reward"], r["terminated"], r["truncated"], r["info"]

    def fork(self, mode: str = "auto") -> RemoteEnv:
        """A new session on the same service in the same state (the service forks the env)."""
        session = self._call("/fork", _fork_body(mode))
        return RemoteEnv(self.env_id, client=self.client, _session=session)

    def expert_action(self) -> str | None:
        return self._call("/expert")["action"]

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """The splits of this session's env, as the service's env (made with this env's kwargs) says."""
        return _splits_from_json(self._get("/tasks"))

    def task(self, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split`` of this session's env, described by the service."""
        return self._get(f"/tasks/{_task_path(split, index)}")

    def _get(self, path: str) -> Any:
        if self._closed:
            raise _closed_error()
        return self.client.request("GET", f"{self._path}{path}")

    def session_info(self) -> dict[str, Any]:
        return self.client.request("GET", self._path)

    def close(self) -> None:
        """Delete the session (idempotent; a session the service already reaped is fine)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.request("DELETE", self._path)
        except (AgentGymError, RemoteEnvError):
            pass
        finally:
            if self._owns_client:
                self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvClient(AsyncServiceClient):
    """Asynchronous twin of ``EnvClient`` (``httpx.AsyncClient``; pass ``transport=`` for in-process)."""

    default_url = "http://127.0.0.1:8000"

    def __init__(self, base_url: str | None = None, *, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2,
                 transport: httpx.AsyncBaseTransport | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        super().__init__(base_url, token=token, timeout_s=timeout_s, retry=RetryPolicy(retries=retries),
                         limits=httpx.Limits(max_keepalive_connections=256, max_connections=512),
                         client=client, transport=transport)

    async def health(self) -> dict[str, Any]:
        return await self.request("GET", "/health")

    async def list_envs(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/envs")

    async def env_detail(self, env_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/envs/{env_id}")

    async def batch_step(self, steps: Sequence[tuple[str, str]]) -> list[dict[str, Any] | AgentGymError]:
        body = {"steps": [{"session_id": sid, "action": action} for sid, action in steps]}
        return [_item_or_error(r) for r in (await self.request("POST", "/batch/step", body))["results"]]

    async def batch_reset(self, resets: Sequence[tuple[str, int | None, dict[str, Any] | None]]
                          ) -> list[dict[str, Any] | AgentGymError]:
        body = {"resets": [{"session_id": s, "seed": seed, "options": opt} for s, seed, opt in resets]}
        return [_item_or_error(r) for r in (await self.request("POST", "/batch/reset", body))["results"]]


class AsyncRemoteEnv:
    """Asynchronous ``RemoteEnv``: ``await env.reset(...)``, ``await env.step(...)``.

    Create with ``await AsyncRemoteEnv.create(client, "maze-v0")``.
    """

    def __init__(self, client: AsyncEnvClient, session: dict[str, Any]) -> None:
        self.client = client
        self._closed = False
        RemoteEnv._adopt(self, session)  # type: ignore[arg-type]

    @classmethod
    async def create(cls, client: AsyncEnvClient, env_id: str, *, max_turns: int | None = None,
                     **kwargs: Any) -> AsyncRemoteEnv:
        return cls(client, await client.request("POST", "/sessions", _create_body(env_id, kwargs, max_turns)))

    @property
    def _path(self) -> str:
        return f"/sessions/{self.session_id}"

    async def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        if self._closed:
            raise _closed_error()
        try:
            return await self.client.request("POST", f"{self._path}{path}", body)
        except EnvCrashed:
            self.episode_over = True
            raise

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                    ) -> tuple[str, dict[str, Any]]:
        result = await self._call("/reset", _reset_body(seed, options))
        self.turn, self.episode_seed, self.episode_over = 0, result["episode_seed"], False
        return result["observation"], result["info"]

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        r = await self._call("/step", _step_body(action))
        self.turn, self.episode_over = r["turn"], r["terminated"] or r["truncated"]
        return r["observation"], r["reward"], r["terminated"], r["truncated"], r["info"]

    async def fork(self, mode: str = "auto") -> AsyncRemoteEnv:
        return AsyncRemoteEnv(self.client, await self._call("/fork", _fork_body(mode)))

    async def expert_action(self) -> str | None:
        return (await self._call("/expert"))["action"]

    async def session_info(self) -> dict[str, Any]:
        return await self.client.request("GET", self._path)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.client.request("DELETE", self._path)
        except AgentGymError:
            pass
