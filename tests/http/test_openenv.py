"""OpenEnv's protocol on the env service, driven by OpenEnv's own client package (``openenv`` 0.10)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient as OpenEnvClient
from openenv.core.generic_client import GenericEnvClient

import agentgym

pytestmark = pytest.mark.timeout(120)


@dataclass
class MazeObservation:
    text: str
    admissible: list[str]
    turn: int


class MazeClient(OpenEnvClient[dict, MazeObservation, dict]):
    """A typed client, written the way OpenEnv's docs ask env authors to write one."""

    def _step_payload(self, action: str) -> dict[str, Any]:
        return {"action": action}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MazeObservation]:
        obs = payload["observation"]
        return StepResult(MazeObservation(obs["text"], obs["info"].get("admissible_actions", []),
                                          obs["turn"]),
                          reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload


def test_openenv_generic_client_plays_an_env_as_locally(live_server) -> None:
    server = live_server(["maze-v0", "test/http-counter-v0"])
    local = agentgym.make("maze-v0")
    expected_obs, _ = local.reset(seed=3)
    with GenericEnvClient(base_url=f"{server.url}/openenv/maze-v0").sync() as env:
        result = env.reset(seed=3)
        assert result.observation["text"] == expected_obs and result.done is False and result.reward is None
        for action in ["up", "left", "down", "jump"]:
            obs, reward, terminated, truncated, info = local.step(action)
            result = env.step({"action": action})
            assert ((result.observation["text"], result.reward, result.done)
                    == (obs, reward, terminated or truncated))
            assert result.observation["info"] == info
        state = env.state()
        assert state["step_count"] == 4 and state["episode_seed"] == 3 and state["env_id"] == "maze-v0"
        assert httpx.get(f"{server.url}/health").json()["active_sessions"] == 1
    for _ in range(50):  # the session goes with the connection
        if httpx.get(f"{server.url}/health").json()["active_sessions"] == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert httpx.get(f"{server.url}/health").json()["active_sessions"] == 0


def test_openenv_typed_client_and_errors(live_server) -> None:
    server = live_server(["test/http-counter-v0"])

    async def play() -> None:
        async with MazeClient(base_url=f"{server.url}/openenv/test/http-counter-v0") as env:
            with pytest.raises(RuntimeError, match=r"step\(\) called before reset.*EXECUTION_ERROR"):
                await env.step("inc")
            first = await env.reset(seed=1, episode_id="ep-1")
            assert first.observation.admissible == ["inc", "dec"] and first.observation.turn == 0
            done = first.done
            turns = 0
            while not done:
                result = await env.step("inc")
                done, turns = result.done, turns + 1
            assert result.reward == 1.0 and turns == 4
            assert (await env.state())["episode_id"] == "ep-1"
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                await env._send_and_receive({"type": "step", "data": {"action": 3}})
            with pytest.raises(RuntimeError, match="UNKNOWN_TYPE"):
                await env._send_and_receive({"type": "dance"})

    asyncio.run(play())


def test_openenv_http_routes(live_server) -> None:
    server = live_server(["maze-v0"], max_sessions=1)
    base = f"{server.url}/openenv/maze-v0"
    assert httpx.get(f"{base}/health").json() == {"status": "healthy"}
    schema = httpx.get(f"{base}/schema").json()
    assert schema["action"]["properties"]["action"]["type"] == "string"
    assert httpx.get(f"{base}/metadata").json()["name"] == "maze-v0"
    reset = httpx.post(f"{base}/reset", json={"seed": 3}).json()
    assert reset["observation"]["text"] == agentgym.make("maze-v0").reset(seed=3)[0]
    assert reset["done"] is False
    step = httpx.post(f"{base}/step", json={"action": {"action": "up"}})
    assert step.status_code == 409 and "/openenv/maze-v0/ws" in step.json()["error"]["message"]
    assert httpx.get(f"{server.url}/openenv/nope-v0/health").status_code == 404
    assert httpx.get(f"{server.url}/openenv").json() == [{"env_id": "maze-v0",
                                                          "base_path": "/openenv/maze-v0"}]

    async def over_capacity() -> None:
        async with GenericEnvClient(base_url=base) as first:
            await first.reset(seed=1)
            second = GenericEnvClient(base_url=base)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                await second.reset(seed=1)
            await second.close()

    asyncio.run(over_capacity())


def test_openenv_websocket_needs_the_token(live_server) -> None:
    server = live_server(["maze-v0"], token="s3cret")

    async def refused() -> None:
        env = GenericEnvClient(base_url=f"{server.url}/openenv/maze-v0")
        with pytest.raises(ConnectionError):
            await env.connect()

    asyncio.run(refused())


def test_our_socket_client_plays_as_a_local_env_and_raises_its_errors(live_server) -> None:
    from agentgym.errors import EpisodeFinished, RemoteEnvError, ResetNeeded
    from agentgym.http.socket_client import AsyncSocketEnv

    server = live_server(["test/http-counter-v0"], token="tok")
    local = agentgym.make("test/http-counter-v0")

    async def play() -> None:
        env = await AsyncSocketEnv.connect(server.url, "test/http-counter-v0", token="tok")
        with pytest.raises(ResetNeeded, match="before reset"):
            await env.step("inc")
        assert await env.reset(seed=2, options={"target": 9}) == local.reset(seed=2, options={"target": 9})
        while not env.episode_over:
            assert await env.step("inc") == local.step("inc")
        with pytest.raises(EpisodeFinished):
            await env.step("inc")
        assert (await env.state())["step_count"] == env.turn > 0
        await env.close()
        with pytest.raises(RemoteEnvError, match="could not open"):
            await AsyncSocketEnv.connect(server.url, "test/http-counter-v0", token="wrong")

    asyncio.run(play())


def test_a_websocket_client_that_vanishes_leaves_no_session(live_server) -> None:
    from websockets.asyncio.client import connect

    server = live_server(["maze-v0"])

    async def vanish() -> None:
        ws = await connect(f"ws{server.url[4:]}/openenv/maze-v0/ws")
        await ws.send('{"type": "reset", "data": {"seed": 1}}')
        await ws.recv()
        assert httpx.get(f"{server.url}/health").json()["active_sessions"] == 1
        ws.transport.abort()  # no close frame: the connection just drops

    asyncio.run(vanish())
    for _ in range(100):
        if httpx.get(f"{server.url}/health").json()["active_sessions"] == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert httpx.get(f"{server.url}/health").json()["active_sessions"] == 0


def test_openenv_task_api_shape(live_server) -> None:
    """OpenEnv 0.10's Task API: splits, counts, tasks and ranges, at {base}/{env} and at {base} alike."""
    server = live_server(["maze-v0", "code-tests-v0"])
    maze, code = f"{server.url}/openenv/maze-v0", f"{server.url}/openenv/code-tests-v0"
    assert httpx.get(f"{maze}/list_environments").json() == ["maze-v0"]
    splits = httpx.get(f"{maze}/maze-v0/splits").json()
    assert splits == httpx.get(f"{maze}/splits").json()
    assert [(s["name"], s["type"], s["size"]) for s in splits] == [("train", "train", 1_000_000),
                                                                   ("test", "test", None)]
    assert httpx.get(f"{code}/code-tests-v0/splits").json()[0]["type"] == "validation"  # OpenEnv's default
    # counts: a named split's size; a procedural split has none
    count = httpx.post(f"{code}/code-tests-v0/num_tasks", json={"split": "problems"}).json()
    assert count == {"num_tasks": 36}
    assert httpx.post(f"{maze}/maze-v0/num_tasks", json={"split": "test"}).json() == {"num_tasks": None}
    # one task, a range, a list: what Env.task says
    local = agentgym.make("code-tests-v0")
    task = httpx.post(f"{code}/code-tests-v0/task", json={"split": "problems", "index": 3}).json()
    assert task == {"task": local.task("problems", 3)}
    ranged = httpx.post(f"{code}/code-tests-v0/task_range", json={"split": "problems", "start": 34}).json()
    assert ranged == {"tasks": [local.task("problems", 34), local.task("problems", 35)]}
    listed = httpx.post(f"{code}/code-tests-v0/tasks", json={"split": "problems"}).json()
    assert listed["env_name"] == "code-tests-v0" and len(listed["tasks"]) == 36
    seeds = httpx.post(f"{maze}/maze-v0/task_range", json={"split": "test", "start": 2, "stop": 4}).json()
    assert [t["seed"] for t in seeds["tasks"]] == [1_000_002, 1_000_003]
    # bad input: an index past the end is OpenEnv's 400; an unbounded range without a stop, a bad split, 422
    past = httpx.post(f"{code}/code-tests-v0/task", json={"split": "problems", "index": 36})
    assert past.status_code == 400 and "problems" in past.json()["error"]["message"]
    unbounded = httpx.post(f"{maze}/maze-v0/task_range", json={"split": "test", "start": 0})
    assert unbounded.status_code == 422 and "give task_range a stop" in unbounded.json()["error"]["message"]
    wrong = httpx.post(f"{maze}/maze-v0/num_tasks", json={"split": "nope"})
    assert wrong.status_code == 422 and "'train', 'test'" in wrong.json()["error"]["message"]
    assert httpx.get(f"{server.url}/openenv/nope-v0/nope-v0/splits").status_code == 404


def test_openenv_reset_starts_a_task_of_a_split(live_server) -> None:
    server = live_server(["code-tests-v0"])
    expected, _ = agentgym.make("code-tests-v0").reset(options={"split": "problems", "index": 5})
    with GenericEnvClient(base_url=f"{server.url}/openenv/code-tests-v0").sync() as env:
        result = env.reset(split="problems", index=5)
        assert result.observation["text"] == expected
        assert result.observation["info"]["task_ref"] == {"split": "problems", "index": 5}
    reset = httpx.post(f"{server.url}/openenv/code-tests-v0/reset", json={"split": "problems", "index": 5})
    assert reset.json()["observation"]["text"] == expected
