"""The viewer as a service: the token gate (bearer for scripts, a sign-in cookie for browsers), no
absolute path in any answer, damaged folders refused in one line before any banner, episode lists
and a big episode's turns served in pages, and an index that holds no episode's contents."""

from __future__ import annotations

import copy
import json
import shutil
import socket
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LiveServer
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.viewer.data import TURN_PAGE_BYTES, EpisodeIndex
from agentgym.eval.viewer.server import create_viewer_app

runner = CliRunner()
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real evaluation folder (random and expert on maze-v0, 300 tasks)."""
    out = tmp_path_factory.mktemp("evaluation")
    plan = EvalPlan((parse_policy("random"), parse_policy("expert")), (EnvEntry("maze-v0", {"size": 2}),),
                    tuple(range(300)))
    Evaluation(plan, out).run()
    return out


@pytest.fixture
def folder(evaluation: Path, tmp_path: Path) -> Path:
    """A copy of the evaluation a test may change."""
    return Path(shutil.copytree(evaluation, tmp_path / "eval"))


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port already listened on: should `view` ever get past its checks, it stops at binding it
    (with an error) instead of serving for good."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def random_log(folder: Path) -> Path:
    return folder / "trajectories" / "maze-v0" / "random.jsonl"


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def lengthen(folder: Path, *, turns: int, padding: int, episodes: int = 1) -> list[dict[str, Any]]:
    """Give the first ``episodes`` lines of the random policy's log ``turns`` turns each (made from the
    episode's own), every observation padded to ``padding`` characters; returns every line."""
    records = [json.loads(line) for line in random_log(folder).read_text().splitlines()]
    for record in records[:episodes]:
        own = record["turns"]
        record["turns"] = [{**copy.deepcopy(own[k % len(own)]), "action": f"move-{k}",
                            "observation": f"turn {k} " + "x" * padding} for k in range(turns)]
        record["num_turns"] = turns
    write_lines(random_log(folder), records)
    return records


# --- the token gate ---------------------------------------------------------------------------------


def test_a_token_guards_every_route_but_health_for_scripts_and_browsers(folder: Path) -> None:
    server = LiveServer(create_viewer_app(folder, token=TOKEN))
    try:
        with httpx.Client(base_url=server.url, follow_redirects=False) as client:
            assert client.get("/health").status_code == 200
            for path in ("/api/meta", "/api/episodes", "/api/tasks", "/api/episode/x", "/openapi.json",
                         "/docs"):
                refused = client.get(path)
                assert refused.status_code == 401, path
                assert refused.json()["error"]["type"] == "AuthenticationError"
                assert refused.headers["www-authenticate"] == "Bearer"
            assert client.get("/api/meta", headers={"Authorization": "Bearer wrong"}).status_code == 401
            meta = client.get("/api/meta", headers={"Authorization": f"Bearer {TOKEN}"})
            assert meta.json()["episodes"] == 600

            # A browser without the cookie gets the sign-in form, not the page.
            sign_in = client.get("/")
            assert sign_in.status_code == 401 and 'action="/login"' in sign_in.text
            assert "agentgym viewer" in sign_in.text and "api/meta" not in sign_in.text
            assert client.get("/", params={"token": "wrong"}).status_code == 401
            assert client.post("/login", data={"token": "wrong"}).status_code == 401
            too_big = client.post("/login", content=b"token=" + b"x" * 10_000,
                                  headers={"content-type": "application/x-www-form-urlencoded"})
            assert too_big.status_code == 413

            # The token given once (link or form) becomes an HttpOnly cookie that holds no token.
            for opened in (client.get("/", params={"token": TOKEN}),
                           client.post("/login", data={"token": TOKEN})):
                assert opened.status_code == 303 and opened.headers["location"] == "/"
                cookie = opened.headers["set-cookie"]
                assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and TOKEN not in cookie
            name, _, value = cookie.split(";")[0].partition("=")
        with httpx.Client(base_url=server.url, cookies={name: value}) as browser:
            assert "agentgym viewer" in browser.get("/").text and browser.get("/").status_code == 200
            assert browser.get("/api/meta").json()["kind"] == "eval"
        with httpx.Client(base_url=server.url, cookies={name: value + "x"}) as forged:
            assert forged.get("/api/meta").status_code == 401
    finally:
        server.stop()


def test_view_on_a_public_host_needs_a_token_or_an_explicit_allowance(folder: Path, busy_port: int) -> None:
    result = runner.invoke(app, ["view", str(folder), "--host", "0.0.0.0", "--port", str(busy_port)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--host 0.0.0.0 without --token" in lines[0] and "--allow-no-token" in lines[0]
    assert "read every prompt and response" in lines[0] and "viewer of" not in result.output


def test_no_answer_names_a_path_of_this_machine(folder: Path) -> None:
    server = LiveServer(create_viewer_app(folder))
    hidden = {str(folder), str(folder.resolve()), str(folder.parent), str(Path.home())}
    try:
        with httpx.Client(base_url=server.url) as client:
            listed = client.get("/api/episodes", params={"policy": "random"}).json()
            eid, other = (s["id"] for s in listed[:2])
            answers = [client.get(path) for path in (
                "/", "/health", "/api/meta", "/api/episodes", "/api/tasks", f"/api/episode/{eid}",
                "/api/episode/maze-v0|nobody|0|0", "/openapi.json", "/docs", "/no-such-route")]
            random_log(folder).write_text("")  # the folder changes under the viewer
            changed = client.get(f"/api/episode/{other}")
            answers.append(changed)
    finally:
        server.stop()
    assert changed.status_code == 409
    assert "changed since the viewer started" in changed.json()["error"]["message"]
    assert [a.status_code for a in answers[6:10]] == [404, 200, 200, 404]
    for answer in answers:
        assert not any(path in answer.text for path in hidden), answer.url


# --- damaged folders --------------------------------------------------------------------------------


def refused(folder: Path, port: int) -> str:
    """The output of `agentgym view` on a folder it must refuse, checked to be one line without a banner."""
    result = runner.invoke(app, ["view", str(folder), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "viewer of" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_damaged_plan_or_config_is_one_line(folder: Path, tmp_path: Path, busy_port: int) -> None:
    (folder / "plan.json").write_text('{"envs": [')
    assert "plan.json is damaged (not valid JSON" in refused(folder, busy_port)
    (folder / "plan.json").write_text('{"envs": "maze-v0", "policies": []}')
    assert "plan.json is damaged (it needs 'envs'" in refused(folder, busy_port)
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.json").write_bytes(b"\xff\xfe not json")
    assert "config.json is damaged (not valid JSON" in refused(run, busy_port)
    (run / "config.json").write_text('{"env": "maze-v0"}')
    assert "config.json is damaged ('env' and 'algorithm' must be objects)" in refused(run, busy_port)


def test_a_trajectory_line_lacking_fields_is_one_line_naming_it(folder: Path, tmp_path: Path,
                                                                busy_port: int) -> None:
    records = [json.loads(line) for line in random_log(folder).read_text().splitlines()]
    del records[2]["return"]
    write_lines(random_log(folder), records)
    line = refused(folder, busy_port)
    assert "trajectories/maze-v0/random.jsonl line 3: the episode has no 'return'" in line
    assert "repair or delete it" in line

    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"env": {"id": "maze-v0"}, "algorithm": {"name": "grpo"}}))
    turn = {"prompt_ids": [1, 2], "response_ids": [3], "reward": 1.0, "state_key": "s"}
    group = {"group_id": "g0",
             "trajectories": [{"turns": [turn], "seed": 0, "task_id": "t", "success": True}]}
    write_lines(run / "trajectories" / "iter_00001.jsonl", [group, {"trajectories": []}])
    assert "trajectories/iter_00001.jsonl line 2: the group has no 'group_id'" in refused(run, busy_port)
    write_lines(run / "trajectories" / "iter_00001.jsonl",
                [group, {**group, "trajectories": [{"turns": [{}]}]}])
    assert "line 2: turn 0 of trajectory 0 has no 'prompt_ids' list" in refused(run, busy_port)
    # A line cut short by a crash is skipped and counted, as the evaluation store skips it.
    (run / "trajectories" / "iter_00001.jsonl").write_text(json.dumps(group) + "\n"
                                                           + '{"group_id": "g1", "traj')
    viewed = EpisodeIndex(run)
    assert viewed.episodes()[0] == 1 and viewed.meta()["skipped_lines"] == 1


def test_lines_the_plan_does_not_ask_for_are_skipped_and_counted(folder: Path) -> None:
    first = json.loads(random_log(folder).read_text().splitlines()[0])
    strays = [{**first, "task_index": 300}, {**first, "task_index": 1}]  # past the plan; the wrong seed
    with open(random_log(folder), "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in strays))
    viewed = EpisodeIndex(folder)
    assert viewed.episodes(policy="random")[0] == 300 and viewed.meta()["skipped_lines"] == 2
    assert viewed.episodes(policy="random", task_index=1)[1][0]["seed"] == 1


# --- paging -----------------------------------------------------------------------------------------


def test_episode_lists_come_in_pages_with_the_total(folder: Path) -> None:
    server = LiveServer(create_viewer_app(folder))
    try:
        with httpx.Client(base_url=server.url) as client:
            first = client.get("/api/episodes", params={"policy": "random"})
            assert first.headers["x-total-count"] == "300" and len(first.json()) == 100
            seen = []
            for offset in range(0, 400, 100):
                page = client.get("/api/episodes",
                                  params={"policy": "random", "offset": offset, "limit": 100})
                assert page.headers["x-total-count"] == "300"
                seen += [s["task_index"] for s in page.json()]
            assert seen == list(range(300))
            assert client.get("/api/episodes", params={"limit": 0}).status_code == 422
            assert client.get("/api/episodes", params={"limit": 5000}).status_code == 422
            tasks = client.get("/api/tasks", params={"env": "maze-v0"}).json()
            assert [t["task_index"] for t in tasks] == list(range(300))
    finally:
        server.stop()


def test_a_big_episode_is_sent_in_pages_of_bounded_size(folder: Path) -> None:
    records = lengthen(folder, turns=60, padding=60_000)  # a 3.6 MB episode
    server = LiveServer(create_viewer_app(folder))
    try:
        with httpx.Client(base_url=server.url) as client:
            eid = client.get("/api/episodes", params={"policy": "random"}).json()[0]["id"]
            turns, offsets, offset = [], [], 0
            while offset is not None:
                page = client.get(f"/api/episode/{eid}", params={"turn_offset": offset, "turn_limit": 50})
                assert page.status_code == 200 and len(page.content) < TURN_PAGE_BYTES + 100_000
                body = page.json()
                assert body["num_turns"] == 60 and body["turn_offset"] == offset and body["turns"]
                offsets.append(offset)
                turns += body["turns"]
                offset = body["next_turn_offset"]
            small = client.get(f"/api/episode/{eid}", params={"turn_offset": 10, "turn_limit": 3}).json()
    finally:
        server.stop()
    assert len(offsets) >= 4  # 60 turns of 60 kB do not fit 1 MiB pages in fewer
    assert [(t["action"], t["observation"]) for t in turns] == [(t["action"], t["observation"])
                                                                for t in records[0]["turns"]]
    assert [t["action"] for t in small["turns"]] == ["move-10", "move-11", "move-12"]
    assert small["next_turn_offset"] == 13


def test_the_index_holds_no_episode_contents(folder: Path) -> None:
    lengthen(folder, turns=40, padding=2_000, episodes=300)  # a 25 MB log
    size = random_log(folder).stat().st_size
    assert size > 20_000_000
    tracemalloc.start()
    try:
        viewed = EpisodeIndex(folder)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert viewed.episodes(policy="random")[0] == 300
    assert held < size / 20, f"the index holds {held} bytes of a {size}-byte folder"
    last = viewed.episodes(policy="random", offset=299, limit=1)[1][0]["id"]
    episode = viewed.episode(last, turn_offset=39)
    assert episode is not None and [t["action"] for t in episode["turns"]] == ["move-39"]

