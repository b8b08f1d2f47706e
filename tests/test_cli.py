"""The agentgym command line: envs, check, play, version, serve (as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.http.launcher import free_port, start_service, stop_service

runner = CliRunner()


def test_version_and_envs() -> None:
    assert runner.invoke(app, ["version"]).output.strip() == agentgym.__version__
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    assert "maze-v0" in result.output and "sokoban-v0" in result.output


def test_check_ok_and_unknown() -> None:
    result = runner.invoke(app, ["check", "maze-v0", "--episodes", "2"])
    assert result.exit_code == 0, result.output
    assert "honours the env contract" in result.output
    result = runner.invoke(app, ["check", "maze-v9"])
    assert result.exit_code == 2 and "maze-v0" in result.output


def test_play_expert_solves_maze() -> None:
    result = runner.invoke(app, ["play", "maze-v0", "--seed", "3", "--expert"])
    assert result.exit_code == 0, result.output
    assert "success after" in result.output


def test_play_interactive_reads_actions_and_quits() -> None:
    result = runner.invoke(app, ["play", "maze-v0", "--seed", "3"], input="jump\n:q\n")
    assert result.exit_code == 0, result.output
    assert "invalid action" in result.output
    assert "actions:" in result.output  # admissible actions are shown


@pytest.mark.timeout(60)
def test_serve_answers_curl() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_service(
        [sys.executable, "-m", "agentgym", "serve", "maze-v0", "--port", str(port), "--max-sessions", "4"], url)
    try:
        def curl(*args: str) -> dict:
            out = subprocess.run(["curl", "-s", "-H", "content-type: application/json", *args],
                                 check=True, capture_output=True, text=True, timeout=10).stdout
            return json.loads(out)

        session = curl("-X", "POST", f"{url}/sessions", "-d", '{"env_id": "maze-v0"}')
        sid = session["session_id"]
        reset = curl("-X", "POST", f"{url}/sessions/{sid}/reset", "-d", '{"seed": 0}')
        assert "state_key" in reset["info"]
        action = curl("-X", "POST", f"{url}/sessions/{sid}/expert")["action"]
        step = curl("-X", "POST", f"{url}/sessions/{sid}/step", "-d", json.dumps({"action": action}))
        assert step["turn"] == 1 and step["info"]["invalid_action"] is False
        error = curl("-X", "POST", f"{url}/sessions", "-d", '{"env_id": "sokoban-v0"}')
        assert error["error"]["type"] == "UnknownEnv"  # this service serves maze-v0 only
    finally:
        stop_service(process)


def test_serve_refuses_unknown_env_at_startup() -> None:
    result = runner.invoke(app, ["serve", "maez-v0"])
    assert result.exit_code == 2 and "maze-v0" in result.output


def test_algorithms_lists_every_plugin_kind() -> None:
    result = runner.invoke(app, ["algorithms"])
    assert result.exit_code == 0, result.output
    for name in ("gigpo", "grpo", "rloo", "ppo_clip", "gspo", "kl", "entropy"):
        assert name in result.output
