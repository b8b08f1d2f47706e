"""``agentgym serve --workers N``: env-worker processes behind one address, sessions pinned to their
process, a killed worker failing only its own sessions and replaced."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from maze_collection import MAX_TURNS, MAZE, AtTurn, ForkAndTopUp, collect

import agentgym
from agentgym.errors import SessionLost
from agentgym.http.client import EnvClient, RemoteEnv
from agentgym.http.fleet import EnvFleet
from agentgym.service_kit.launcher import free_port, start_service, stop_service

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def service() -> Iterator[tuple[str, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "agentgym"), "serve", "maze-v0", "--port", str(port),
               "--workers", "2", "--max-sessions", "64", "--log-level", "error"]
    process = start_service(command, url, timeout_s=120)
    pids: list[int] = []
    try:
        yield url, process
        pids = [w["pid"] for w in workers(url)]
    finally:
        stop_service(process)
    for pid in pids:  # stopping the service stops its workers
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def workers(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/health").json()["workers"]


def wait_replaced(url: str, index: int, generation: int, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker = workers(url)[index]
        if worker["generation"] == generation and worker["ready"]:
            return worker
        time.sleep(0.1)
    raise AssertionError(f"worker {index} was not replaced within {timeout_s} s: {workers(url)}")


def test_sessions_are_spread_and_pinned_to_their_process(service) -> None:
    url, _ = service
    health = httpx.get(f"{url}/health").json()
    assert len(health["workers"]) == 2 and health["max_sessions"] == 64
    assert len({w["pid"] for w in health["workers"]}) == 2
    with EnvClient(url) as client:
        envs = [RemoteEnv("maze-v0", client=client) for _ in range(4)]
        assert sorted(e.session_id[:5] for e in envs) == ["w0g0-", "w0g0-", "w1g0-", "w1g0-"]
        for env in envs:
            env.reset(seed=5)
        envs[0].step("up")
        envs[0].step("left")
        # Same seed in both processes: stepping one session never moves another.
        assert [e.session_info()["turn"] for e in envs] == [2, 0, 0, 0]
        local = agentgym.make("maze-v0")
        local.reset(seed=5)
        assert envs[1].step("down")[0] == local.step("down")[0]
        assert httpx.get(f"{url}/health").json()["active_sessions"] == 4
        for env in envs:
            env.close()
    assert httpx.get(f"{url}/health").json()["active_sessions"] == 0
    metrics = httpx.get(f"{url}/metrics").text
    assert 'worker="0"' in metrics and 'worker="1"' in metrics


def test_a_killed_worker_fails_only_its_sessions_and_is_replaced(service) -> None:
    url, _ = service
    with EnvClient(url, retries=0) as client:
        envs = [RemoteEnv("maze-v0", client=client) for _ in range(4)]
        for env in envs:
            env.reset(seed=1)
        victim = workers(url)[1]
        os.kill(victim["pid"], signal.SIGKILL)
        replacement = wait_replaced(url, 1, 1)
        assert replacement["pid"] != victim["pid"]
        for env in envs:
            if env.session_id.startswith("w1g0-"):
                with pytest.raises(SessionLost, match=rf"env-worker process 1 \(pid {victim['pid']}\), "
                                                      "which was killed by SIGKILL; its episode is lost"):
                    env.step("up")
            else:
                env.step("up")  # the other process's sessions go on
        answer = httpx.post(f"{url}/batch/step", json={"steps": [
            {"session_id": e.session_id, "action": "up"} for e in envs]}).json()["results"]
        assert [("error" in r) for r in answer] == [e.session_id.startswith("w1g0-") for e in envs]
        fresh = [RemoteEnv("maze-v0", client=client) for _ in range(2)]
        assert any(e.session_id.startswith("w1g1-") for e in fresh)  # the replacement takes new sessions
        assert all(e.reset(seed=1)[0] == envs[0].reset(seed=1)[0] for e in fresh)
    assert httpx.get(f"{url}/health").json()["worker_restarts"] == 1


def test_a_fleet_replays_the_episodes_of_a_killed_worker(service) -> None:
    url, _ = service
    expected = collect(lambda: agentgym.make("maze-v0", max_turns=MAX_TURNS, **MAZE), ForkAndTopUp())
    fleet = EnvFleet([url], "maze-v0", kwargs=MAZE, max_turns=MAX_TURNS)
    kill = AtTurn(2, lambda: os.kill(workers(url)[0]["pid"], signal.SIGKILL))
    assert collect(fleet, kill) == expected
    assert fleet.recovered > 0


def test_a_frozen_worker_times_out_its_own_sessions_only() -> None:
    from conftest import LiveServer

    from agentgym.errors import RemoteTimeout
    from agentgym.http.router import WorkerRouter
    from agentgym.http.workers import WorkerSet

    server = LiveServer(WorkerRouter(WorkerSet(2, {"env_ids": ["maze-v0"], "max_sessions": 8}),
                                     timeout_s=2.0),
                        startup_timeout_s=120)
    frozen = None
    try:
        with EnvClient(server.url, retries=0) as client:
            envs = [RemoteEnv("maze-v0", client=client) for _ in range(2)]
            for env in envs:
                env.reset(seed=0)
            frozen = workers(server.url)[1]["pid"]
            os.kill(frozen, signal.SIGSTOP)
            stuck = next(e for e in envs if e.session_id.startswith("w1"))
            alive = next(e for e in envs if e.session_id.startswith("w0"))
            started = time.monotonic()
            with pytest.raises(RemoteTimeout, match=rf"env-worker process 1 \(pid {frozen}\) did not answer"):
                stuck.step("up")
            assert time.monotonic() - started < 10
            answers = client.batch_step([(alive.session_id, "up"), (stuck.session_id, "up")])
            assert isinstance(answers[1], RemoteTimeout) and not isinstance(answers[0], Exception)
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        server.stop()


def test_a_frozen_worker_stalls_neither_health_nor_creates() -> None:
    from conftest import LiveServer

    from agentgym.http.router import WorkerRouter
    from agentgym.http.workers import WorkerSet

    # Steps on a frozen worker may wait the whole timeout_s (they may have run, so they are not resent);
    # /health answers within health_timeout_s and creates move on after silent_after_s.
    router = WorkerRouter(WorkerSet(2, {"env_ids": ["maze-v0"], "max_sessions": 8}, silent_after_s=2.0),
                          timeout_s=300.0, health_timeout_s=1.0)
    server = LiveServer(router, startup_timeout_s=120)
    frozen = None
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:  # far below timeout_s: a stall fails here
            first = http.post("/sessions", json={"env_id": "maze-v0"}).json()["session_id"]
            assert first.startswith("w0g0-")
            frozen = workers(server.url)[1]["pid"]
            os.kill(frozen, signal.SIGSTOP)
            health = http.get("/health")  # before the heartbeat notices: this request's own bound
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            assert [w["responding"] for w in health.json()["workers"]] == [True, False]
            # Worker 1 has fewer sessions, so the create goes there first, then to worker 0 once 1 is silent.
            created = http.post("/sessions", json={"env_id": "maze-v0"})
            assert created.status_code == 201, created.text
            assert created.json()["session_id"].startswith("w0g0-"), created.text
            # Unknown routes skip the silent worker too.
            assert http.get("/envs/maze-v0").status_code == 200
            assert http.post(f"/sessions/{first}/reset", json={"seed": 0}).status_code == 200
            silent = http.get("/health").json()["workers"][1]
            assert not silent["responding"] and silent["silent_s"] >= 2.0
            os.kill(frozen, signal.SIGCONT)
            frozen = None
            # The create worker 1 received while frozen runs now; the router deletes the session it makes.
            deadline = time.monotonic() + 30
            while ((router._withdrawn or http.get("/health").json()["status"] != "ok")
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            health = http.get("/health").json()
        assert health["status"] == "ok" and [w["sessions"] for w in health["workers"]] == [2, 0], health
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        server.stop()
