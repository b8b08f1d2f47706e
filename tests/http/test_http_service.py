"""The env service in-process: status codes, the one error shape, routes, limits, and isolation.

Every bad-input test keeps one healthy session stepping beside it (``Healthy.check``), proving the
service keeps serving others after each bad request.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
import pytest
from conftest import TEST_ENV_IDS

import agentgym
from agentgym.errors import UnknownEnv
from agentgym.http.server import create_app

pytestmark = pytest.mark.timeout(60)


def assert_error(response: httpx.Response, status: int, kind: str | None = None, *needles: str) -> str:
    """Check status and the one error body shape; return the message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"], body
    assert sorted(body["error"]) == ["message", "type"], body
    message = body["error"]["message"]
    assert isinstance(message, str) and message, body
    if kind is not None:
        assert body["error"]["type"] == kind, body
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def wait_until_no_stuck_worker(client: Any, deadline_s: float = 30.0) -> None:
    """Poll ``/health`` until every env call that ran past its timeout has returned."""
    deadline = time.monotonic() + deadline_s
    while client.get("/health").json()["stuck_workers"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.get("/health").json()["stuck_workers"] == 0, "a stuck env call never returned"


class Healthy:
    """A session that steps alongside the bad requests; each ``check`` compares it with a local env."""

    def __init__(self, client: Any, env_id: str = "test/http-counter-v0", seed: int = 7) -> None:
        self.client = client
        created = client.post("/sessions", json={"env_id": env_id, "max_turns": 100_000})
        assert created.status_code == 201, created.text
        self.path = f"/sessions/{created.json()['session_id']}"
        self.local = agentgym.make(env_id, max_turns=100_000)
        remote = client.post(f"{self.path}/reset", json={"seed": seed})
        assert remote.status_code == 200, remote.text
        obs, info = self.local.reset(seed=seed)
        assert remote.json() == {"observation": obs, "info": jsonable(info), "episode_seed": seed}
        self.steps = 0

    def check(self) -> None:
        action = "inc" if self.steps % 2 == 0 else "dec"  # oscillates, never reaches the target
        response = self.client.post(f"{self.path}/step", json={"action": action})
        assert response.status_code == 200, response.text
        obs, reward, terminated, truncated, info = self.local.step(action)
        self.steps += 1
        assert response.json() == {"observation": obs, "reward": reward, "terminated": terminated,
                                   "truncated": truncated, "info": jsonable(info), "turn": self.steps}


def new_session(client: Any, env_id: str = "test/http-counter-v0", seed: int | None = 0, **body: Any) -> str:
    created = client.post("/sessions", json={"env_id": env_id, **body})
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    if seed is not None:
        assert client.post(f"/sessions/{session_id}/reset", json={"seed": seed}).status_code == 200
    return session_id


# --- bad input: one status and one body shape each ------------------------------------------------


def test_malformed_json_is_422_saying_the_body_is_not_json(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service)
    for raw in (b'{"action": "inc"', b"{action: inc}", b"\xff\xfe", b"nul"):
        response = service.post(f"/sessions/{sid}/step", content=raw,
                                headers={"content-type": "application/json"})
        assert_error(response, 422, "RequestRejected", "not valid JSON")
        healthy.check()
    response = service.post("/sessions", content=b"[1,", headers={"content-type": "application/json"})
    assert_error(response, 422, "RequestRejected", "not valid JSON")
    healthy.check()


def test_a_body_that_is_not_declared_json_is_422_naming_the_content_type(service: Any) -> None:
    """Bodies must say they are JSON: a browser page cannot send that header without a CORS preflight."""
    healthy = Healthy(service)
    sid = new_session(service)
    for headers, got in (({}, "no Content-Type"), ({"content-type": "text/plain"}, "'text/plain'"),
                         ({"content-type": "application/x-www-form-urlencoded"}, "x-www-form-urlencoded")):
        response = service.post(f"/sessions/{sid}/step", content=b'{"action": "inc"}', headers=headers)
        assert_error(response, 422, "RequestRejected", "Content-Type: application/json", got)
        healthy.check()
    response = service.post(f"/sessions/{sid}/step", json=["inc"])
    assert_error(response, 422, "RequestRejected", "JSON object", "list")
    assert service.get(f"/sessions/{sid}").json()["turn"] == 0
    response = service.post(f"/sessions/{sid}/step", content=b'{"action": "inc"}',
                            headers={"content-type": "application/json; charset=utf-8"})
    assert response.status_code == 200 and response.json()["turn"] == 1
    healthy.check()


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("step", {"action": 3}, "action"),
        ("step", {"action": None}, "action"),
        ("step", {"action": ["inc"]}, "action"),
        ("step", {}, "action"),
        ("step", {"action": "inc", "force": True}, "force"),
        ("reset", {"seed": -1}, "seed"),
        ("reset", {"seed": "3"}, "seed"),
        ("reset", {"seed": 1.5}, "seed"),
        ("reset", {"seed": True}, "seed"),
        ("reset", {"seed": 2**64}, "seed"),
        ("reset", {"options": [1]}, "options"),
        ("reset", {"sed": 1}, "sed"),
        ("fork", {"mode": "clone"}, "mode"),
        ("create", {"env_id": 5}, "env_id"),
        ("create", {"env_id": "test/http-counter-v0", "max_turns": 0}, "max_turns"),
        ("create", {"env_id": "test/http-counter-v0", "max_turns": "9"}, "max_turns"),
        ("create", {"env_id": "test/http-counter-v0", "kwargs": [1]}, "kwargs"),
        ("create", {"envid": "test/http-counter-v0"}, "envid"),
        ("batch", {"steps": []}, "steps"),
        ("batch", {"steps": [{"session_id": "x", "action": 1}]}, "steps.0.action"),
    ],
)
def test_wrong_types_are_422_naming_the_field(service: Any, route: str, body: dict, field: str) -> None:
    healthy = Healthy(service)
    sid = new_session(service)
    path = {"step": f"/sessions/{sid}/step", "reset": f"/sessions/{sid}/reset",
            "fork": f"/sessions/{sid}/fork", "create": "/sessions", "batch": "/batch/step"}[route]
    message = assert_error(service.post(path, json=body), 422, "RequestRejected")
    assert message.startswith("malformed request: ") and f"{field}:" in message, message
    healthy.check()
    # The session the bad request named is untouched.
    assert service.get(f"/sessions/{sid}").json()["turn"] == 0


def test_env_kwargs_the_env_rejects_are_422_not_500(service: Any) -> None:
    healthy = Healthy(service)
    for kwargs in ({"spam": 1}, {"span": 0}, {"max_turns": 3}, {"env_id": "x"}):
        response = service.post("/sessions", json={"env_id": "test/http-counter-v0", "kwargs": kwargs})
        assert_error(response, 422, "ConfigError", next(iter(kwargs)))
        healthy.check()
    assert service.get("/health").json()["active_sessions"] == 1


def test_deeply_nested_options_are_422_not_500(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service)
    options: Any = {}
    for _ in range(300):
        options = {"a": options}
    response = service.post(f"/sessions/{sid}/reset", json={"seed": 1, "options": options})
    assert_error(response, 422, "RequestRejected", "options", "deep")
    healthy.check()


def test_unknown_env_is_404_with_the_nearest_id(service: Any) -> None:
    healthy = Healthy(service)
    for path, body in (("/sessions", {"env_id": "test/http-countr-v0"}), ("/envs/test/http-countr-v0", None)):
        response = service.post(path, json=body) if body else service.get(path)
        assert_error(response, 404, "UnknownEnv", "test/http-countr-v0", "'test/http-counter-v0'")
        healthy.check()
    # An id registered in the process but not served by this service is unknown here too.
    response = service.post("/sessions", json={"env_id": "maze-v0"})
    assert_error(response, 404, "UnknownEnv", "test/http-counter-v0")
    healthy.check()


def test_unknown_and_deleted_sessions_are_404(service: Any) -> None:
    healthy = Healthy(service)
    assert_error(service.post("/sessions/nope/step", json={"action": "inc"}), 404, "UnknownSession", "'nope'")
    assert_error(service.get("/sessions/nope"), 404, "UnknownSession")
    assert_error(service.delete("/sessions/nope"), 404, "UnknownSession")
    healthy.check()
    sid = new_session(service)
    assert service.delete(f"/sessions/{sid}").status_code == 204
    for response in (service.post(f"/sessions/{sid}/step", json={"action": "inc"}),
                     service.post(f"/sessions/{sid}/reset", json={}),
                     service.post(f"/sessions/{sid}/fork", json={}),
                     service.get(f"/sessions/{sid}"), service.delete(f"/sessions/{sid}")):
        assert_error(response, 404, "UnknownSession", sid)
        healthy.check()


def test_idle_session_is_reaped_by_the_running_reaper(make_service: Any) -> None:
    client = make_service(ttl_s=0.2)  # TestClient runs the lifespan, which starts the reaper
    sid = new_session(client)
    deadline = time.monotonic() + 10
    while client.get("/health").json()["active_sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_error(client.post(f"/sessions/{sid}/step", json={"action": "inc"}), 404, "UnknownSession", "idle")
    assert "agentgym_sessions_reaped 1.0" in client.get("/metrics").text


def test_idle_session_expires_over_asgi_transport_without_lifespan() -> None:
    async def scenario() -> None:
        app = create_app(TEST_ENV_IDS, ttl_s=0.2)
        store = app.state.store
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
            created = await client.post("/sessions", json={"env_id": "test/http-counter-v0"})
            sid = created.json()["session_id"]
            kept = await client.post("/sessions", json={"env_id": "test/http-counter-v0"})
            keep = kept.json()["session_id"]
            assert (await client.post(f"/sessions/{sid}/reset", json={"seed": 0})).status_code == 200
            for _ in range(6):  # the store started its reaper on the first create; keep one session busy
                await asyncio.sleep(0.05)
                assert (await client.get(f"/sessions/{keep}")).status_code == 200
            await store.reap_idle()
            assert_error(await client.post(f"/sessions/{sid}/step", json={"action": "inc"}), 404,
                         "UnknownSession")
            assert (await client.get(f"/sessions/{keep}")).status_code == 200
        await store.stop()

    asyncio.run(scenario())


def test_step_before_reset_and_after_the_end_are_409(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service, seed=None)
    assert_error(service.post(f"/sessions/{sid}/step", json={"action": "inc"}), 409, "ResetNeeded", "reset")
    assert_error(service.post(f"/sessions/{sid}/fork", json={}), 409, "ResetNeeded")
    assert_error(service.post(f"/sessions/{sid}/expert"), 409, "ResetNeeded")
    healthy.check()
    assert service.post(f"/sessions/{sid}/reset", json={"seed": 3}).status_code == 200
    for _ in range(4):  # span 4: the fourth "inc" reaches the target
        last = service.post(f"/sessions/{sid}/step", json={"action": "inc"}).json()
    assert last["terminated"] and last["info"]["success"]
    assert_error(service.post(f"/sessions/{sid}/step", json={"action": "inc"}), 409, "EpisodeFinished",
                 "reset")
    healthy.check()
    # Truncation by the turn budget ends the episode too.
    assert service.post(f"/sessions/{sid}/reset", json={"seed": 3}).status_code == 200
    for _turn in range(8):
        last = service.post(f"/sessions/{sid}/step", json={"action": "dec"}).json()
    assert last["truncated"] and not last["terminated"] and last["turn"] == 8
    assert_error(service.post(f"/sessions/{sid}/step", json={"action": "dec"}), 409, "EpisodeFinished")
    healthy.check()


def test_oversized_bodies_are_413_with_and_without_content_length(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service)
    big = json.dumps({"action": "x" * 5000}).encode()
    response = service.post(f"/sessions/{sid}/step", content=big,
                            headers={"content-type": "application/json"})
    assert_error(response, 413, "RequestRejected", "4096")
    healthy.check()

    def chunks():  # a streamed body: httpx sends it chunked, without Content-Length
        for start in range(0, len(big), 1000):
            yield big[start:start + 1000]

    response = service.post(f"/sessions/{sid}/step", content=chunks(),
                            headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "RequestRejected", "4096")
    healthy.check()

    def small_chunks():
        yield b'{"action": '
        yield b'"inc"}'

    response = service.post(f"/sessions/{sid}/step", content=small_chunks(),
                            headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text  # streamed bodies under the limit are fine
    assert service.get(f"/sessions/{sid}").json()["turn"] == 1
    healthy.check()


def test_bearer_token(make_service: Any) -> None:
    client = make_service(token="s3cret")
    assert client.get("/health").status_code == 200  # liveness is open
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        response = client.post("/sessions", json={"env_id": "test/http-counter-v0"}, headers=headers)
        assert_error(response, 401, "AuthenticationError", "bearer token")
        assert response.headers["www-authenticate"] == "Bearer"
        assert_error(client.get("/envs", headers=headers), 401, "AuthenticationError")
        assert_error(client.get("/metrics", headers=headers), 401, "AuthenticationError")
    client.headers["Authorization"] = "Bearer s3cret"
    healthy = Healthy(client)
    healthy.check()
    assert client.get("/envs").status_code == 200


def test_capacity_is_503_with_retry_after_for_create_and_fork(service: Any) -> None:
    healthy = Healthy(service)
    sessions = [new_session(service) for _ in range(5)]  # 6 with the healthy one: full
    response = service.post("/sessions", json={"env_id": "test/http-counter-v0"})
    assert_error(response, 503, "SessionCapacityError", "6")
    assert int(response.headers["retry-after"]) >= 1
    healthy.check()
    response = service.post(f"/sessions/{sessions[0]}/fork", json={})
    assert_error(response, 503, "SessionCapacityError", "6")
    assert int(response.headers["retry-after"]) >= 1
    healthy.check()
    assert service.get("/health").json()["active_sessions"] == 6
    assert service.delete(f"/sessions/{sessions[0]}").status_code == 204
    fork = service.post(f"/sessions/{sessions[1]}/fork", json={})
    assert fork.status_code == 201, fork.text
    healthy.check()


def test_concurrent_forks_never_exceed_capacity() -> None:
    async def scenario() -> None:
        app = create_app(TEST_ENV_IDS, max_sessions=4)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as client:
            sid = (await client.post("/sessions", json={"env_id": "test/http-slow-v0"})).json()["session_id"]
            await client.post(f"/sessions/{sid}/reset", json={"seed": 0})
            responses = await asyncio.gather(
                *(client.post(f"/sessions/{sid}/fork", json={}) for _ in range(8)),
                *(client.post("/sessions", json={"env_id": "test/http-counter-v0"}) for _ in range(4)))
            codes = sorted(r.status_code for r in responses)
            assert codes.count(201) == 3 and codes.count(503) == 9, codes
            assert len(app.state.store.sessions) == 4
        await app.state.store.stop()

    asyncio.run(scenario())


def test_a_crashing_env_fails_only_its_own_session(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service, "test/http-crashy-v0")
    assert service.post(f"/sessions/{sid}/step", json={"action": "inc"}).status_code == 200
    response = service.post(f"/sessions/{sid}/step", json={"action": "crash"})
    assert_error(response, 500, "EnvCrashed", "CrashyEnv.step()", "RuntimeError", "kaboom on purpose",
                 "reset")
    healthy.check()
    assert_error(service.post(f"/sessions/{sid}/step", json={"action": "inc"}), 409, "EpisodeFinished")
    healthy.check()
    reset = service.post(f"/sessions/{sid}/reset", json={"seed": 1})
    assert reset.status_code == 200, reset.text
    step = service.post(f"/sessions/{sid}/step", json={"action": "inc"})
    assert step.status_code == 200 and step.json()["turn"] == 1
    healthy.check()
    # An expert that raises is the env's crash too; the session keeps its episode.
    reset = service.post(f"/sessions/{sid}/reset", json={"seed": 0, "options": {"target": 99}})
    assert reset.status_code == 200, reset.text
    assert_error(service.post(f"/sessions/{sid}/expert"), 500, "EnvCrashed", "expert_action()",
                 "the expert is lost")
    healthy.check()
    assert service.post(f"/sessions/{sid}/step", json={"action": "inc"}).status_code == 200


def test_a_step_past_the_timeout_is_504_and_poisons_only_that_session(service: Any) -> None:
    healthy = Healthy(service)
    sid = new_session(service, "test/http-slow-v0", kwargs={"delay_s": 2.5})
    response = service.post(f"/sessions/{sid}/step", json={"action": "sleep"})
    assert_error(response, 504, "RemoteTimeout", "of 1 s")
    # Answered at the deadline, not when the env returned: the 2.5 s step is still running in its thread.
    assert service.get("/health").json()["stuck_workers"] == 1
    healthy.check()
    for follow_up in (service.post(f"/sessions/{sid}/step", json={"action": "inc"}),
                      service.post(f"/sessions/{sid}/reset", json={"seed": 0}),
                      service.post(f"/sessions/{sid}/fork", json={})):
        assert_error(follow_up, 500, "EnvCrashed", "DELETE")
        healthy.check()
    wait_until_no_stuck_worker(service)  # the stuck call returned; the session is still unusable
    assert_error(service.post(f"/sessions/{sid}/step", json={"action": "inc"}), 500, "EnvCrashed", "DELETE")
    assert service.delete(f"/sessions/{sid}").status_code == 204
    assert_error(service.get(f"/sessions/{sid}"), 404, "UnknownSession")
    healthy.check()


def test_batch_with_a_duplicate_session_is_rejected(service: Any) -> None:
    healthy = Healthy(service)
    a, b = new_session(service), new_session(service)
    response = service.post("/batch/step", json={"steps": [{"session_id": a, "action": "inc"},
                                                           {"session_id": b, "action": "inc"},
                                                           {"session_id": a, "action": "inc"}]})
    assert_error(response, 422, "RequestRejected", a, "twice")
    assert service.get(f"/sessions/{a}").json()["turn"] == 0  # nothing ran
    assert service.get(f"/sessions/{b}").json()["turn"] == 0
    healthy.check()


def test_batch_items_fail_alone(service: Any) -> None:
    healthy = Healthy(service)
    a, b = new_session(service), new_session(service)
    fresh = new_session(service, seed=None)
    crashy = new_session(service, "test/http-crashy-v0")
    response = service.post("/batch/step", json={"steps": [
        {"session_id": a, "action": "inc"}, {"session_id": "ghost", "action": "inc"},
        {"session_id": fresh, "action": "inc"}, {"session_id": crashy, "action": "crash"},
        {"session_id": b, "action": "dec"}]})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    local = agentgym.make("test/http-counter-v0")
    local.reset(seed=0)
    obs, reward, terminated, truncated, info = local.step("inc")
    assert results[0] == {"observation": obs, "reward": reward, "terminated": terminated,
                          "truncated": truncated, "info": jsonable(info), "turn": 1}
    assert results[1]["error"]["type"] == "UnknownSession" and "ghost" in results[1]["error"]["message"]
    assert results[2]["error"]["type"] == "ResetNeeded"
    assert results[3]["error"]["type"] == "EnvCrashed" and "kaboom" in results[3]["error"]["message"]
    assert results[4]["turn"] == 1 and results[4]["observation"].startswith("[dec]")
    healthy.check()
    # Batched resets have the same per-item behaviour.
    response = service.post("/batch/reset", json={"resets": [{"session_id": crashy, "seed": 5},
                                                             {"session_id": "ghost"}]})
    results = response.json()["results"]
    assert results[0]["episode_seed"] == 5 and results[1]["error"]["type"] == "UnknownSession"
    healthy.check()


def test_a_batch_past_the_timeout_poisons_only_the_stuck_session(service: Any) -> None:
    healthy = Healthy(service)
    a, b = new_session(service), new_session(service)
    slow = new_session(service, "test/http-slow-v0", kwargs={"delay_s": 2.0})
    response = service.post("/batch/step", json={"steps": [
        {"session_id": a, "action": "inc"}, {"session_id": slow, "action": "sleep"},
        {"session_id": b, "action": "inc"}]})
    assert response.status_code == 200, response.text
    first, stuck, skipped = response.json()["results"]
    assert first["turn"] == 1
    assert stuck["error"]["type"] == "RemoteTimeout" and "DELETE" in stuck["error"]["message"]
    assert skipped["error"]["type"] == "RemoteTimeout" and "not run" in skipped["error"]["message"]
    healthy.check()
    wait_until_no_stuck_worker(service)  # the stuck call returned: it must not have touched b
    assert service.get(f"/sessions/{b}").json()["turn"] == 0
    assert service.post(f"/sessions/{b}/step", json={"action": "inc"}).json()["turn"] == 1
    assert service.post(f"/sessions/{a}/step", json={"action": "inc"}).json()["turn"] == 2
    assert_error(service.post(f"/sessions/{slow}/step", json={"action": "inc"}), 500, "EnvCrashed", "DELETE")
    healthy.check()


def test_batches_in_opposite_orders_do_not_deadlock() -> None:
    """Batch Y=[S, A] queues on S behind a slow step, batch X=[A, S] then takes A: lock order matters."""

    async def scenario() -> None:
        app = create_app(TEST_ENV_IDS, step_timeout_s=5)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc") as client:
            async def session(env_id: str, **kwargs: Any) -> str:
                created = await client.post("/sessions", json={"env_id": env_id, "kwargs": kwargs})
                sid = created.json()["session_id"]
                assert (await client.post(f"/sessions/{sid}/reset", json={"seed": 0})).status_code == 200
                return sid

            slow = await session("test/http-slow-v0", delay_s=0.3)
            other = await session("test/http-counter-v0")
            step_slow = asyncio.create_task(client.post(f"/sessions/{slow}/step", json={"action": "sleep"}))
            await asyncio.sleep(0.1)
            batch_y = asyncio.create_task(client.post("/batch/step", json={"steps": [
                {"session_id": slow, "action": "inc"}, {"session_id": other, "action": "inc"}]}))
            await asyncio.sleep(0.05)
            batch_x = asyncio.create_task(client.post("/batch/step", json={"steps": [
                {"session_id": other, "action": "inc"}, {"session_id": slow, "action": "inc"}]}))
            done = await asyncio.wait_for(asyncio.gather(step_slow, batch_y, batch_x), timeout=10)
            assert [r.status_code for r in done] == [200, 200, 200]
            turns = sorted(item["turn"] for r in done[1:] for item in r.json()["results"])
            assert turns == [1, 2, 2, 3]
        await app.state.store.stop()

    asyncio.run(scenario())


# --- no 500 for anything a client can send --------------------------------------------------------


def test_fuzz_never_answers_500(service: Any) -> None:
    rng = random.Random(1234)
    healthy = Healthy(service)
    sid = new_session(service)
    paths = ["/health", "/envs", "/envs/test/http-counter-v0", "/envs/%00", "/sessions", f"/sessions/{sid}",
             f"/sessions/{sid}/step", f"/sessions/{sid}/reset", f"/sessions/{sid}/fork",
             f"/sessions/{sid}/expert", "/sessions/nope/step", "/batch/step", "/batch/reset", "/metrics",
             "/nowhere", "/sessions//step", "/sessions/%ff%fe/step", "/" + "a" * 3000, "/envs/" + "x/" * 50]
    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    junk_values: list[Any] = [None, True, -1, 0, 2**70, 1.5, float("1e308"), "", "inc", "\ud800", "x" * 300,
                              [], {}, [1, "a"], {"a": {"b": [None]}}, sid, "test/http-counter-v0"]
    keys = ["action", "seed", "options", "env_id", "kwargs", "max_turns", "mode", "steps", "resets",
            "session_id", "zzz"]

    def junk_json() -> Any:
        shape = rng.random()
        if shape < 0.6:
            body = {rng.choice(keys): rng.choice(junk_values) for _ in range(rng.randint(0, 3))}
            if rng.random() < 0.3:
                body[rng.choice(["steps", "resets"])] = [
                    {rng.choice(keys): rng.choice(junk_values) for _ in range(rng.randint(0, 3))}
                    for _ in range(rng.randint(0, 3))]
            return body
        return rng.choice(junk_values)

    for _ in range(200):
        method, path = rng.choice(methods), rng.choice(paths)
        kind = rng.random()
        if kind < 0.6:
            content = json.dumps(junk_json(), ensure_ascii=rng.random() < 0.5).encode("utf-8",
                                                                                       "surrogatepass")
        elif kind < 0.8:
            content = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        else:
            content = b""
        headers = rng.choice([{"content-type": "application/json"}, {}, {"content-type": "text/plain"},
                              {"content-type": "application/x-www-form-urlencoded"},
                              {"content-type": "application/json; charset=latin-1"}])
        response = service.request(method, path, content=content, headers=headers)
        assert response.status_code != 500, (method, path, content, response.text)
        if response.status_code >= 400 and method != "HEAD":
            assert_error(response, response.status_code)
    healthy.check()
    assert service.get(f"/sessions/{sid}").status_code in (200, 404)  # maybe deleted by the fuzz


def test_lone_surrogates_are_refused_or_escaped_never_500(service: Any) -> None:
    sid = new_session(service, "test/http-counter-v0")
    response = service.post(f"/sessions/{sid}/step", content=b'{"action": "\\ud800x"}',
                            headers={"content-type": "application/json"})
    assert_error(response, 422, "RequestRejected", "action")
    # Inside options (free-form JSON) it reaches the env, which echoes it into info.
    response = service.post(f"/sessions/{sid}/reset",
                            content=b'{"seed": 1, "options": {"label": "\\udc80!"}}',
                            headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["info"]["label"] == "\udc80!"


# --- routes ----------------------------------------------------------------------------------------


def test_service_routes(service: Any) -> None:
    health = service.get("/health").json()
    assert health["status"] == "ok" and health["version"] == agentgym.__version__
    assert health["envs"] == TEST_ENV_IDS and health["max_sessions"] == 6 and health["active_sessions"] == 0
    listed = service.get("/envs").json()
    assert [e["id"] for e in listed] == TEST_ENV_IDS
    assert listed[0] == {"id": "test/http-counter-v0", "description": "counter (tests)", "max_turns": 8}
    detail = service.get("/envs/test/http-counter-v0").json()
    assert detail["id"] == "test/http-counter-v0" and detail["max_turns"] == 8
    assert set(detail["schemas"]) == {"reset_request", "reset_response", "step_request", "step_response"}
    assert "action" in detail["schemas"]["step_request"]["properties"]
    openapi = service.get("/openapi.json").json()
    for path in ("/health", "/envs", "/envs/{env_id}", "/sessions", "/sessions/{session_id}",
                 "/sessions/{session_id}/reset", "/sessions/{session_id}/step", "/sessions/{session_id}/fork",
                 "/batch/step", "/metrics"):
        assert path in openapi["paths"], path
    docs = service.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_session_state_and_delete(service: Any) -> None:
    created = service.post("/sessions", json={"env_id": "test/http-counter-v0", "max_turns": 5})
    assert created.status_code == 201
    info = created.json()
    sid = info["session_id"]
    assert info["env_id"] == "test/http-counter-v0" and info["max_turns"] == 5 and info["turn"] == 0
    assert info["episode_over"] and info["episode_seed"] is None
    assert info["has_expert"] and info["supports_snapshot"]
    service.post(f"/sessions/{sid}/reset", json={"seed": 11})
    service.post(f"/sessions/{sid}/step", json={"action": "inc"})
    state = service.get(f"/sessions/{sid}").json()
    assert state["turn"] == 1 and state["episode_seed"] == 11 and not state["episode_over"]
    assert service.post(f"/sessions/{sid}/expert").json() == {"action": "inc"}
    assert service.delete(f"/sessions/{sid}").status_code == 204
    assert_error(service.get(f"/sessions/{sid}"), 404, "UnknownSession")
    assert service.get("/health").json()["active_sessions"] == 0


def test_reset_without_a_body_draws_a_seed(service: Any) -> None:
    sid = new_session(service, seed=None)
    response = service.post(f"/sessions/{sid}/reset")
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["episode_seed"], int)


def test_metrics_count_the_steps_made(service: Any) -> None:
    a, b = new_session(service), new_session(service)
    for _ in range(3):
        assert service.post(f"/sessions/{a}/step", json={"action": "inc"}).status_code == 200
    assert service.post("/sessions/ghost/step", json={"action": "inc"}).status_code == 404  # not a step
    batch = service.post("/batch/step", json={"steps": [{"session_id": a, "action": "inc"},
                                                        {"session_id": b, "action": "inc"},
                                                        {"session_id": "ghost", "action": "inc"}]})
    assert batch.status_code == 200
    response = service.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    steps = {k: v for k, v in samples.items() if k.startswith("agentgym_steps_total")}
    assert steps == {'agentgym_steps_total{route="single"}': 3.0, 'agentgym_steps_total{route="batch"}': 2.0}
    assert samples["agentgym_sessions_active"] == 2.0
    assert samples["agentgym_resets_total"] == 2.0
    assert samples['agentgym_errors_total{type="UnknownSession"}'] == 1.0
    assert samples['agentgym_step_request_seconds_count{route="single"}'] == 3.0


def test_create_app_fails_fast_for_unknown_env_ids() -> None:
    with pytest.raises(UnknownEnv, match="test/http-counter-v0"):
        create_app(["test/http-countr-v0"])
    with pytest.raises(UnknownEnv):
        create_app(["test/http-counter-v0", "nothing-here-v0"])
    # An empty list means "every registered env", like None.
    assert create_app([]).state.store.allowed_env_ids is None


def test_app_exposes_routes_and_state_through_the_guard() -> None:
    app = create_app(["test/http-counter-v0"])
    paths = {route.path for route in app.routes}
    assert {"/sessions/{session_id}/step", "/batch/step", "/health"} <= paths
    assert app.state.store.max_sessions == 1024


# --- the plain-ASGI hot routes answer exactly as the FastAPI routes do ----------------------------

J = {"content-type": "application/json"}
DEEP = b"[" * 300 + b"]" * 300  # deeper than pydantic's JSON parser goes, within json.loads' reach
HOT_CASES: list[tuple[str, bytes, dict[str, str]]] = [
    # Content-Type handling: only JSON media types are read as JSON.
    *(("/sessions/@a@/step", b'{"action": "inc"}', {"content-type": ct} if ct else {})
      for ct in (None, "application/json", "text/plain", "application/json; charset=utf-8",
                 "Application/JSON", "application/vnd.agentgym+json", "application/jsonx", "text/json",
                 "application/json; charset=latin-1", "application/x-www-form-urlencoded",
                 "application/json, text/plain", "")),
    # Bodies that are not JSON, not an object, or not a StepRequest.
    *(("/sessions/@a@/step", body, J)
      for body in (b"", b"null", b"[]", b'["inc"]', b"[1,", b"{action: inc}", b"\xff\xfe", b"nul", b'"inc"',
                   b'{"action": 3}', b'{"action": null}', b"{}", b'{"action": "inc", "force": true}',
                   b'{"action": "\\ud800x"}', b'{"action": "\xed\xa0\x80"}', b'\xef\xbb\xbf{"action": "dec"}',
                   b'{"action": "inc", "action": "dec"}', b'{"action": ' + DEEP + b"}",
                   b"[" * 5000 + b"]" * 5000, b'{"action": "inc", "x": 1' + b"1" * 5000 + b"}",
                   b'{"action": "' + b"x" * 100_001 + b'"}', b'{"action": "inc"} x', b'{"action": "inc"}')),
    # Resets: seeds, options (free-form JSON: lone surrogates pass through), bad fields.
    *(("/sessions/@a@/reset", body, J)
      for body in (b'{"seed": 3}', b'{"seed": 3, "options": {"target": 5}}', b'{"seed": -1}',
                   b'{"seed": "3"}', b'{"seed": 1.0}', b'{"seed": 2, "seed": 3}', b'{"sed": 1}', b"[1]",
                   b'{"seed": 18446744073709551616}', b'{"seed": 1, "options": {"label": "\\udc80!"}}',
                   b'{"seed": 1, "options": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}",
                   b'{"seed": 1, "options": {"a": ' + DEEP + b"}}", b'{"seed": 3}')),
    ("/sessions/@a@/reset", b'{"seed": 3}', {}),
    # Episode state: before reset, the end, a crash, unknown and deleted sessions.
    ("/sessions/@fresh@/step", b'{"action": "inc"}', J),
    *(("/sessions/@a@/step", b'{"action": "inc"}', J) for _ in range(3)),
    ("/sessions/@a@/step", b'{"action": "inc"}', J),
    ("/sessions/@crashy@/step", b'{"action": "crash"}', J),
    ("/sessions/@crashy@/step", b'{"action": "inc"}', J),
    ("/sessions/ghost/step", b'{"action": "inc"}', J),
    ("/sessions/ghost/reset", b"", {}),
    ("/sessions/@gone@/step", b'{"action": "inc"}', J),
    ("/sessions/@gone@/reset", b'{"seed": 1}', J),
    ("/sessions/@a@/step", b'{"action": "explode"}', J),  # an unexpected exception: 500, same body
    # Batches.
    ("/batch/reset", (b'{"resets": [{"session_id": "@a@", "seed": 4}, {"session_id": "@b@", "seed": 5, '
                      b'"options": {"target": 9}}, {"session_id": "ghost"}, '
                      b'{"session_id": "@fresh@", "seed": 1}]}'), J),
    ("/batch/step", (b'{"steps": [{"session_id": "@a@", "action": "inc"}, '
                     b'{"session_id": "ghost", "action": "inc"}, '
                     b'{"session_id": "@crashy@", "action": "crash"}, '
                     b'{"session_id": "@b@", "action": "dec"}, '
                     b'{"session_id": "@gone@", "action": "dec"}, '
                     b'{"session_id": "@fresh@", "action": "explode"}]}'), J),
    ("/batch/step", (b'{"steps": [{"session_id": "@a@", "action": "inc"}, '
                     b'{"session_id": "@a@", "action": "inc"}]}'), J),
    ("/batch/step", b'{"steps": []}', J),
    ("/batch/step", b'{"steps": [{"session_id": "x", "action": 1}, {"session_id": 2}]}', J),
    ("/batch/step",
     b'{"steps": [' + b'{"session_id": "x", "action": "inc"},' * 4096 + b'{"session_id": "y"}]}', J),
    ("/batch/step", b'{"steps": "all"}', J),
    ("/batch/step", b'{"steps": [{"session_id": "@a@", "action": "inc"}]}', {"content-type": "text/plain"}),
    ("/batch/step", b"", J),
    ("/batch/reset", b'{"resets": [{"session_id": "@a@", "seed": -1}]}', J),
    ("/batch/reset", b'{"resets": [{"session_id": "@a@", "options": [1]}]}', J),
    ("/batch/reset", b"{}", J),
    # Past the step timeout: 504, then the poisoned session's 500.
    ("/sessions/@slow@/step", b'{"action": "sleep"}', J),
    ("/sessions/@slow@/step", b'{"action": "inc"}', J),
    ("/batch/step", (b'{"steps": [{"session_id": "@slow@", "action": "inc"}, '
                     b'{"session_id": "@b@", "action": "inc"}]}'), J),
]


def _counts(metrics: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in metrics.registry.collect()
            for s in family.samples if s.name.endswith(("_total", "_count"))}


def test_hot_routes_answer_byte_for_byte_like_the_fastapi_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request runs twice: through the service (plain-ASGI ``HotRoutes``) on one of a pair of twin
    sessions, and straight into the FastAPI app behind the guard on the other. Status, headers, body and
    the metrics it counted must be the same."""
    from agentgym.http import server

    step = server._step

    def exploding_step(session: Any, action: str) -> dict[str, Any]:
        if action == "explode":
            raise RuntimeError("boom (on purpose)")
        return step(session, action)

    monkeypatch.setattr(server, "_step", exploding_step)
    parsed = []
    parse = server.HotRoutes._parse

    def counting_parse(self: Any, *args: Any) -> Any:
        parsed.append(1)
        return parse(self, *args)

    monkeypatch.setattr(server.HotRoutes, "_parse", counting_parse)

    async def scenario() -> None:
        app = create_app(TEST_ENV_IDS, max_sessions=64, step_timeout_s=0.3, max_body_bytes=1 << 20)
        assert isinstance(app.hot_routes, server.HotRoutes)
        metrics = app.state.metrics
        hot = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://svc")
        plain = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app, raise_app_exceptions=False),
                                  base_url="http://svc")
        async with hot, plain:
            twins: dict[str, tuple[str, str]] = {}
            far = {"seed": 3, "options": {"target": 99}}  # an episode that does not end soon
            counter = "test/http-counter-v0"
            for name, env_id, kwargs, reset in (("a", counter, {}, far), ("b", counter, {}, far),
                                                ("fresh", counter, {}, None),
                                                ("gone", counter, {}, {"seed": 0}),
                                                ("crashy", "test/http-crashy-v0", {}, {"seed": 0}),
                                                ("slow", "test/http-slow-v0", {"delay_s": 0.6}, {"seed": 0})):
                pair = []
                for _ in range(2):
                    created = await hot.post("/sessions",
                                             json={"env_id": env_id, "kwargs": kwargs, "max_turns": 99})
                    pair.append(created.json()["session_id"])
                    if reset is not None:
                        assert (await hot.post(f"/sessions/{pair[-1]}/reset", json=reset)).status_code == 200
                twins[name] = (pair[0], pair[1])
            for sid in twins["gone"]:
                assert (await hot.delete(f"/sessions/{sid}")).status_code == 204

            for path, body, headers in HOT_CASES:
                answers = []
                for side, client in enumerate((hot, plain)):
                    def fill(text: bytes, side: int = side) -> bytes:
                        for name, pair in twins.items():
                            text = text.replace(f"@{name}@".encode(), pair[side].encode())
                        return text

                    def unfill(text: bytes, side: int = side) -> bytes:
                        for name, pair in twins.items():
                            text = text.replace(pair[side].encode(), f"@{name}@".encode())
                        return text

                    before = _counts(metrics)
                    response = await client.post(fill(path.encode()).decode(), content=fill(body),
                                                 headers=headers)
                    after = _counts(metrics)
                    counted = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
                    answers.append((response.status_code, response.headers.multi_items(),
                                    unfill(response.content), counted))
                assert answers[0] == answers[1], (path, body[:200], headers)
                assert (answers[0][0] != 500 or b"boom" in answers[0][2]
                        or b"EnvCrashed" in answers[0][2]), answers[0]

            assert len(parsed) >= len(HOT_CASES)  # the service's side did take the hot routes
            # A streamed (chunked) body takes the guard's other path into the hot routes.
            async def chunks() -> Any:
                yield b'{"act'
                yield b'ion": "dec"}'

            streamed = [await client.post(f"/sessions/{pair[side]}/step", content=chunks(), headers=J)
                        for side, (client, pair) in enumerate(((hot, twins["b"]), (plain, twins["b"])))]
            assert streamed[0].status_code == 200 and streamed[0].content == streamed[1].content
            # No body (or null) resets with a drawn seed on both paths.
            for client, sid in ((hot, twins["a"][0]), (plain, twins["a"][1])):
                for content in (b"", b"null"):
                    response = await client.post(f"/sessions/{sid}/reset", content=content, headers=J)
                    assert response.status_code == 200 and isinstance(response.json()["episode_seed"], int)
        await app.state.store.stop()

    asyncio.run(scenario())


def test_only_exact_hot_paths_bypass_fastapi() -> None:
    hot = create_app(TEST_ENV_IDS).hot_routes
    post = {"type": "http", "method": "POST", "root_path": ""}
    for path, session_id in (("/sessions/abc/step", "abc"), ("/sessions/abc/reset", "abc"),
                             ("/sessions/a b%/step", "a b%"), ("/batch/step", None), ("/batch/reset", None)):
        matched = hot.match({**post, "path": path})
        assert matched is not None and matched[1] == session_id, path
    for path in ("/sessions//step", "/sessions/abc/step/", "/sessions/abc/steps", "/sessions/abc/fork",
                 "/sessions/abc/expert", "/sessions/abc", "/sessions/a/b/step", "/sessions/abc/step\n",
                 "/batch/step/", "/batch", "/batch/fork", "/sessions", "/health", "//batch/step"):
        assert hot.match({**post, "path": path}) is None, path
    assert hot.match({**post, "method": "GET", "path": "/batch/step"}) is None
    assert hot.match({**post, "method": "PUT", "path": "/sessions/abc/step"}) is None
    assert hot.match({**post, "path": "/api/batch/step", "root_path": "/api"}) is None


def test_a_rejected_reset_says_what_happened_to_the_running_episode(service: Any) -> None:
    sid = new_session(service)
    assert service.post(f"/sessions/{sid}/step", json={"action": "inc"}).status_code == 200
    # the env refuses these options (its reset raises): the reply says the episode at turn 1 ended
    message = assert_error(service.post(f"/sessions/{sid}/reset", json={"options": {"target": "nope"}}),
                           500, "EnvCrashed")
    assert message.startswith("reset rejected: ")
    assert "the episode that was running (turn 1) has ended" in message
    # and the next step says why it cannot run, instead of a bare "step() called before reset()"
    message = assert_error(service.post(f"/sessions/{sid}/step", json={"action": "inc"}), 409,
                           "ResetNeeded")
    assert "the last reset was rejected" in message and "ValueError" in message
    assert service.post(f"/sessions/{sid}/reset", json={"seed": 2}).status_code == 200
    # A good reset clears it.
    assert service.post(f"/sessions/{sid}/step", json={"action": "inc"}).status_code == 200


def test_integral_floats_are_integers_and_bools_are_not(service: Any) -> None:
    sid = new_session(service, seed=None)
    assert service.post(f"/sessions/{sid}/reset", json={"seed": 2305.0}).json()["episode_seed"] == 2305
    for bad in (True, 2.5, "3", -1, 2**63):
        assert_error(service.post(f"/sessions/{sid}/reset", json={"seed": bad}), 422, "RequestRejected",
                     "seed")


def test_openapi_declares_what_the_routes_answer(service: Any) -> None:
    spec = service.get("/openapi.json").json()
    step = spec["paths"]["/sessions/{session_id}/step"]["post"]["responses"]
    assert {"413", "422", "503", "504"} <= set(step)
    assert step["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    seed = spec["components"]["schemas"]["ResetRequest"]["properties"]["seed"]["anyOf"][0]
    assert seed["exclusiveMaximum"] == 2**63 and isinstance(seed["exclusiveMaximum"], int)  # not 9.22e18
    assert "appear only once" in spec["components"]["schemas"]["BatchStepRequest"]["description"]
    # a wrong method's 405 lists every method the path serves (Starlette's named only the first route)
    response = service.put("/sessions/abc")
    assert response.status_code == 405 and response.headers["allow"] == "DELETE, GET"
