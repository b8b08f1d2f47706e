"""EnvFleet: batched collection over real services on loopback, forks included, and what it does
when a service dies, answers 503, hangs, or answers garbage mid-collection."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer
from maze_collection import MAX_TURNS, MAZE, AtTurn, ForkAndTopUp, collect, local_envs

import agentgym
from agentgym.errors import ConfigError, EpisodeFinished, RemoteEnvError
from agentgym.http.fleet import EnvFleet
from agentgym.service_kit.launcher import free_port, start_service, stop_service

pytestmark = pytest.mark.timeout(300)

def serve_process(port: int) -> Any:
    command = [str(Path(sys.executable).parent / "agentgym"), "serve", "maze-v0", "--port", str(port),
               "--log-level", "error"]
    return start_service(command, f"http://127.0.0.1:{port}", timeout_s=90)


@pytest.fixture
def two_services() -> Iterator[tuple[list[str], list[Any]]]:
    ports = [free_port(), free_port()]
    processes = []
    try:
        for port in ports:
            processes.append(serve_process(port))
        yield [f"http://127.0.0.1:{p}" for p in ports], processes
    finally:
        for process in processes:
            stop_service(process)


def test_a_fleet_collects_what_local_envs_collect_forks_included(live_server) -> None:
    servers = [live_server(["maze-v0"]), live_server(["maze-v0"])]
    expected = collect(local_envs, ForkAndTopUp())
    fleet = EnvFleet([s.url for s in servers], "maze-v0", kwargs=MAZE, max_turns=MAX_TURNS)
    assert collect(fleet, ForkAndTopUp()) == expected
    assert any(t["parent_id"] for g in expected for t in g["trajectories"])
    assert fleet.recovered == 0


def test_a_fleet_lists_the_task_splits_of_its_env_with_its_kwargs(live_server) -> None:
    # the catalog's size (a kwarg) sets webshop-v0's splits: 450/50 goals by default, 54/6 with 60 products
    servers = [live_server(["webshop-v0"]), live_server(["webshop-v0"])]
    fleet = EnvFleet([s.url for s in servers], "webshop-v0", kwargs={"num_products": 60})
    local = agentgym.make("webshop-v0", num_products=60)
    try:
        assert fleet.task_splits() == local.task_splits()
        assert [split.size for split in fleet.task_splits()] != [450, 50]
        assert fleet.task("test", 5) == local.task("test", 5)
        with pytest.raises(ConfigError, match="no task split 'nope'"):
            fleet.task("nope", 0)
    finally:
        fleet.close()


def test_sessions_go_to_the_least_loaded_service(live_server) -> None:
    servers = [live_server(["maze-v0"]), live_server(["maze-v0"])]
    busy = EnvFleet([servers[0].url], "maze-v0")
    held = busy.open(4)  # another client's sessions on the first service
    fleet = EnvFleet([s.url for s in servers], "maze-v0")
    try:
        fleet.open(6)
        assert [r["sessions"] for r in fleet.describe()] == [1, 5]  # 4 + 1 == 5: then balanced
    finally:
        fleet.close()
        busy.release(held)
        busy.close()


def test_a_service_killed_mid_collection_loses_no_episode(two_services) -> None:
    urls, processes = two_services
    expected = collect(local_envs, ForkAndTopUp())
    fleet = EnvFleet(urls, "maze-v0", kwargs=MAZE, max_turns=MAX_TURNS, timeout_s=10, health_interval_s=60)
    killed = AtTurn(2, lambda: os.kill(processes[1].pid, signal.SIGKILL))
    got = collect(fleet, killed)
    assert got == expected  # every group whole, every trajectory once, each exactly as without the failure
    assert [len(g["trajectories"]) for g in got] == [len(g["trajectories"]) for g in expected]
    assert fleet.recovered > 0 and fleet.replayed_steps > 0
    assert [r["alive"] for r in fleet.describe()] == [True, False]


def test_every_service_dead_is_one_error_naming_each() -> None:
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with pytest.raises(RemoteEnvError, match="no env service of the fleet answers") as caught:
        EnvFleet(urls, "maze-v0", timeout_s=2, retries=1)
    assert all(url in str(caught.value) for url in urls)


def test_a_fleet_refuses_a_service_that_does_not_serve_the_env(live_server) -> None:
    server = live_server(["test/http-counter-v0"])
    with pytest.raises(ConfigError, match=r"does not serve 'maze-v0'.*agentgym serve maze-v0"):
        EnvFleet([server.url], "maze-v0")
    with pytest.raises(ConfigError, match="non-empty list"):
        EnvFleet([], "maze-v0")


def test_env_errors_are_raised_with_the_service_and_session(live_server) -> None:
    server = live_server(["maze-v0"])
    fleet = EnvFleet([server.url], "maze-v0", max_turns=1)
    try:
        [slot] = fleet.open(1)
        fleet.reset([slot], [0])
        fleet.step([slot], ["up"])
        with pytest.raises(EpisodeFinished, match=f"{server.url} session {slot.session_id}: "):
            fleet.step([slot], ["up"])
    finally:
        fleet.close()
    assert fleet.describe()[0]["sessions"] == 0


class Faulty:
    """An env service app that, once ``fault`` is set, answers every ``/batch/...`` request badly."""

    def __init__(self, app: Any) -> None:
        self.app, self.fault, self.faulted, self.fault_body = app, None, 0, b"{}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.fault and scope["path"].startswith(("/batch/", "/sessions")):
            self.faulted += 1
            fault = self.fault
            if fault == "busy-once":  # one 503, then normal service: a retry, no failover
                self.fault = None
            if fault == "hang":
                await asyncio.sleep(3.0)
            if fault == "items" and scope["path"].startswith("/batch/"):  # the right count of empty items
                request = await receive()
                count = len(next(iter(json.loads(request["body"]).values())))
                self.fault_body = json.dumps({"results": [{}] * count}).encode()
            status, body, headers = {
                "503": (503, b'{"error": {"type": "SessionCapacityError", "message": "busy"}}',
                        [(b"retry-after", b"0")]),
                "busy-once": (503, b'{"error": {"type": "SessionCapacityError", "message": "busy"}}',
                              [(b"retry-after", b"0.2")]),
                "garbage": (200, b'{"results": "not a list"}', []),
                "items": (200, self.fault_body, []),
                "hang": (200, b"{}", []),
            }[fault]
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"), *headers]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


@pytest.mark.parametrize("fault", ["503", "hang", "garbage", "items", "refused"])
def test_a_misbehaving_service_fails_over_without_losing_episodes(fault: str) -> None:
    from agentgym.http.server import create_app

    faulty = Faulty(create_app(["maze-v0"]))
    servers = [LiveServer(faulty), LiveServer(create_app(["maze-v0"]))]
    try:
        expected = collect(local_envs, ForkAndTopUp())

        def misbehave() -> None:
            if fault == "refused":
                servers[0].stop()
            else:
                faulty.fault = fault

        fleet = EnvFleet([s.url for s in servers], "maze-v0", kwargs=MAZE, max_turns=MAX_TURNS, timeout_s=1.0,
                         retries=1, health_interval_s=60)
        assert collect(fleet, AtTurn(2, misbehave)) == expected
        assert fleet.recovered > 0
        first = fleet.describe()[0]
        assert first["alive"] is False and first["url"] in first["last_error"]
    finally:
        for server in servers:
            if server.thread.is_alive():
                server.stop()


def test_a_busy_answer_with_retry_after_is_retried_not_failed_over() -> None:
    from agentgym.http.server import create_app

    faulty = Faulty(create_app(["maze-v0"]))
    server = LiveServer(faulty)
    try:
        expected = collect(local_envs, ForkAndTopUp())
        fleet = EnvFleet([server.url], "maze-v0", kwargs=MAZE, max_turns=MAX_TURNS, retries=2)
        got = collect(fleet, AtTurn(2, lambda: setattr(faulty, "fault", "busy-once")))
        assert got == expected and faulty.faulted == 1
        assert fleet.recovered == 0 and fleet.describe()[0]["alive"]
    finally:
        server.stop()


def test_training_on_a_fleet_equals_training_in_process(live_server, tmp_path: Path) -> None:
    from agentgym.training import load_config
    from agentgym.training.run.loop import env_factory, train

    servers = [live_server(["maze-v0"]), live_server(["maze-v0"])]
    small = ["iterations=2", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2",
             "eval.num_episodes=2", "sft.enabled=false", "env.max_turns=3"]
    urls = "env.urls=[" + ", ".join(f'"{s.url}"' for s in servers) + "]"
    fleet_cfg = load_config(None, [*small, urls])
    made = env_factory(fleet_cfg)
    assert isinstance(made, EnvFleet) and [r["url"] for r in made.describe()] == [s.url for s in servers]
    made.close()
    local = train(load_config(None, small), tmp_path / "local")
    remote = train(fleet_cfg, tmp_path / "fleet")

    def strip(h: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in h]

    assert strip(remote["history"]) == strip(local["history"])
    assert all(s.thread.is_alive() for s in servers)
    assert httpx_active(servers) == 0  # the run deleted its sessions


def httpx_active(servers: list[LiveServer]) -> int:
    import httpx

    return sum(httpx.get(f"{s.url}/health").json()["active_sessions"] for s in servers)
