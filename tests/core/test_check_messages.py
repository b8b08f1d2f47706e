"""``agentgym check`` on a broken env says how to fix it."""

from __future__ import annotations

from typer.testing import CliRunner

import agentgym
from agentgym.cli import app


class IgnoresTaskId(agentgym.Env):
    """Reports a task_id but picks the task from the seed only: ``task_id`` does not replay."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(0, 100))
        return f"target {self.target}", {"state_key": "start", "task_id": f"t/{self.target}"}

    def step(self, action):
        return "done", 0.0, True, False, {"state_key": "end"}


agentgym.register("test/ignores-task-id-v0", IgnoresTaskId, max_turns=3, override=True)


def test_a_task_id_that_does_not_replay_gets_the_fix() -> None:
    result = CliRunner().invoke(app, ["check", "test/ignores-task-id-v0"], env={"COLUMNS": "300"})
    assert result.exit_code == 1  # the command was right; the env it checked broke the contract
    assert "check_task_id_replay" in result.output or "task_id" in result.output
    assert "options['task_id']" in result.output and "leave task_id out of info" in result.output
