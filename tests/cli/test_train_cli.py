"""``agentgym train`` as a user meets it: no silent overwrite, mistakes caught before anything is created,
finished runs that extend, one-line errors, the presets in ``--help`` and a final line in points."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]

#: The quickstart shrunk to seconds: two iterations of 2 tasks × 2 episodes, tiny evaluations and SFT.
TINY = ["iterations=2", "checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2",
        "eval.num_episodes=2", "sft.num_episodes=2", "sft.num_epochs=1", "env.max_turns=3"]


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def train(*args: str):
    return runner.invoke(app, ["train", *args])


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path → hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class NoExpertCounter(agentgym.Env):
    """Count to three; an env without an expert (so no SFT demonstrations)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return "count=0", {"state_key": "0"}

    def step(self, action):
        self.count += action.strip() == "inc"
        won = self.count >= 3
        return f"count={self.count}", float(won), won, False, {"state_key": str(self.count), "success": won}


agentgym.register("test/no-expert-v0", NoExpertCounter, max_turns=5, override=True)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished two-iteration run and the command's output."""
    out = tmp_path_factory.mktemp("runs") / "done"
    result = train(*sets(*TINY), "--out", str(out))
    assert result.exit_code == 0, result.output
    return out, result.output


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{output}"
    return lines[0]


# --- never lose a user's work --------------------------------------------------------------------


def test_out_on_an_existing_run_refuses_in_one_line_and_touches_nothing(finished_run, tmp_path: Path) -> None:
    run = copy_of(finished_run[0], tmp_path)
    before = contents(run)
    result = train(*sets(*TINY), "--out", str(run))
    assert result.exit_code == 2
    line = one_line(result.output)
    assert str(run) in line and f"--resume {run}" in line and "--overwrite" in line
    assert contents(run) == before


def test_overwrite_clears_the_old_run_first(finished_run, tmp_path: Path) -> None:
    run = copy_of(finished_run[0], tmp_path)
    stale = run / "trajectories" / "iter_00099.jsonl"
    stale.write_text("{}\n")
    result = train(*sets(*TINY, "iterations=1"), "--out", str(run), "--overwrite")
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == ["iter_00001.jsonl"]
    assert json.loads((run / "report.json").read_text())["iterations"] == 1


def test_overwrite_never_deletes_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "thesis.tex").write_text("months of work")
    for extra in ([], ["--overwrite"]):
        result = train(*sets(*TINY), "--out", str(folder), *extra)
        assert result.exit_code == 2
        assert "not a run" in one_line(result.output)
    assert (folder / "thesis.tex").read_text() == "months of work"


@pytest.mark.parametrize("override, named", [
    ("env.id=maze-v9", "maze-v0"),
    ("env.kwargs.bogus=1", "bogus"),
    ("model.path=/no/such/model", "/no/such/model"),
    ("model.device=cuda:99", "model.device"),
    ("algorithm.args.gamma=often", "algorithm.args.gamma"),
    ("env.id=test/no-expert-v0", "sft.enabled"),
])
def test_mistakes_fail_in_one_line_before_the_run_folder_exists(tmp_path: Path, override: str,
                                                                named: str) -> None:
    out = tmp_path / "run"
    result = train(*sets(*TINY, override), "--out", str(out))
    assert result.exit_code == 2
    assert named in one_line(result.output)
    assert not out.exists()


def test_resume_extends_a_finished_run_and_records_each_change(finished_run, tmp_path: Path) -> None:
    run = copy_of(finished_run[0], tmp_path)
    result = train("--resume", str(run), *sets("iterations=3", "eval.every=3"))
    assert result.exit_code == 0, result.output
    # The same run extended again, this time from an edited copy of its config file.
    edited = yaml.safe_load((run / "config.json").read_text())
    edited["iterations"] = 4
    (tmp_path / "longer.yaml").write_text(yaml.safe_dump(edited))
    result = train(str(tmp_path / "longer.yaml"), "--resume", str(run))
    assert result.exit_code == 0, result.output

    report = json.loads((run / "report.json").read_text())
    assert report["iterations"] == 4
    assert [h["iteration"] for h in report["history"]] == [1, 2, 3, 4]
    assert json.loads((run / "config.json").read_text())["iterations"] == 4
    history = report["config_history"]
    assert [(h["iteration"], h["changes"]) for h in history] == [
        (2, {"iterations": {"from": 2, "to": 3}, "eval.every": {"from": 0, "to": 3}}),
        (3, {"iterations": {"from": 3, "to": 4}}),
    ]
    assert sorted(p.name for p in (run / "trajectories").iterdir())[-1] == "iter_00004.jsonl"


def test_resume_rejects_changes_that_would_make_it_another_run(finished_run, tmp_path: Path) -> None:
    run = copy_of(finished_run[0], tmp_path)
    before = contents(run)
    result = train("--resume", str(run), *sets("iterations=3", "rollout.group_size=4", "optim.lr=1e-3"))
    assert result.exit_code == 2
    line = one_line(result.output)
    assert "rollout.group_size" in line and "optim.lr" in line and "iterations" in line  # what may change
    assert contents(run) == before


def test_resume_of_a_finished_run_says_how_to_extend_it(finished_run, tmp_path: Path) -> None:
    run = copy_of(finished_run[0], tmp_path)
    result = train("--resume", str(run))
    assert result.exit_code == 2
    assert "--set iterations=" in one_line(result.output)
    result = train("--resume", str(run), "--set", "iterations=1")
    assert result.exit_code == 2
    assert "iteration 2" in one_line(result.output)


def test_resume_of_a_folder_without_a_run_says_so(tmp_path: Path) -> None:
    result = train("--resume", str(tmp_path / "nothing"))
    assert result.exit_code == 2
    assert "no run" in one_line(result.output)


# --- errors and output a user understands ------------------------------------------------------------


def test_the_final_line_speaks_in_points(finished_run) -> None:
    output = finished_run[1]
    summary = next(line for line in output.splitlines() if "held-out success" in line)
    assert re.search(r"[+-]\d+ points", summary), summary
    assert not re.search(r"[+-]\d+%", summary), summary


def test_output_that_is_not_a_terminal_has_a_line_per_phase_and_no_third_party_bars(finished_run) -> None:
    output = finished_run[1]
    assert "RL 1/2" in output and "RL 2/2" in output
    assert "SFT" in output
    for bar in ("Writing model shards", "Loading weights", "it/s]"):
        assert bar not in output


def test_version_flag() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == agentgym.__version__


def test_train_help_lists_the_shipped_presets() -> None:
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    presets = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert presets and all(name in result.output for name in presets)


@pytest.mark.timeout(600)
def test_a_terminal_gets_progress_bars_not_lines(tmp_path: Path) -> None:
    """Run in a real pseudo-terminal: rich bars for SFT and RL, and no timestamped log lines."""
    import os
    import pty
    import subprocess
    import sys
    import threading

    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "agentgym", "train", *sets(*TINY),
                                "--out", str(tmp_path / "run")],
                               stdin=follower, stdout=follower, stderr=follower, close_fds=True,
                               env={**os.environ, "COLUMNS": "160", "TERM": "xterm-256color"})
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:  # keep draining, or the run blocks on a full terminal buffer
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert process.wait(timeout=500) == 0
    reader.join(timeout=10)
    os.close(leader)
    output = b"".join(chunks).decode("utf-8", "replace")
    assert "━" in output  # rich's bar
    assert "SFT" in output and "RL" in output and "2/2" in output
    assert not re.search(r"\[\d:\d\d:\d\d\] RL", output)  # the line format is for logs, not terminals
    assert "held-out success" in output
