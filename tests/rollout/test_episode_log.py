"""The episode log: one format, one writer, one reader. Folders written before it (tests/data/legacy_runs, by
the code of commit 96fba02) open in the viewer, resume as evaluations and read back as the old readers read
them; new lines round-trip to the same records."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentgym.eval.harness import Evaluation
from agentgym.eval.plan import EvalPlan
from agentgym.eval.store import EvalStore
from agentgym.eval.viewer.data import EpisodeIndex
from agentgym.rollout.episode_log import (
    FORMAT,
    DamagedLine,
    EpisodeLog,
    episode_line,
    groups_of,
    iteration_lines,
    read_line,
    trajectory_of,
    write_iteration,
)
from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn
from agentgym.run_folder import RunFolder

LEGACY = Path(__file__).resolve().parent.parent / "data" / "legacy_runs"

#: sha256 of everything the viewer of commit 96fba02 showed of each folder (``_shown``: meta, every summary,
#: every episode with all its turns), computed with that code before the format changed.
OLD_VIEWER = {
    "train_run": "7c73cb9756187e65bc8a8df8a5e0741c41a34dee9742b8843a37322df18069be",
    "eval_run": "24f7df67b24c7ba7072326399ae7624bea0d17bf2dcf8ec103b27aed5f263591",
    "eval_model": "73ac8946f3a3b0378ff2ca10f9704aa79642b925a2ffa40f068513938d933446",
}


def _shown(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the viewer shows of ``folder``, and its digest as ``OLD_VIEWER`` took it. A training run's reset
    observation and step infos were stored but not shown before; they are left out of the digest."""
    view = EpisodeIndex(folder)
    meta = view.meta()
    meta.pop("title")
    summaries = view.episodes(limit=10**6)[1]
    episodes = {s["id"]: view.episode(s["id"], turn_limit=10**6) for s in summaries}
    shown = {"meta": meta, "summaries": summaries, "episodes": episodes}
    digested = json.loads(json.dumps(shown))
    if meta["kind"] == "train":
        for episode in digested["episodes"].values():
            episode["observation"] = episode["info"] = None
            for turn in episode["turns"]:
                turn["info"] = None
    digest = hashlib.sha256(json.dumps(digested, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return shown, {"digest": digest}


@pytest.mark.parametrize("name", sorted(OLD_VIEWER))
def test_the_viewer_shows_folders_written_before_the_format_as_it_did(name: str) -> None:
    shown, digest = _shown(LEGACY / name)
    assert digest["digest"] == OLD_VIEWER[name]


def test_a_training_run_written_before_reads_as_its_groups() -> None:
    shown, _ = _shown(LEGACY / "train_run")
    meta, summaries = shown["meta"], shown["summaries"]
    assert (meta["kind"], meta["envs"], meta["policies"], meta["iterations"], meta["episodes"]) == (
        "train", ["maze-v0"], ["gigpo"], [1, 2], 8)
    assert [s["id"] for s in summaries[:3]] == [
        "1|it1-g0|it1-g0-t0", "1|it1-g0|it1-g0-t1", "1|it1-g1|it1-g1-t0"]
    assert [s["return"] for s in summaries] == [1.0] + [0.0] * 7
    assert [s["seed"] for s in summaries[::2]] == [522157, 889738, 979463, 80824]
    assert all(s["turns"] == 4 for s in summaries)
    first = shown["episodes"]["1|it1-g0|it1-g0-t0"]
    assert [(t["action"], t["reward"], t["state_key"].rsplit("@")[1]) for t in first["turns"]] == [
        ("right", 0.0, "(1,1)"), ("right", 0.0, "(1,2)"), ("down", 0.0, "(1,3)"), ("down", 1.0, "(2,3)")]
    # Now shown too: what the run stored of the reset and the steps.
    assert first["observation"].startswith("###") and first["turns"][0]["info"]["task_id"]

    # The reader gives back exactly the groups the run held (the old reader: EpisodeGroup.from_json).
    folder = RunFolder(LEGACY / "train_run")
    for iteration, path in folder.trajectory_files():
        old = [EpisodeGroup.from_json(json.loads(line)) for line in path.read_text().splitlines()]
        assert groups_of(EpisodeLog(path, iteration).read()) == old


def test_evaluations_written_before_read_as_the_old_store_read_them() -> None:
    store = EvalStore(LEGACY / "eval_run")
    expert, random = (groups_of(store.records("maze-v0", p)) for p in ("expert", "random"))
    assert [[(t.success, t.episode_return, len(t.turns)) for t in g.trajectories] for g in expert] == \
        [[(True, 1.0, 4)] * 2] * 3
    assert [[(t.success, t.episode_return, len(t.turns)) for t in g.trajectories] for g in random] == \
        [[(False, 0.0, 8)] * 2] * 3
    assert [g.group_id for g in expert] == ["task-0", "task-1", "task-2"]
    assert [t.trajectory_id for t in expert[0].trajectories] == ["0-s0", "0-s1"]
    model = groups_of(EvalStore(LEGACY / "eval_model").records("maze-v0", "train_run"))
    tokens = [[sum(turn.extras["completion_tokens"] for turn in t.turns) for t in g.trajectories]
              for g in model]
    assert tokens == [[32, 22], [23, 32]]
    assert all(len(turn.response_ids) == turn.extras["completion_tokens"]
               for g in model for t in g.trajectories for turn in t.turns)


def test_an_evaluation_written_before_resumes_and_reports_as_before(tmp_path: Path) -> None:
    out = Path(shutil.copytree(LEGACY / "eval_run", tmp_path / "eval"))
    log = out / "trajectories" / "maze-v0" / "expert.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    kept, dropped = lines[:4], [json.loads(line) for line in lines[4:]]  # task 2's two episodes to replay
    log.write_text("".join(kept))
    store = EvalStore(out)
    results = Evaluation(EvalPlan.from_json(store.read_plan()), out, resume=True).run()
    replayed = store.records("maze-v0", "expert")[4:]
    assert [r["episode_format"] for r in replayed] == [FORMAT, FORMAT]  # the new lines, after the old ones
    assert [[t["action"] for t in r["turns"]] for r in replayed] == \
        [[t["action"] for t in r["turns"]] for r in dropped]
    old = json.loads((LEGACY / "eval_run" / "results.json").read_text())["results"]
    timed = ("wall_s", "episodes_per_s")
    assert [{k: v for k, v in row.items() if k not in timed} for row in results["results"]] == \
        [{k: v for k, v in row.items() if k not in timed} for row in old]


# --- the format --------------------------------------------------------------------------------------


def _trajectory(seed: int) -> Trajectory:
    turns = [Turn([1, 2], [3, 4], [-0.5, -0.25], 0.0, "s0", action="up", observation="o1",
                  extras={"advantage": 0.5}, info={"state_key": "s1"}),
             Turn([5], [6], [-1.0], 1.0, "s1", invalid=True, tool_calls=2, info={"success": True})]
    return Trajectory(turns, "t", seed, success=True, truncated=False, trajectory_id=f"g{seed}-t0",
                      answer=["a"], first_observation="o0", first_info={"task_id": "t"}, note="why")


def test_a_line_round_trips_to_the_same_trajectory() -> None:
    trajectory = _trajectory(3)
    line = episode_line(trajectory, group_id="g3", task_index=0, sample=0, iteration=2)
    read = read_line(json.dumps(line))
    assert len(read) == 1 and read[0]["episode_format"] == FORMAT and read[0]["return"] == 1.0
    assert trajectory_of(read[0]) == trajectory
    texts = episode_line(trajectory, group_id="g", task_index=1, sample=0, env="e", policy="p",
                         texts=[("prompt", "response")], prompt_ids=False, split="test")
    assert texts["split"] == "test" and texts["turns"][0]["prompt"] == "prompt"
    assert texts["turns"][1]["prompt"] == "" and texts["turns"][1]["prompt_ids"] == []


def test_a_training_iteration_is_one_line_per_episode_and_reads_back_as_its_groups(tmp_path: Path) -> None:
    groups = [EpisodeGroup(f"it1-g{i}", "t", i, [_trajectory(i), _trajectory(i)]) for i in range(2)]
    path = RunFolder(tmp_path).trajectory_file(1)
    write_iteration(path, groups, 1)
    assert len(path.read_text().splitlines()) == 4
    assert groups_of(EpisodeLog(path, 1).read()) == groups
    assert [(r["task_index"], r["sample"], r["iteration"]) for r in iteration_lines(groups, 1)] == [
        (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]


def test_damaged_and_newer_lines_say_what_is_wrong() -> None:
    line = episode_line(_trajectory(0), group_id="g", task_index=0, sample=0)
    with pytest.raises(DamagedLine, match="the episode has no 'sample'"):
        read_line(json.dumps({k: v for k, v in line.items() if k != "sample"}))
    with pytest.raises(DamagedLine, match="episode_format 2 is newer than this agentgym reads"):
        read_line(json.dumps({**line, "episode_format": 2}))
    with pytest.raises(DamagedLine, match="turn 1 of the episode has no numeric 'reward'"):
        read_line(json.dumps({**line, "turns": [line["turns"][0], {"reward": "x"}]}))
    with pytest.raises(ValueError):
        read_line('{"episode_format": 1, "task')  # cut short: not JSON


def test_a_cut_last_line_is_mended_before_the_next_append(tmp_path: Path) -> None:
    log = EpisodeLog(tmp_path / "e.jsonl")
    first = episode_line(_trajectory(0), group_id="g", task_index=0, sample=0)
    log.append([first])
    with open(log.path, "a") as fh:
        fh.write('{"episode_format": 1, "ta')
    assert "set aside in e.jsonl.cut" in (log.append([{**first, "sample": 1}]) or "")
    assert [r["sample"] for r in log.read()] == [0, 1]
    assert (tmp_path / "e.jsonl.cut").read_text() == '{"episode_format": 1, "ta\n'
