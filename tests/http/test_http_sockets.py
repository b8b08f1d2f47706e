"""The env service over real sockets: uvicorn on 127.0.0.1, a random port, shut down after each test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from conftest import SlowEnv

import agentgym
from agentgym.errors import AuthenticationError, EpisodeFinished, UnknownSession
from agentgym.http.client import EnvClient, RemoteEnv

pytestmark = pytest.mark.timeout(60)


def jsonable(value: Any) -> Any:
    """What a value looks like after a JSON round trip (tuples become lists)."""
    return tuple(json.loads(json.dumps(value)))


def test_an_episode_over_http_matches_the_local_one(live_server: Callable[..., Any]) -> None:
    server = live_server(["maze-v0", "test/http-counter-v0"], token="tok")
    with pytest.raises(AuthenticationError):
        RemoteEnv("maze-v0", base_url=server.url, retries=0)
    local = agentgym.make("maze-v0")
    with RemoteEnv("maze-v0", base_url=server.url, token="tok") as remote:
        assert remote.reset(seed=3) == jsonable(local.reset(seed=3))
        while True:
            action = local.expert_action()
            assert remote.expert_action() == action
            result = remote.step(action)
            assert result == jsonable(local.step(action))
            if result[2] or result[3]:
                break
        assert result[4]["success"]
        with pytest.raises(EpisodeFinished):
            remote.step("up")
        session_id = remote.session_id
    with EnvClient(server.url, token="tok") as client, pytest.raises(UnknownSession):
        client.request("GET", f"/sessions/{session_id}")


def test_sixteen_sessions_in_one_batch(live_server: Callable[..., Any]) -> None:
    server = live_server()
    with EnvClient(server.url) as client:
        envs = [RemoteEnv("test/http-counter-v0", client=client) for _ in range(16)]
        locals_ = [agentgym.make("test/http-counter-v0") for _ in range(16)]
        resets = client.batch_reset([(env.session_id, seed, None) for seed, env in enumerate(envs)])
        assert [r["episode_seed"] for r in resets] == list(range(16))
        for seed, local in enumerate(locals_):
            assert local.reset(seed=seed)[0] == resets[seed]["observation"]
        for turn in range(1, 5):
            results = client.batch_step([(env.session_id, "inc") for env in envs])
            for result, local in zip(results, locals_, strict=True):
                obs, reward, terminated, truncated, info = local.step("inc")
                assert result == {"observation": obs, "reward": reward, "terminated": terminated,
                                  "truncated": truncated, "info": json.loads(json.dumps(info)), "turn": turn}
        assert all(r["terminated"] and r["info"]["success"] for r in results)  # span 4: solved at turn 4
        assert client.health()["active_sessions"] == 16
        for env in envs:
            env.close()
        assert client.health()["active_sessions"] == 0


def test_a_slow_step_does_not_block_other_sessions(live_server: Callable[..., Any]) -> None:
    server = live_server(step_timeout_s=30)
    with EnvClient(server.url) as client:
        slow = RemoteEnv("test/http-slow-v0", client=client, delay_s=3.0)
        fast = RemoteEnv("test/http-counter-v0", client=client, max_turns=1000)
        slow.reset(seed=0)
        fast.reset(seed=0)
        events: list[tuple[str, float]] = []
        sleeps = SlowEnv.sleeps_started()

        def slow_step() -> None:
            slow.step("sleep")
            events.append(("slow done", time.monotonic()))

        thread = threading.Thread(target=slow_step)
        thread.start()
        assert SlowEnv.wait_for_sleeps(sleeps + 1)  # the slow step is now running in the service's pool
        for index in range(20):
            fast.step("inc" if index % 2 == 0 else "dec")
            events.append(("fast", time.monotonic()))
        # Reading a session's state does not wait for its running step.
        assert client.request("GET", f"/sessions/{slow.session_id}")["turn"] == 0
        thread.join(timeout=30)
        assert not thread.is_alive()
        order = [name for name, _ in events]
        assert order == ["fast"] * 20 + ["slow done"], order
        assert slow.turn == 1
        slow.close()
        fast.close()


def test_health_answers_while_env_code_runs(live_server: Callable[..., Any]) -> None:
    """Env code runs in the pool, so even a busy service answers its event-loop routes at once."""
    server = live_server(step_timeout_s=30)
    with EnvClient(server.url) as client:
        slow = RemoteEnv("test/http-slow-v0", client=client, delay_s=2.0)
        slow.reset(seed=0)
        done = threading.Event()
        sleeps = SlowEnv.sleeps_started()
        thread = threading.Thread(target=lambda: (slow.step("sleep"), done.set()))
        thread.start()
        assert SlowEnv.wait_for_sleeps(sleeps + 1)  # env code is running in the pool now
        for _ in range(5):
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert not done.is_set()
        thread.join(timeout=30)
        assert done.is_set()
        slow.close()


def test_size_limit_and_errors_over_real_sockets(live_server: Callable[..., Any]) -> None:
    server = live_server(max_body_bytes=2048)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        sid = http.post("/sessions", json={"env_id": "test/http-counter-v0"}).json()["session_id"]
        assert http.post(f"/sessions/{sid}/reset", json={"seed": 0}).status_code == 200
        big = json.dumps({"action": "x" * 4000}).encode()

        def chunks():
            for start in range(0, len(big), 512):
                yield big[start:start + 512]

        for content in (big, chunks()):
            response = http.post(f"/sessions/{sid}/step", content=content,
                                 headers={"content-type": "application/json"})
            assert response.status_code == 413, response.text
            assert response.json()["error"]["type"] == "RequestRejected"
        response = http.post(f"/sessions/{sid}/step", content=b"{oops",
                             headers={"content-type": "application/json"})
        assert response.status_code == 422 and "not valid JSON" in response.json()["error"]["message"]
        response = http.post(f"/sessions/{sid}/step", json={"action": "inc"})
        assert response.status_code == 200 and response.json()["turn"] == 1
