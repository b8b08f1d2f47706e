"""benchmarks/replay_advantages.py: a run's recorded groups back through its own estimator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentgym.rollout.records import EpisodeGroup, Trajectory, Turn

ROOT = Path(__file__).resolve().parents[2]


def write_run(folder: Path) -> None:
    """One GRPO iteration: a group where one of two episodes reached the goal (returns 1 and 0: std-normalised
    advantages +0.7071 and −0.7071 on every turn), the loser with an invalid move."""
    win = Trajectory([Turn([], [], [], 0.0, "A", action="left"), Turn([], [], [], 1.0, "B", action="up")],
                     "t", 0, success=True)
    lose = Trajectory([Turn([], [], [], 0.0, "A", action="left"),
                       Turn([], [], [], 0.0, "A", action="search[red shoes]", invalid=True)], "t", 0)
    (folder / "trajectories").mkdir(parents=True)
    group = EpisodeGroup("g", "t", 0, [win, lose])
    (folder / "trajectories" / "iter_00001.jsonl").write_text(json.dumps(group.to_json()) + "\n")
    (folder / "config.json").write_text(json.dumps({"algorithm": {"name": "grpo", "args": {}}}))


def test_the_advantages_the_update_used_per_action(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from replay_advantages import replay
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    write_run(tmp_path)
    report = replay(tmp_path, None, "action").splitlines()
    assert report[2] == "iteration 1: goal reached per group [1] of [2], 4 turns, 25% invalid"
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[3:] for line in report[5:]}
    assert rows[("left", "yes")] == [" 2 ", " 50% ", " +0.000 ", " 50% ", ""]  # +0.7071 and −0.7071
    assert rows[("up", "yes")][2].strip() == "+0.707"
    assert rows[("search[red shoes]", "no")][2].strip() == "-0.707"
    by_word = replay(tmp_path, [1], "first-word")
    assert "| search | no | 1 | 25% | -0.707 | 0% |" in by_word


def test_other_arguments_or_another_estimator_on_the_same_groups(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "replay_advantages.py")
    write_run(tmp_path)
    # GRPO without the std: returns 1 and 0 about their mean 0.5
    plain = subprocess.run([sys.executable, script, str(tmp_path), "--arg", "normalize_std=false"],
                           capture_output=True, text=True)
    assert plain.returncode == 0 and "normalize_std=False" in plain.stdout
    assert "| up | yes | 1 | 25% | +0.500 | 100% |" in plain.stdout
    # RLOO: each return against the other episode's, +1 and -1
    rloo = subprocess.run([sys.executable, script, str(tmp_path), "--algorithm", "rloo"], capture_output=True,
                          text=True)
    assert rloo.returncode == 0 and "| search[red shoes] | no | 1 | 25% | -1.000 | 0% |" in rloo.stdout
    for bad, message in ((["--arg", "normalise_std=false"], "Did you mean algorithm.args.normalize_std?"),
                         (["--algorithm", "rlooo"], "no algorithm named 'rlooo'"),
                         (["--arg", "normalize_std"], "is not KEY=VALUE")):
        failed = subprocess.run([sys.executable, script, str(tmp_path), *bad], capture_output=True, text=True)
        assert failed.returncode == 1 and message in failed.stderr and len(failed.stderr.splitlines()) == 1


def test_a_folder_that_is_no_run_or_lacks_the_iteration_says_so(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "replay_advantages.py")
    missing = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode == 1 and "is not a run folder (no config.json)" in missing.stderr
    write_run(tmp_path)
    absent = subprocess.run([sys.executable, script, str(tmp_path), "--iterations", "3"], capture_output=True,
                            text=True)
    assert absent.returncode == 1 and "has no iteration 3; it has 1..1" in absent.stderr
    whole = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert whole.returncode == 0 and "| up | yes | 1 | 25% | +0.707 | 100% |" in whole.stdout
