"""``agentgym serve --workers N`` over idle periods: the router never reuses a connection its worker has
closed, so an idle session steps again, creates succeed, and a soak of create/reset/step/delete cycles
with pauses around the keep-alive sees no false ``SessionLost`` (410), no false 503 and no leaked env."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LiveServer

from agentgym.errors import ConfigError
from agentgym.http.router import WorkerRouter
from agentgym.http.workers import WorkerSet

pytestmark = pytest.mark.timeout(240)

#: uvicorn's own default keep-alive, which the workers used to run with: an idle longer than it
#: made the router reuse a connection the worker had closed.
UVICORN_DEFAULT_KEEP_ALIVE_S = 5.0


def start_router(**worker_options: Any) -> LiveServer:
    workers = WorkerSet(2, {"env_ids": ["maze-v0"], "max_sessions": 64}, **worker_options)
    return LiveServer(WorkerRouter(workers), startup_timeout_s=120)


@pytest.fixture
def router() -> Iterator[LiveServer]:
    server = start_router()
    try:
        yield server
    finally:
        server.stop()


def test_a_session_idle_longer_than_uvicorns_keep_alive_steps_again(router: LiveServer) -> None:
    with httpx.Client(base_url=router.url, timeout=30) as http:
        sid = http.post("/sessions", json={"env_id": "maze-v0"}).json()["session_id"]
        assert http.post(f"/sessions/{sid}/reset", json={"seed": 1}).status_code == 200
        assert http.get("/envs/maze-v0").status_code == 200  # pools a connection on the other worker too
        time.sleep(UVICORN_DEFAULT_KEEP_ALIVE_S + 1.0)  # the idle period is the scenario under test
        step = http.post(f"/sessions/{sid}/step", json={"action": "up"})
        assert step.status_code == 200, step.text
        assert step.json()["info"]["state_key"]
        assert http.get("/envs/maze-v0").status_code == 200
        created = http.post("/sessions", json={"env_id": "maze-v0"})
        assert created.status_code == 201, created.text
        assert http.delete(f"/sessions/{sid}").status_code == 204
        assert http.delete(f"/sessions/{created.json()['session_id']}").status_code == 204
        health = http.get("/health").json()
    assert health["worker_restarts"] == 0 and health["active_sessions"] == 0


def test_idling_past_every_keep_alive_costs_nothing() -> None:
    # Workers close idle connections after 1 s, the router stops reusing them after 0.5 s: an idle of
    # 2.5 s outlasts both, on every pooled connection of both workers.
    server = start_router(keep_alive_s=1.0, heartbeat_s=0.2, silent_after_s=1.0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            sids = [http.post("/sessions", json={"env_id": "maze-v0"}).json()["session_id"] for _ in range(2)]
            assert sorted(s[:2] for s in sids) == ["w0", "w1"]
            for sid in sids:
                assert http.post(f"/sessions/{sid}/reset", json={"seed": 2}).status_code == 200
            time.sleep(2.5)
            for sid in sids:
                step = http.post(f"/sessions/{sid}/step", json={"action": "down"})
                assert step.status_code == 200, step.text
            batch = http.post("/batch/step",
                              json={"steps": [{"session_id": s, "action": "up"} for s in sids]})
            assert all("error" not in r for r in batch.json()["results"]), batch.text
            assert all(http.delete(f"/sessions/{sid}").status_code == 204 for sid in sids)
            assert http.get("/health").json()["worker_restarts"] == 0
    finally:
        server.stop()


def test_a_soak_of_cycles_around_the_keep_alive_has_no_false_errors_and_no_leaked_env() -> None:
    keep_alive_s = 0.6  # short, so that the pauses below straddle it (and the reuse limit, 0.3 s)
    server = start_router(keep_alive_s=keep_alive_s, heartbeat_s=0.2, silent_after_s=2.0)
    num_clients, num_cycles = 6, 20
    statuses: Counter[tuple[str, int]] = Counter()

    async def client(index: int) -> None:
        rng = random.Random(index)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            for cycle in range(num_cycles):
                async def pause() -> None:
                    await asyncio.sleep(rng.choice([0.0, 0.05, 0.25, 0.35, 0.55, 0.65, 0.9]))

                created = await http.post("/sessions", json={"env_id": "maze-v0"})
                statuses["create", created.status_code] += 1
                if created.status_code != 201:
                    continue
                sid = created.json()["session_id"]
                await pause()
                reset = await http.post(f"/sessions/{sid}/reset", json={"seed": cycle})
                statuses["reset", reset.status_code] += 1
                await pause()
                step = await http.post(f"/sessions/{sid}/step", json={"action": "up"})
                statuses["step", step.status_code] += 1
                await pause()
                deleted = await http.delete(f"/sessions/{sid}")
                statuses["delete", deleted.status_code] += 1

    async def soak() -> dict[str, Any]:
        await asyncio.gather(*(client(i) for i in range(num_clients)))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            return (await http.get("/health")).json()

    try:
        health = asyncio.run(soak())
    finally:
        server.stop()
    cycles = num_clients * num_cycles
    assert statuses == Counter({("create", 201): cycles, ("reset", 200): cycles, ("step", 200): cycles,
                                ("delete", 204): cycles}), statuses
    # The workers' own counts (which /health reports): every env the soak created was closed.
    assert health["active_sessions"] == 0 and all(w["sessions"] == 0 for w in health["workers"]), health
    assert health["worker_restarts"] == 0


@pytest.mark.parametrize("options", [{"keep_alive_s": 0}, {"heartbeat_s": -1},
                                     {"heartbeat_s": 2.0, "silent_after_s": 1.0}])
def test_worker_timings_out_of_range_are_config_errors(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="must be"):
        WorkerSet(2, {"env_ids": ["maze-v0"]}, **options)
