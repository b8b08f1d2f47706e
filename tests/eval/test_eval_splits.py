"""`agentgym eval` over task splits (``--split``/``--task-range``), in-process and on an env service, and
with judged rewards (``--judge``, a run's ``env.judge``) against a real scripted judge server."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LiveServer
from scripted_judge import ScriptedJudgeServer
from typer.testing import CliRunner

import agentgym
import agentgym.envs  # noqa: F401  (registers the built-in envs)
from agentgym.cli import app
from agentgym.core import HELD_OUT_SEED_START
from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EnvEntry, EvalPlan
from agentgym.eval.policies import parse_policy
from agentgym.eval.store import EvalStore

runner = CliRunner()


@pytest.fixture
def scripted() -> Iterator[ScriptedJudgeServer]:
    server = ScriptedJudgeServer()
    yield server
    server.live.stop()


def _eval(args: list[str]) -> Any:
    return runner.invoke(app, ["eval", *args], env={"COLUMNS": "200"})


def test_every_policy_plays_the_tasks_of_the_split(tmp_path: Path) -> None:
    out = tmp_path / "e"
    result = _eval(["--policy", "expert", "--policy", "random", "--envs", "webshop-v0,maze-v0",
                    "--env-arg", "webshop-v0:num_products=40", "--env-arg", "maze-v0:size=2",
                    "--split", "test", "--task-range", "1:4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    store = EvalStore(out)
    for policy in ("expert", "random"):
        shop = store.records("webshop-v0", policy)
        # test task i of a 40-goal catalog is goal i (its first four goals are held out)
        assert [(r["task_index"], r["split"], r["index"], r["task_id"]) for r in shop] == [
            (0, "test", 1, "webshop/gen-s0-n40/1"), (1, "test", 2, "webshop/gen-s0-n40/2"),
            (2, "test", 3, "webshop/gen-s0-n40/3")]
        assert [r["info"]["task_ref"] for r in shop] == [{"split": "test", "index": i} for i in (1, 2, 3)]
        maze = store.records("maze-v0", policy)
        # a seeded split: test task i is the episode of seed HELD_OUT_SEED_START + i
        assert [r["task_id"] for r in maze] == [f"maze/size2/loop0.15/{HELD_OUT_SEED_START + i}"
                                                for i in (1, 2, 3)]
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [1, 2, 3]
    assert [env["split"] for env in results["config"]["envs"]] == ["test", "test"]
    rows = {(row["env"], row["policy"]): row for row in results["results"]}
    shop = rows["webshop-v0", "expert"]
    assert (shop["success_rate"], shop["split"]) == (1.0, "test")
    assert "task indices 1..3 of split 'test'" in (out / "report.md").read_text()
    # the paired comparison pairs the two policies task by task: three tasks each
    assert results["comparisons"] and all(c["tasks"] == 3 for c in results["comparisons"])
    # the plan records the split, so a resume plays the same tasks
    assert EvalPlan.from_json(json.loads((out / "plan.json").read_text())).envs[0].split == "test"
    again = _eval(["--out", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    assert len(store.records("webshop-v0", "expert")) == 3


def test_a_split_of_named_tasks_plays_the_same_task_by_index_whatever_the_env(tmp_path: Path) -> None:
    entry = EnvEntry("code-tests-v0", split="problems")
    plan = EvalPlan((parse_policy("expert"),), (entry,), (5, 1))
    results = Evaluation(plan, tmp_path / "e").run()
    records = EvalStore(tmp_path / "e").records("code-tests-v0", "expert")
    assert [(r["index"], r["task_id"]) for r in records] == [(5, "max_subarray"), (1, "fizzbuzz")]
    assert results["results"][0]["success_rate"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--envs", "code-tests-v0", "--split", "problems", "--task-range", "30:40"],
     "task index 39 is out of range for split 'problems' of code-tests-v0; valid indices: 0..35 "
     "(--split problems; `agentgym envs --tasks code-tests-v0` lists its splits)"),
    (["--envs", "maze-v0", "--split", "valid", "--task-range", "0:2"],
     "maze-v0 has no task split 'valid'; valid splits: train (0..999999), test (any integer >= 0)"),
    (["--envs", "maze-v0", "--task-range", "0:5"], "--task-range picks tasks of a task split: give --split"),
    (["--envs", "maze-v0", "--split", "test", "--seeds", "0-4"], "give --task-range START:END instead"),
    (["--envs", "maze-v0", "--split", "test", "--task-range", "5:2"],
     "--task-range '5:2': write START:END with 0 <= START < END"),
    (["--envs", "maze-v0", "--split", "test", "--task-range", "0:3", "--episodes", "4"],
     "--task-range gives 3 tasks but --episodes says 4"),
])
def test_split_and_range_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = _eval(["--policy", "random", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "x" / "plan.json").exists()


def test_split_tasks_travel_to_an_env_service(tmp_path: Path, live_server: Any) -> None:
    server: LiveServer = live_server(["maze-v0"])
    args = ["--policy", "expert", "--envs", "maze-v0", "--env-arg", "maze-v0:size=2", "--split", "test",
            "--task-range", "0:3"]
    remote = _eval([*args, "--env-url", server.url, "--out", str(tmp_path / "remote")])
    local = _eval([*args, "--out", str(tmp_path / "local")])
    assert remote.exit_code == 0 and local.exit_code == 0, remote.output + local.output

    def played(folder: str) -> list[tuple[Any, ...]]:
        return [(r["index"], r["task_id"], r["observation"], r["return"])
                for r in EvalStore(tmp_path / folder).records("maze-v0", "expert")]

    assert played("remote") == played("local")
    assert [task_id for _, task_id, _, _ in played("remote")] == [
        f"maze/size2/loop0.15/{HELD_OUT_SEED_START + i}" for i in range(3)]


def _judge_file(tmp_path: Path, url: str, **extra: Any) -> Path:
    path = tmp_path / "judge.json"
    # the scripted server answers "SCORE: <x>" for the last want=<x> of the request
    path.write_text(json.dumps({"base_url": url, "model": "judge-model",
                                "rubric": "The agent reaches the goal. want=0.25", **extra}))
    return path


def test_judge_scores_are_the_rewards_of_an_evaluation(tmp_path: Path, scripted: ScriptedJudgeServer) -> None:
    judge = _judge_file(tmp_path, scripted.url, success_threshold=0.5)
    out = tmp_path / "e"
    result = _eval(["--policy", "expert", "--envs", "maze-v0", "--env-arg", "maze-v0:size=2", "--seeds",
                    "0-2", "--judge", str(judge), "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = EvalStore(out).records("maze-v0", "expert")
    # the expert solves every maze, but the judge's 0.25 is the return, under the 0.5 needed for success
    assert [(r["return"], r["success"]) for r in records] == [(0.25, False)] * 3
    last = records[0]["turns"][-1]["info"]["judge"]
    assert (last["score"], last["model"], last["env_return"]) == (0.25, "judge-model", 1.0)
    assert len(scripted.bodies) == 3  # one request per episode (three different transcripts)
    assert all(body["model"] == "judge-model" for body in scripted.bodies)
    results = json.loads((out / "results.json").read_text())
    assert results["results"][0]["judge_model"] == "judge-model"
    assert results["results"][0]["mean_return"] == pytest.approx(0.25)
    assert "Judged rewards (an LLM judge's score from a rubric): maze-v0 by judge-model." in (
        out / "report.md").read_text()


def test_bad_judge_files_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "judge.json"
    bad.write_text(json.dumps({"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r", "url": "x"}))
    result = _eval(["--policy", "random", "--envs", "maze-v0", "--judge", str(bad),
                    "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert f"--judge {bad}: unknown field 'url'; the fields are base_url, model, rubric" in " ".join(
        result.output.split())
    missing = _eval(["--policy", "random", "--envs", "maze-v0", "--judge", str(tmp_path / "none.json"),
                     "--out", str(tmp_path / "y")])
    assert missing.exit_code == 2 and "cannot read it" in missing.output


def test_a_run_trained_with_a_judge_is_evaluated_with_it(tmp_path: Path) -> None:
    import torch

    from agentgym.cli.evaluation import env_entries
    from agentgym.judge import JudgeSettings as JudgeConfig

    judge = dataclasses.asdict(JudgeConfig(base_url="http://127.0.0.1:8001/v1", model="judge",
                                           rubric="Reach the goal.", success_threshold=0.5))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({
        "model": {"tiny": {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64}},
        "env": {"id": "maze-v0", "kwargs": {"size": 2}, "judge": judge}, "seed": 0}))
    buffer = io.BytesIO()
    torch.save({"model": {}, "iteration": 1}, buffer)
    (run / "checkpoint.pt").write_bytes(buffer.getvalue())
    [entry] = env_entries(None, [], [], None, None, [parse_policy(str(run))])
    assert (entry.id, entry.kwargs, entry.judge) == ("maze-v0", {"size": 2}, judge)
    # --judge replaces it
    other = {**judge, "model": "other"}
    [replaced] = env_entries(None, [], [], "test", None, [parse_policy(str(run))], judge=other)
    assert (replaced.judge, replaced.split) == (other, "test")
