"""Clients of the env service: ``RemoteEnv`` (an ``agentgym.Env``), ``AsyncRemoteEnv``, ``EnvClient``.

A ``RemoteEnv`` is a session on a service that behaves like the local env: same return values,
same exceptions (``ResetNeeded``, ``EpisodeFinished``, ``UnknownEnv``...), fork included. Errors are
mapped from the service's ``{"error": {"type", "message"}}`` body back to the class of that name.

Retries only where safe: idempotent requests (GET, DELETE) are retried on transport errors and
503; state-changing requests (create, reset, step, fork) only when the request was never sent
(connection refused, connect or pool timeout), so a retried step can never run twice.
"""

from __future__ import annotations

import asyncio
import numbers
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from agentgym.core import Env
from agentgym.errors import (
    ERRORS_BY_NAME,
    AgentGymError,
    AuthenticationError,
    ConfigError,
    EnvContractError,
    EnvCrashed,
    RemoteEnvError,
    RemoteTimeout,
    RequestRejected,
)

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_TIMEOUT_S = 60.0
#: Transport errors raised before the request left the client: retrying them cannot run a step twice.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_FORK_MODES = ("auto", "snapshot", "replay")
_STATUS_FALLBACK: dict[int, type[AgentGymError]] = {
    401: AuthenticationError, 413: RequestRejected, 422: RequestRejected, 504: RemoteTimeout,
}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json()["error"]
        kind, message = str(detail["type"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "", response.text[:500] or response.reason_phrase
    cls = ERRORS_BY_NAME.get(kind) or _STATUS_FALLBACK.get(response.status_code, RemoteEnvError)
    raise cls(message)


def _raise_item(result: dict[str, Any]) -> dict[str, Any]:
    if "error" in result:
        detail = result["error"]
        raise ERRORS_BY_NAME.get(detail["type"], RemoteEnvError)(detail["message"])
    return result


def _retry_after_s(response: httpx.Response) -> float:
    try:  # seconds; the HTTP-date form is legal too, and then a short default will do
        return min(max(float(response.headers.get("Retry-After", "0.5")), 0.0), 10.0)
    except ValueError:
        return 0.5


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
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise ConfigError(f"max_turns must be a positive integer or None, got {max_turns!r}")
    return {"env_id": env_id, "kwargs": kwargs, "max_turns": max_turns}


def _closed_error() -> EnvContractError:
    return EnvContractError("this env is closed (its session was deleted); make a new one")


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _transport_error(exc: httpx.HTTPError, method: str, url: str) -> RemoteEnvError:
    if isinstance(exc, httpx.TimeoutException):
        return RemoteTimeout(f"{method} {url} timed out on the client side ({type(exc).__name__})")
    return RemoteEnvError(f"{method} {url} failed: {type(exc).__name__}: {exc}")


class EnvClient:
    """Synchronous client of one env service: service-level calls and session requests.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"``.
        token: bearer token, if the service was started with one.
        timeout_s: per-request timeout (connect, read, write).
        retries: extra attempts for requests that are safe to repeat (see module docstring).
        client: an ``httpx.Client`` to use instead (tests pass FastAPI's ``TestClient``).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2, client: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._owns_client = client is None
        self._http = client or httpx.Client(
            base_url=self.base_url, timeout=timeout_s, headers=_headers(token),
            limits=httpx.Limits(max_keepalive_connections=64, max_connections=256),
        )
        if client is not None and token:
            self._http.headers.update(_headers(token))

    def request(self, method: str, path: str, json: Any = None) -> Any:
        idempotent = method in ("GET", "DELETE")
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, json=json)
            except _NOT_SENT as exc:  # nothing reached the service: always safe to retry
                if last:
                    raise _transport_error(exc, method, path) from exc
            except httpx.HTTPError as exc:
                if not idempotent or last:
                    raise _transport_error(exc, method, path) from exc
            else:
                if response.status_code == 503 and idempotent and not last:
                    time.sleep(_retry_after_s(response))
                    continue
                _raise_for(response)
                return None if response.status_code == 204 else response.json()
            time.sleep(min(0.1 * 2**attempt, 2.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def list_envs(self) -> list[dict[str, Any]]:
        return self.request("GET", "/envs")

    def env_detail(self, env_id: str) -> dict[str, Any]:
        return self.request("GET", f"/envs/{env_id}")

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

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _item_or_error(result: dict[str, Any]) -> dict[str, Any] | AgentGymError:
    try:
        return _raise_item(result)
    except AgentGymError as exc:
        return exc


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


class AsyncEnvClient:
    """Asynchronous twin of ``EnvClient`` (``httpx.AsyncClient``; pass ``transport=`` for in-process)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = 2,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_s, headers=_headers(token), transport=transport,
            limits=httpx.Limits(max_keepalive_connections=256, max_connections=512),
        )

    async def request(self, method: str, path: str, json: Any = None) -> Any:
        idempotent = method in ("GET", "DELETE")
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await self._http.request(method, path, json=json)
            except _NOT_SENT as exc:
                if last:
                    raise _transport_error(exc, method, path) from exc
            except httpx.HTTPError as exc:
                if not idempotent or last:
                    raise _transport_error(exc, method, path) from exc
            else:
                if response.status_code == 503 and idempotent and not last:
                    await asyncio.sleep(_retry_after_s(response))
                    continue
                _raise_for(response)
                return None if response.status_code == 204 else response.json()
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        raise AssertionError("unreachable")  # pragma: no cover

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

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


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
