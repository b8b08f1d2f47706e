"""The HTTP clients: a remote env is indistinguishable from a local one, and retries are safe."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import TEST_ENV_IDS

import agentgym
from agentgym.errors import (
    AuthenticationError,
    ConfigError,
    EnvContractError,
    EnvCrashed,
    EpisodeFinished,
    RemoteEnvError,
    RemoteTimeout,
    RequestRejected,
    ResetNeeded,
    SessionCapacityError,
    UnknownEnv,
    UnknownSession,
    VersionNotFound,
)
from agentgym.http.client import AsyncEnvClient, AsyncRemoteEnv, EnvClient, RemoteEnv
from agentgym.http.server import create_app

pytestmark = pytest.mark.timeout(60)

PARITY_ENV_IDS = ["test/http-counter-v0", "test/http-counter-replay-v0", "maze-v0", "sokoban-v0"]


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.fixture
def client(make_service: Callable[..., Any]) -> EnvClient:
    return EnvClient(client=make_service(TEST_ENV_IDS + ["maze-v0", "sokoban-v0"], max_sessions=32))


def play(env: Any, seed: int, actions: list[str] | None = None,
         max_steps: int = 200) -> tuple[list[Any], list[str]]:
    """Reset and step (the given actions, or else the env's expert); returns the trajectory and actions."""
    obs, info = env.reset(seed=seed)
    trajectory: list[Any] = [("reset", obs, jsonable(info))]
    taken: list[str] = []
    for index in range(max_steps if actions is None else len(actions)):
        action = actions[index] if actions is not None else (env.expert_action() or "noop")
        obs, reward, terminated, truncated, info = env.step(action)
        taken.append(action)
        trajectory.append((obs, reward, terminated, truncated, jsonable(info)))
        if terminated or truncated:
            break
    return trajectory, taken


@pytest.mark.parametrize("env_id", PARITY_ENV_IDS)
def test_local_and_remote_trajectories_are_identical(client: EnvClient, env_id: str) -> None:
    for seed in (0, 1, 2):
        local = agentgym.make(env_id)
        with RemoteEnv(env_id, client=client) as remote:
            local_traj, actions = play(local, seed)
            remote_traj, remote_actions = play(remote, seed)
            assert remote_traj == local_traj
            assert remote_actions == actions
            assert remote.turn == local.turn and remote.episode_seed == local.episode_seed == seed
            assert remote.episode_over and local.episode_over
            # A few non-expert moves too (invalid ones included), replayed on both.
            moves = ["inc", "dec", "up", "left", "jump", "down", "right", "inc"]
            local_traj, _ = play(local, seed + 100, moves)
            remote_traj, _ = play(remote, seed + 100, moves)
            assert remote_traj == local_traj


@pytest.mark.parametrize("env_id", PARITY_ENV_IDS)
@pytest.mark.parametrize("mode", ["auto", "replay"])
def test_fork_parity(client: EnvClient, env_id: str, mode: str) -> None:
    local = agentgym.make(env_id)
    remote = RemoteEnv(env_id, client=client)
    seed, k = 5, 2
    for env in (local, remote):
        env.reset(seed=seed)
    prefix = []
    for _ in range(k):
        action = local.expert_action()
        assert remote.expert_action() == action
        prefix.append(action)
        assert jsonable(local.step(action)) == jsonable(remote.step(action))
    local_child, remote_child = local.fork(mode), remote.fork(mode)
    assert remote_child.session_id != remote.session_id and remote_child.turn == k
    # Both children continue with the expert of the local child; the parents take another path.
    for _ in range(30):
        action = local_child.expert_action() or "noop"
        local_result = local_child.step(action)
        assert jsonable(remote_child.step(action)) == jsonable(local_result)
        if local_result[2] or local_result[3]:
            break
    for action in ["left", "inc", "up"]:
        if local.episode_over:
            break
        assert jsonable(remote.step(action)) == jsonable(local.step(action))
    remote_child.close()
    remote.close()


def test_remote_exceptions_are_the_local_classes(client: EnvClient) -> None:
    local = agentgym.make("test/http-counter-v0")
    remote = RemoteEnv("test/http-counter-v0", client=client)

    def both(call: Callable[[Any], Any], exc: type[Exception], pair: tuple[Any, Any] | None = None) -> None:
        local_env, remote_env = pair or (local, remote)
        with pytest.raises(exc) as local_info:
            call(local_env)
        with pytest.raises(exc) as remote_info:
            call(remote_env)
        assert type(remote_info.value) is type(local_info.value)

    both(lambda env: env.step("inc"), ResetNeeded)
    both(lambda env: env.fork(), ResetNeeded)
    both(lambda env: env.expert_action(), ResetNeeded)
    both(lambda env: env.reset(seed=-1), ConfigError)
    both(lambda env: env.reset(seed="3"), ConfigError)
    both(lambda env: env.reset(seed=1, options=[1]), ConfigError)
    for env in (local, remote):
        env.reset(seed=0)
    both(lambda env: env.step(3), EnvContractError)
    both(lambda env: env.fork("clone"), ConfigError)
    for _ in range(4):
        local.step("inc"), remote.step("inc")
    both(lambda env: env.step("inc"), EpisodeFinished)
    # Registry and construction errors.
    with pytest.raises(UnknownEnv, match="test/http-counter-v0"):
        agentgym.make("test/http-countr-v0")
    with pytest.raises(UnknownEnv, match="test/http-counter-v0"):
        RemoteEnv("test/http-countr-v0", client=client)
    with pytest.raises(VersionNotFound):
        agentgym.make("test/http-counter-v7")
    with pytest.raises(VersionNotFound):
        RemoteEnv("test/http-counter-v7", client=client)
    with pytest.raises(ConfigError, match="spam"):
        agentgym.make("test/http-counter-v0", spam=1)
    with pytest.raises(ConfigError, match="spam"):
        RemoteEnv("test/http-counter-v0", client=client, spam=1)
    with pytest.raises(ConfigError):
        agentgym.make("test/http-counter-v0", max_turns=0)
    with pytest.raises(ConfigError):
        RemoteEnv("test/http-counter-v0", client=client, max_turns=0)
    # A crash is EnvCrashed on both sides, and reset recovers both.
    local_crashy = agentgym.make("test/http-crashy-v0")
    remote_crashy = RemoteEnv("test/http-crashy-v0", client=client)
    for env in (local_crashy, remote_crashy):
        env.reset(seed=0)
    both(lambda env: env.step("crash"), EnvCrashed, (local_crashy, remote_crashy))
    assert local_crashy.episode_over and remote_crashy.episode_over
    both(lambda env: env.step("inc"), EpisodeFinished, (local_crashy, remote_crashy))
    assert jsonable(local_crashy.reset(seed=1)) == jsonable(remote_crashy.reset(seed=1))
    # A closed env refuses to be used, on both sides.
    for env in (local, remote):
        env.close()
    both(lambda env: env.reset(seed=0), EnvContractError)


def test_close_is_idempotent_and_deletes_the_session(client: EnvClient) -> None:
    remote = RemoteEnv("test/http-counter-v0", client=client)
    session_id = remote.session_id
    assert client.request("GET", f"/sessions/{session_id}")["session_id"] == session_id
    remote.close()
    remote.close()
    with pytest.raises(UnknownSession):
        client.request("GET", f"/sessions/{session_id}")
    # Closing a session the service already forgot is fine too.
    other = RemoteEnv("test/http-counter-v0", client=client)
    client.request("DELETE", f"/sessions/{other.session_id}")
    other.close()
    assert client.health()["active_sessions"] == 0


def test_service_level_calls(client: EnvClient) -> None:
    assert client.health()["status"] == "ok"
    assert "test/http-counter-v0" in [e["id"] for e in client.list_envs()]
    assert client.env_detail("test/http-counter-v0")["max_turns"] == 8
    with pytest.raises(UnknownEnv):
        client.env_detail("test/nope-v0")


def test_batch_step_matches_single_steps(client: EnvClient) -> None:
    envs = [RemoteEnv("test/http-counter-v0", client=client) for _ in range(4)]
    locals_ = [agentgym.make("test/http-counter-v0") for _ in range(4)]
    resets = client.batch_reset([(env.session_id, seed, None) for seed, env in enumerate(envs)])
    for seed, (result, local) in enumerate(zip(resets, locals_, strict=True)):
        obs, info = local.reset(seed=seed)
        assert result == {"observation": obs, "info": jsonable(info), "episode_seed": seed}
    results = client.batch_step([(env.session_id, "inc") for env in envs] + [("ghost", "inc")])
    assert isinstance(results[-1], UnknownSession)
    for result, local in zip(results[:-1], locals_, strict=True):
        obs, reward, terminated, truncated, info = local.step("inc")
        assert result == {"observation": obs, "reward": reward, "terminated": terminated,
                          "truncated": truncated, "info": jsonable(info), "turn": 1}


def test_async_clients_give_the_same_results() -> None:
    async def scenario() -> None:
        app = create_app(["test/http-counter-v0", "maze-v0"])
        transport = httpx.ASGITransport(app=app)
        async with AsyncEnvClient("http://svc", transport=transport) as client:
            assert (await client.health())["status"] == "ok"
            assert [e["id"] for e in await client.list_envs()] == ["test/http-counter-v0", "maze-v0"]
            for env_id in ("test/http-counter-v0", "maze-v0"):
                local = agentgym.make(env_id)
                remote = await AsyncRemoteEnv.create(client, env_id)
                obs, info = local.reset(seed=4)
                assert await remote.reset(seed=4) == (obs, jsonable(info))
                for _ in range(3):
                    action = local.expert_action()
                    assert await remote.expert_action() == action
                    assert jsonable(await remote.step(action)) == jsonable(local.step(action))
                child, local_child = await remote.fork(), local.fork()
                action = local_child.expert_action()
                assert jsonable(await child.step(action)) == jsonable(local_child.step(action))
                await child.close()
                await remote.close()
                await remote.close()
            # Exceptions map to the local classes.
            remote = await AsyncRemoteEnv.create(client, "test/http-counter-v0")
            with pytest.raises(ResetNeeded):
                await remote.step("inc")
            with pytest.raises(ConfigError):
                await remote.reset(seed=-2)
            with pytest.raises(UnknownEnv):
                await AsyncRemoteEnv.create(client, "test/http-countr-v0")
            # Batched steps over many sessions equal local steps.
            envs = [await AsyncRemoteEnv.create(client, "test/http-counter-v0") for _ in range(8)]
            locals_ = [agentgym.make("test/http-counter-v0") for _ in range(8)]
            await client.batch_reset([(env.session_id, seed, None) for seed, env in enumerate(envs)])
            for seed, local in enumerate(locals_):
                local.reset(seed=seed)
            for turn in range(1, 4):
                results = await client.batch_step([(env.session_id, "inc") for env in envs])
                for result, local in zip(results, locals_, strict=True):
                    obs, reward, terminated, truncated, info = local.step("inc")
                    assert result == {"observation": obs, "reward": reward, "terminated": terminated,
                                      "truncated": truncated, "info": jsonable(info), "turn": turn}
            results = await client.batch_step([(envs[0].session_id, "inc"), ("ghost", "inc")])
            assert isinstance(results[1], UnknownSession) and results[0]["turn"] == 4
        await app.state.store.stop()

    asyncio.run(scenario())


def test_auth_and_size_errors_map_to_classes(make_service: Callable[..., Any]) -> None:
    service = make_service(["test/http-counter-v0"], token="tok", max_body_bytes=2048, max_sessions=1)
    with pytest.raises(AuthenticationError):
        RemoteEnv("test/http-counter-v0", client=EnvClient(client=service))
    good = EnvClient(client=service, token="tok")
    env = RemoteEnv("test/http-counter-v0", client=good)
    env.reset(seed=0)
    with pytest.raises(RequestRejected, match="2048"):
        env.step("x" * 5000)
    with pytest.raises(SessionCapacityError):
        RemoteEnv("test/http-counter-v0", client=good)
    assert env.step("inc")[0].startswith("[inc]")


# --- retries only where safe -----------------------------------------------------------------------


class Scripted:
    """A MockTransport handler that raises or answers from a script and counts calls per method."""

    def __init__(self, *script: Exception | httpx.Response) -> None:
        self.script = list(script)
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request.method)
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, Exception):
            raise item
        return item


def sync_client(handler: Scripted, retries: int = 2) -> EnvClient:
    return EnvClient(client=httpx.Client(transport=httpx.MockTransport(handler), base_url="http://svc"),
                     retries=retries)


def test_post_is_not_retried_after_a_read_timeout() -> None:
    handler = Scripted(httpx.ReadTimeout("slow"))
    with pytest.raises(RemoteTimeout):
        sync_client(handler).request("POST", "/sessions/abc/step", {"action": "inc"})
    assert handler.calls == ["POST"]
    handler = Scripted(httpx.RemoteProtocolError("server hung up"))
    with pytest.raises(RemoteEnvError):
        sync_client(handler).request("POST", "/sessions/abc/step", {"action": "inc"})
    assert handler.calls == ["POST"]


def test_post_is_not_retried_on_503_or_5xx() -> None:
    busy = httpx.Response(503, headers={"Retry-After": "0"},
                          json={"error": {"type": "SessionCapacityError", "message": "full"}})
    handler = Scripted(busy)
    with pytest.raises(SessionCapacityError, match="full"):
        sync_client(handler).request("POST", "/sessions", {"env_id": "x"})
    assert handler.calls == ["POST"]


def test_get_is_retried_after_a_read_timeout_and_on_503() -> None:
    ok = httpx.Response(200, json={"status": "ok"})
    handler = Scripted(httpx.ReadTimeout("slow"), ok)
    assert sync_client(handler).request("GET", "/health") == {"status": "ok"}
    assert handler.calls == ["GET", "GET"]
    busy = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"},
                          json={"error": {"type": "SessionCapacityError", "message": "full"}})
    handler = Scripted(busy, ok)
    assert sync_client(handler).request("GET", "/health") == {"status": "ok"}
    assert handler.calls == ["GET", "GET"]
    handler = Scripted(httpx.ReadTimeout("slow"))
    with pytest.raises(RemoteTimeout):
        sync_client(handler, retries=2).request("GET", "/health")
    assert handler.calls == ["GET"] * 3


def test_connection_failures_are_retried_for_every_method() -> None:
    ok = httpx.Response(200, json={"observation": "o"})
    for error in (httpx.ConnectError("refused"), httpx.ConnectTimeout("no answer"),
                  httpx.PoolTimeout("full")):
        handler = Scripted(error, ok)
        answer = sync_client(handler).request("POST", "/sessions/abc/step", {"action": "inc"})
        assert answer == {"observation": "o"}
        assert handler.calls == ["POST", "POST"]
    handler = Scripted(httpx.ConnectError("refused"))
    with pytest.raises(RemoteEnvError, match="ConnectError"):
        sync_client(handler, retries=1).request("POST", "/sessions", {"env_id": "x"})
    assert handler.calls == ["POST", "POST"]


def test_async_retries_follow_the_same_rules() -> None:
    async def scenario() -> None:
        ok = httpx.Response(200, json={"status": "ok"})
        cases = [("POST", Scripted(httpx.ReadTimeout("slow")), RemoteTimeout, 1),
                 ("GET", Scripted(httpx.ReadTimeout("slow"), ok), None, 2),
                 ("POST", Scripted(httpx.ConnectError("refused"), ok), None, 2)]
        for method, handler, exc, calls in cases:
            client = AsyncEnvClient("http://svc", transport=httpx.MockTransport(handler))
            if exc is None:
                assert await client.request(method, "/x", None if method == "GET" else {}) == {"status": "ok"}
            else:
                with pytest.raises(exc):
                    await client.request(method, "/x", {})
            assert handler.calls == [method] * calls
            await client.aclose()

    asyncio.run(scenario())


def test_unexpected_error_bodies_fall_back_to_the_status() -> None:
    for status, body, exc in ((502, b"<html>bad gateway</html>", RemoteEnvError),
                              (504, b"gateway timeout", RemoteTimeout),
                              (401, b"", AuthenticationError),
                              (404, b'{"error": {"type": "NotFound", "message": "no route"}}',
                               RemoteEnvError),
                              (409, b'{"error": {"type": "SomethingNew", "message": "m"}}', RemoteEnvError)):
        handler = Scripted(httpx.Response(status, content=body))
        with pytest.raises(exc):
            sync_client(handler, retries=0).request("GET", "/health")
