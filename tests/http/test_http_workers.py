"""Hung envs against the env service's worker pool, over real sockets: the step deadline counts from
the start of the env call, a call that never started leaves its session intact (503), stuck threads
are replaced (boundedly), and ``/health`` says when workers are stuck."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentgym.errors import ConfigError
from agentgym.http.threadpool import WorkerPool

pytestmark = pytest.mark.timeout(60)

HANG_S = 3.0  # how long a hung step blocks its worker thread


async def _session(http: httpx.AsyncClient, env_id: str, **kwargs: Any) -> str:
    created = await http.post("/sessions", json={"env_id": env_id, "kwargs": kwargs})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    assert (await http.post(f"/sessions/{sid}/reset", json={"seed": 1})).status_code == 200
    return sid


def test_hung_envs_on_every_worker_do_not_poison_healthy_sessions(live_server: Callable[..., Any]) -> None:
    # Two workers, two real hung steps: before, the healthy session's queued step timed out (504) and
    # its session was poisoned for good, creates got 504 too, and /health said "ok".
    server = live_server(num_workers=2, step_timeout_s=1.0)

    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            hung = [await _session(http, "test/http-slow-v0", delay_s=HANG_S) for _ in range(2)]
            healthy = await _session(http, "test/http-counter-v0")
            stuck = [asyncio.create_task(http.post(f"/sessions/{sid}/step", json={"action": "sleep"}))
                     for sid in hung]
            # Both workers are inside the hung steps now. The healthy step queues; the hung ones pass
            # their deadline at 1.0 s, spares stand in at once, and it runs well before its own
            # wait for a thread (1.0 s from 0.5 s) is up.
            await asyncio.sleep(0.5)
            step = await http.post(f"/sessions/{healthy}/step", json={"action": "inc"})
            created = await http.post("/sessions", json={"env_id": "test/http-counter-v0"})
            answers = [await task for task in stuck]
            # Each 504 is sent after its thread was marked stuck, and the hung calls run until HANG_S:
            # both threads are stuck now (polling before the answers raced the second deadline).
            health = await http.get("/health")
            again = await http.post(f"/sessions/{healthy}/step", json={"action": "inc"})
            deadline = time.monotonic() + 10 * HANG_S  # the hung calls return at HANG_S; their threads retire
            recovered = (await http.get("/health")).json()
            while recovered["stuck_workers"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                recovered = (await http.get("/health")).json()
            return {"step": step, "created": created, "health": health, "stuck": answers, "again": again,
                    "recovered": recovered}

    out = asyncio.run(scenario())
    assert out["step"].status_code == 200 and out["step"].json()["turn"] == 1
    assert out["created"].status_code == 201
    # The hung ones: their own deadline, from their start.
    assert [a.status_code for a in out["stuck"]] == [504, 504]
    assert out["again"].status_code == 200 and out["again"].json()["turn"] == 2  # never poisoned
    health = out["health"].json()
    assert out["health"].status_code == 200 and health["status"] == "degraded"
    assert (health["workers"], health["stuck_workers"], health["available_workers"]) == (2, 2, 2)
    assert out["recovered"]["status"] == "ok" and out["recovered"]["stuck_workers"] == 0


def test_a_call_that_never_started_answers_503_and_leaves_the_session_intact(
        live_server: Callable[..., Any]) -> None:
    # No spare threads: one hung step holds the only worker, so nothing else can start.
    server = live_server(num_workers=1, max_spare_workers=0, step_timeout_s=0.5)

    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            hung = await _session(http, "test/http-slow-v0", delay_s=HANG_S)
            healthy = await _session(http, "test/http-counter-v0")
            before = (await http.get(f"/sessions/{healthy}")).json()
            stuck = asyncio.create_task(http.post(f"/sessions/{hung}/step", json={"action": "sleep"}))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            step = await http.post(f"/sessions/{healthy}/step", json={"action": "inc"})
            waited = time.monotonic() - started
            batch = await http.post("/batch/step", json={"steps": [{"session_id": healthy, "action": "inc"}]})
            created = await http.post("/sessions", json={"env_id": "test/http-counter-v0"})
            await stuck
            health = await http.get("/health")
            await asyncio.sleep(HANG_S)
            after = (await http.get(f"/sessions/{healthy}")).json()
            step_after = await http.post(f"/sessions/{healthy}/step", json={"action": "inc"})
            return {"before": before, "step": step, "waited": waited, "batch": batch, "created": created,
                    "health": health, "after": after, "step_after": step_after}

    out = asyncio.run(scenario())
    for name in ("step", "batch", "created"):
        response = out[name]
        assert response.status_code == 503, (name, response.text)
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "SessionCapacityError"
        assert "nothing was run" in response.json()["error"]["message"]
    assert out["waited"] < 2.0  # answered at the step timeout, not after the hung call
    assert out["health"].status_code == 503 and out["health"].json()["status"] == "unavailable"
    assert out["after"]["turn"] == out["before"]["turn"] == 0  # the refused step never ran
    assert out["step_after"].status_code == 200 and out["step_after"].json()["turn"] == 1


def test_worker_pool_replaces_stuck_threads_up_to_its_bound_and_shrinks_back() -> None:
    import threading

    pool = WorkerPool(num_workers=1, max_spare=1)
    release = threading.Event()
    first = pool.submit(release.wait)
    while first.started_at is None:
        time.sleep(0.01)
    queued = pool.submit(lambda: "ran")
    time.sleep(0.1)
    assert queued.started_at is None and pool.queued == 1  # the only thread is busy
    pool.abandon(first)  # its caller gave up: a spare stands in
    assert queued.future.result(timeout=5) == "ran" and pool.stuck == 1
    second = pool.submit(release.wait)
    while second.started_at is None:
        time.sleep(0.01)
    pool.abandon(second)  # a second stuck thread: the bound (1 + 1) is reached, no third thread
    blocked = pool.submit(lambda: "late")
    time.sleep(0.2)
    assert blocked.started_at is None and pool.available == 0
    assert blocked.future.cancel()  # still queued: withdrawn untouched
    release.set()
    assert first.future.result(timeout=5) is True and second.future.result(timeout=5) is True
    deadline = time.monotonic() + 5
    while (pool.stuck or pool.threads > 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stuck == 0 and pool.threads == 1  # back to num_workers threads
    pool.shutdown()


@pytest.mark.parametrize("kwargs", [{"num_workers": 0}, {"max_sessions": 0}, {"ttl_s": -5},
                                    {"step_timeout_s": 0}, {"max_body_bytes": 0}])
def test_service_limits_out_of_range_are_config_errors(kwargs: dict[str, Any]) -> None:
    from agentgym.http.server import create_app

    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        create_app(["test/http-counter-v0"], **kwargs)
