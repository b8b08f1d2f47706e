"""benchmarks/algorithms.py --work: a run killed part-way goes on from its last iteration when the grid's
command runs again, and its row is the row the run would have had in one go."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The quickstart maze cut to seconds: a few SFT epochs, 2 tasks x 2 episodes, a short held-out evaluation.
CHEAP = ["sft.num_epochs=2", "sft.num_episodes=4", "rollout.num_tasks=2", "rollout.group_size=2",
         "eval.num_episodes=4", "env.max_turns=4"]


@pytest.fixture
def algorithms(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("algorithms")


def spec(work: Path | None) -> dict:
    return {"model": "tiny", "tag": "work-test", "task": "maze", "variant": "grpo", "seed": 3,
            "iterations": 3, "set": CHEAP, "threads": 1, "shared_warm_start": True, "keep": None,
            "work": str(work) if work else None}


def test_a_killed_run_resumes_into_the_row_of_the_run_in_one_go(algorithms, monkeypatch,
                                                                tmp_path: Path) -> None:
    from agentgym.training.run import loop

    in_one_go = algorithms.run_one(spec(None))
    assert "resumed" not in in_one_go

    train = loop.train
    # Stopped after iteration 1 (as a SIGTERM at the end of a sitting stops it, its checkpoint written)
    monkeypatch.setattr(loop, "train", functools.partial(train, stop_after=1))
    with pytest.raises(SystemExit, match=r"seed3 stopped after iteration 1 \(asked to\); the same command"):
        algorithms.run_one(spec(tmp_path))
    folder = tmp_path / algorithms.run_name(spec(tmp_path))
    ledger = json.loads((folder / algorithms.LEDGER).read_text())
    assert ledger["resumed"] == [] and len(ledger["commits"]) == 1 and ledger["wall_s"] > 0
    name = algorithms.run_name(spec(tmp_path))
    assert algorithms.grid_status([spec(tmp_path)], []) == (
        f"{name}: 1 of 3 iterations in {folder} (stopped; the same command goes on from there)")
    with algorithms.run_lock(folder):
        assert algorithms.grid_status([spec(tmp_path)], []).endswith("(training now)")
    monkeypatch.setattr(loop, "train", train)

    resumed = algorithms.run_one(spec(tmp_path))
    assert resumed["resumed"] == [1] and len(resumed["commits"]) == 2
    assert resumed["wall_s"] > ledger["wall_s"]
    for field in ("before", "after", "curve", "nll_per_token", "gen_tokens_per_task", "iters_to_threshold"):
        assert resumed[field] == in_one_go[field], field
    assert "work" not in resumed and "keep" not in resumed
    grid = [spec(tmp_path), {**spec(tmp_path), "seed": 4}]
    assert algorithms.grid_status(grid, [resumed]).splitlines() == [
        f"{name}: done, {resumed['before']:.0%} -> {resumed['after']:.0%}",
        f"{name.replace('seed3', 'seed4')}: to run"]

    # The process went after training, before its row was saved: the next one reads the finished run.
    monkeypatch.setattr(loop, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = algorithms.run_one(spec(tmp_path))
    assert again["after"] == resumed["after"] and again["curve"] == resumed["curve"]
    assert again["resumed"] == [1]


def test_a_run_another_process_trains_is_not_trained_twice(algorithms, tmp_path: Path) -> None:
    folder = tmp_path / algorithms.run_name(spec(tmp_path))
    with algorithms.run_lock(folder):
        with pytest.raises(RuntimeError, match="is being trained by another process"):
            algorithms.run_one(spec(tmp_path))
        assert algorithms.grid_status([spec(tmp_path)], []).endswith(": starting now (warm start)")
    assert algorithms.grid_status([spec(tmp_path)], []).endswith(": to run")
    assert not folder.exists()


def test_the_grid_command_saves_the_row_and_clears_the_folder(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "algorithms.py")
    grid = [sys.executable, script, "--tasks", "maze", "--variants", "grpo", "--seeds", "3",
            "--iterations", "2", "--tag", "work-test", *(a for item in CHEAP for a in ("--set", item)),
            "--results", str(tmp_path / "rows.json"), "--work", str(tmp_path / "work"),
            "--keep", str(tmp_path / "kept")]
    done = subprocess.run(grid, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["variant"], r["seed"], r["iterations"], len(r["curve"])) for r in rows] == [("grpo", 3, 2, 2)]
    # Each held-out task's outcome, played on the evaluation's seeds: what the paired table compares.
    assert len(rows[0]["after_by_task"]) == len(rows[0]["eval_seeds"]) == 4
    assert sum(rows[0]["after_by_task"]) / 4 == pytest.approx(rows[0]["after"])
    assert list((tmp_path / "work").iterdir()) == []  # checkpoints and lock gone with the row saved
    assert (tmp_path / "algorithms_work-test_maze.png").is_file()  # the plot beside its rows
    kept = tmp_path / "kept" / "tiny_work-test_maze_grpo_seed3"
    assert sorted(p.name for p in (kept / "trajectories").iterdir()) == ["iter_00001.jsonl",
                                                                        "iter_00002.jsonl"]
    assert (kept / "model" / "config.json").is_file()
    assert not [p for p in kept.rglob("*") if p.suffix in (".pt", ".safetensors", ".bin")]  # weights left out
    status = subprocess.run([*grid, "--status"], capture_output=True, text=True, cwd=ROOT)
    assert status.stdout.strip().startswith("tiny_work-test_maze_grpo_seed3: done, ")
