"""The agentgym command line: envs, check, play, version, serve (as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.service_kit.launcher import free_port, start_service, stop_service

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
        [sys.executable, "-m", "agentgym", "serve", "maze-v0", "--port", str(port), "--max-sessions", "4"],
        url)
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


# --- serve commands refuse bad flags with one line --------------------------------------------

WIDE = {"COLUMNS": "400"}  # so a one-line message is one line here too, not wrapped at 80 columns


def one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["serve", "--port", "70000"], "--port must be in [1, 65535], got 70000"),
    (["serve", "--port", "0"], "--port must be in [1, 65535], got 0"),
    (["serve", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["serve", "--max-sessions", "0"], "--max-sessions must be >= 1, got 0"),
    (["serve", "--ttl-s", "-5"], "--ttl-s must be > 0, got -5"),
    (["serve", "--step-timeout-s", "0"], "--step-timeout-s must be > 0, got 0"),
    (["serve", "--max-body-bytes", "0"], "--max-body-bytes must be >= 1, got 0"),
    (["sandbox", "serve", "--max-concurrency", "0"], "--max-concurrency must be >= 1, got 0"),
    (["sandbox", "serve", "--pool-size", "-1"], "--pool-size must be >= 0, got -1"),
    (["sandbox", "serve", "--port", "99999"], "--port must be in [1, 65535], got 99999"),
    (["retrieval", "serve", "idx", "--max-k", "0"], "--max-k must be >= 1, got 0"),
])
def test_serve_commands_name_the_bad_flag_and_its_range(args: list[str], expected: str) -> None:
    assert expected in one_line_error(args)


@pytest.mark.parametrize(("args", "what"), [
    (["serve", "--host", "0.0.0.0"], "create sessions and run env code"),
    (["sandbox", "serve", "--host", "0.0.0.0", "--backend", "subprocess"],
     "run arbitrary code on this machine"),
    (["retrieval", "serve", "idx", "--host", "::"], "query this index"),
])
def test_a_non_loopback_host_without_a_token_is_refused(args: list[str], what: str) -> None:
    message = one_line_error(args)
    assert what in message and "--allow-no-token" in message and "--token" in message


def test_an_occupied_port_is_one_line() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        message = one_line_error(["serve", "maze-v0", "--port", str(port)])
    assert f"--port {port}: the port is already in use" in message


def test_serve_policy_and_view_check_their_port_before_loading_anything(tmp_path) -> None:
    import socket

    assert "--port must be in [1, 65535], got 70000" in one_line_error(["serve-policy", str(tmp_path),
                                                                         "--port", "70000"])
    assert "--port must be in [1, 65535], got 0" in one_line_error(["view", str(tmp_path / "nothing"),
                                                                     "--port", "0"])
    assert "--max-new-tokens must be >= 1, got 0" in one_line_error(["serve-policy", str(tmp_path),
                                                                     "--max-new-tokens", "0"])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        message = one_line_error(["serve-policy", str(tmp_path), "--port", str(port)])
    assert f"--port {port}: the port is already in use" in message


def test_retrieval_index_refuses_a_binary_corpus_and_an_out_under_a_file(tmp_path) -> None:
    binary = tmp_path / "corpus.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert "not UTF-8 text" in one_line_error(["retrieval", "index", str(binary), "--out",
                                               str(tmp_path / "i")])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d1", "title": "Ostavia", "text": "A country."}\n')
    a_file = tmp_path / "file"
    a_file.write_text("x")
    message = one_line_error(["retrieval", "index", str(corpus), "--out", str(a_file / "index")])
    assert "file" in message
