"""`agentgym eval`, `serve-policy` and `view` as commands: a run killed with Ctrl-C keeps its finished
episodes and `--resume` completes it; one-line errors; the servers as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import CounterEnv, LiveServer
from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.cli.evaluation import parse_seeds
from agentgym.errors import ConfigError
from agentgym.service_kit.launcher import free_port, wait_healthy

runner = CliRunner()


class SlowCounter(CounterEnv):
    """Each step takes 50 ms, so an evaluation is still running when the test interrupts it."""

    def step(self, action: str):
        time.sleep(0.05)
        return super().step(action)


agentgym.register("test/eval-slow-v0", SlowCounter, max_turns=8, override=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


@pytest.mark.timeout(180)
def test_ctrl_c_keeps_finished_episodes_and_resume_completes_without_redoing(tmp_path: Path) -> None:
    from agentgym.http.server import create_app

    service = LiveServer(create_app(["test/eval-slow-v0"]))  # the subprocess plays on this env service
    out = tmp_path / "eval"
    log = out / "trajectories" / "test__eval-slow-v0" / "expert.jsonl"
    # A shell starts background jobs with SIGINT ignored and Python then keeps it ignored: the child installs
    # Python's own Ctrl-C handler first, so the test means the same however the suite was started.
    with_ctrl_c = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                   "sys.argv[0] = 'agentgym'; runpy.run_module('agentgym', run_name='__main__')")
    command = [sys.executable, "-c", with_ctrl_c, "eval", "--policy", "expert", "--envs", "test/eval-slow-v0",
               "--env-url", service.url, "--episodes", "40", "--concurrency", "1", "--out", str(out)]
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 120
        while len(_lines(log)) < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "interrupted" in stderr and "--resume" in stderr
        kept = _lines(log)
        assert 3 <= len(kept) < 40 and not (out / "results.json").exists()

        resumed = subprocess.run([sys.executable, "-m", "agentgym", "eval", "--out", str(out), "--resume"],
                                 capture_output=True, text=True, timeout=120, check=False)
        assert resumed.returncode == 0, resumed.stderr
        after = _lines(log)
        assert after[:len(kept)] == kept and len(after) == 40  # the rest played once, nothing redone
        assert sorted(json.loads(line)["seed"] for line in after) == list(range(1_000_000, 1_000_040))
        results = json.loads((out / "results.json").read_text())
        assert results["results"][0]["success_rate"] == 1.0 and results["results"][0]["episodes"] == 40
    finally:
        service.stop()


def test_eval_command_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "e"
    result = runner.invoke(app, ["eval", "--policy", "random", "--policy", "expert", "--envs", "maze-v0",
                                 "--env-arg", "maze-v0:size=2", "--seeds", "0-7", "--samples", "2",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "maze-v0, success: expert vs random" in output and "report.html" in output
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["envs"] == [{"id": "maze-v0", "kwargs": {"size": 2}, "max_turns": None,
                                          "url": None}]
    assert results["seeds"] == list(range(8)) and results["config"]["temperature"] == 1.0  # samples > 1
    assert {"pass@1", "pass@2"} <= set(results["results"][0])
    again = runner.invoke(app, ["eval", "--policy", "random", "--envs", "maze-v0", "--out", str(out)])
    assert again.exit_code == 2
    assert "already holds an evaluation; pass --resume" in " ".join(again.output.split())


@pytest.mark.parametrize("args, message", [
    (["--policy", "gpt-4", "--envs", "maze-v0"], "ConfigError: policy 'gpt-4' is not random, expert"),
    (["--policy", "random", "--envs", "maze-v9"], "not registered in that version; registered: maze-v0"),
    (["--policy", "random"], "give the envs to evaluate: --envs ID"),
    (["--envs", "maze-v0"], "give at least one --policy"),
    (["--policy", "random", "--envs", "maze-v0", "--seeds", "0-4", "--episodes", "3"],
     "--seeds gives 5 tasks"),
    (["--policy", "random", "--envs", "maze-v0", "--split", "nope"],
     "maze-v0 has no task split 'nope'; valid splits: train (0..999999), test (any integer >= 0)"),
    (["--policy", "random", "--envs", "maze-v0", "--env-arg", "sokoban-v0:size=3"], "write ENV_ID:KEY=VALUE"),
])
def test_eval_command_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["eval", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in " ".join(result.output.split()), result.output


def _run_folder(tmp: Path, *, config: str | None = None, checkpoint: bytes | None = None) -> Path:
    """An `agentgym train` run folder (a tiny model on maze-v0), with the given config.json or checkpoint.pt
    bytes."""
    import io

    import torch

    run = tmp / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(config if config is not None else json.dumps(
        {"model": {"tiny": {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64}},
         "env": {"id": "maze-v0"}, "seed": 0}))
    if checkpoint is None:
        buffer = io.BytesIO()
        torch.save({"model": {"weight": torch.zeros(4096)}, "iteration": 1}, buffer)
        checkpoint = buffer.getvalue()
    (run / "checkpoint.pt").write_bytes(checkpoint)
    return run


def _whole_checkpoint_cut_in_half(tmp: Path) -> bytes:
    whole = _run_folder(tmp / "whole").joinpath("checkpoint.pt").read_bytes()
    return whole[:len(whole) // 2]


def _damaged(case: str, tmp: Path) -> tuple[list[str], Path, str]:
    """(eval arguments, the file the error must name, what it must say) for one damaged input."""
    out = tmp / "eval"
    if case == "out is a file":
        (tmp / "taken").write_text("a file\n")
        return ["--policy", "random", "--envs", "maze-v0", "--out", str(tmp / "taken")], tmp / "taken", \
            "is a file, not a folder; give --out a folder"
    if case in ("plan.json is not JSON", "plan.json is {}"):
        out.mkdir()
        (out / "plan.json").write_text("{\"policies\": [" if case == "plan.json is not JSON" else "{}")
        said = ("is not JSON" if case == "plan.json is not JSON"
                else "is not an evaluation plan (no 'policies')")
        return ["--out", str(out), "--resume"], out / "plan.json", said
    if case == "run config.json is not JSON":
        run = _run_folder(tmp, config='{"model": {')
        return ["--policy", str(run), "--envs", "maze-v0", "--out", str(out)], run / "config.json", \
            "is not a run config"
    if case.startswith("checkpoint.pt is"):
        content = {"checkpoint.pt is empty": b"", "checkpoint.pt is text": b"iteration 3, loss 0.25\n",
                   "checkpoint.pt is truncated": None}[case]
        run = _run_folder(tmp, checkpoint=_whole_checkpoint_cut_in_half(tmp) if content is None else content)
        said = "is empty (0 bytes" if content == b"" else "is not a readable checkpoint"
        return ["--policy", str(run), "--out", str(out)], run / "checkpoint.pt", said
    assert case == "model config.json is not JSON"
    from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny

    model = tmp / "model"
    save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)), model)
    (model / "config.json").write_text((model / "config.json").read_text()[:40])  # a copy cut short
    return (["--policy", str(model), "--envs", "maze-v0", "--out", str(out)], model / "config.json",
            "is not JSON")


@pytest.mark.parametrize("case", ["out is a file", "plan.json is not JSON", "plan.json is {}",
                                  "run config.json is not JSON", "checkpoint.pt is empty",
                                  "checkpoint.pt is text", "checkpoint.pt is truncated",
                                  "model config.json is not JSON"])
def test_damaged_inputs_get_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    args, named, said = _damaged(case, tmp_path)
    result = runner.invoke(app, ["eval", *args])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output
    assert str(named) in output and said in output, result.output


def test_a_backwards_seed_range_says_so() -> None:
    result = runner.invoke(app, ["eval", "--policy", "random", "--envs", "maze-v0", "--seeds", "5-1"])
    assert result.exit_code == 2
    assert ("--seeds '5-1': the range 5-1 runs backwards; write it low-high (1-5)"
            in " ".join(result.output.split()))
    with pytest.raises(ConfigError, match="lists no seed"):
        parse_seeds(",")


def test_tables_are_whole_when_output_is_not_a_terminal(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    label = "a-policy-label-longer-than-the-column-rich-would-give-it"
    result = runner.invoke(app, ["eval", "--policy", f"random,name={label}", "--policy", "expert",
                                 "--envs", "maze-v0", "--env-arg", "maze-v0:size=2", "--seeds", "0-3",
                                 "--out", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if "policy" in line and "episodes" in line)
    assert all(name in header for name in ("success", "95% CI", "return", "invalid", "wall s")), header
    row = next(line for line in lines if label in line and "│" in line)
    assert "maze-v0" in row and "0%–" in row and "…" not in row, row
    listing = runner.invoke(app, ["envs"]).output.splitlines()
    for spec in agentgym.list_envs():
        assert any(spec.id in line and spec.description in line for line in listing), spec.id
    from agentgym.training.api.algorithm import list_algorithms

    listing = runner.invoke(app, ["algorithms"]).output.splitlines()
    for algo in list_algorithms():
        assert any(algo.name in line and algo.description in line for line in listing), algo.name


def test_resume_needs_the_folder() -> None:
    result = runner.invoke(app, ["eval", "--resume"])
    assert result.exit_code == 2 and "--resume needs --out DIR" in result.output


def test_split_names_a_task_split_of_every_env(tmp_path: Path) -> None:
    from agentgym.cli.evaluation import env_entries
    from agentgym.eval.policies import parse_policy

    entries = env_entries("tools-v0,maze-v0", [], [], "test", None, [parse_policy("random")])
    assert [(e.id, e.kwargs, e.split) for e in entries] == [("tools-v0", {}, "test"), ("maze-v0", {}, "test")]


def test_parse_seeds() -> None:
    assert parse_seeds("3,0-2, 9") == [3, 0, 1, 2, 9]
    with pytest.raises(ConfigError, match="is not a seed or a range"):
        parse_seeds("a-b")


def _wait(url: str, process: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(process.communicate()[1])
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


@pytest.mark.timeout(180)
def test_serve_policy_and_view_run_as_commands(tmp_path: Path) -> None:
    import openai

    from agentgym.backends.tiny import TinyModelConfig, build_tiny_model, save_tiny

    save_tiny(*build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)),
              tmp_path / "m")
    port = free_port()
    serving = subprocess.Popen([sys.executable, "-m", "agentgym", "serve-policy", str(tmp_path / "m"),
                                "--port", str(port), "--name", "mini", "--device", "cpu"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", serving)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["mini"]
        reply = client.chat.completions.create(model="mini", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
        assert reply.usage.completion_tokens <= 3
        out = tmp_path / "eval"
        result = runner.invoke(app, ["eval", "--policy", f"http://127.0.0.1:{port}/v1,max_new_tokens=4",
                                     "--policy", "random", "--envs", "maze-v0", "--episodes", "2",
                                     "--out", str(out)])
        assert result.exit_code == 0, result.output
    finally:
        serving.send_signal(signal.SIGINT)
        serving.communicate(timeout=30)
    view_port = free_port()
    viewing = subprocess.Popen([sys.executable, "-m", "agentgym", "view", str(out), "--port", str(view_port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{view_port}", viewing)
        assert "agentgym viewer" in httpx.get(f"http://127.0.0.1:{view_port}/").text
        episodes = httpx.get(f"http://127.0.0.1:{view_port}/api/episodes", params={"policy": "random"}).json()
        assert len(episodes) == 2 and {e["seed"] for e in episodes} == {1_000_000, 1_000_001}
    finally:
        viewing.send_signal(signal.SIGINT)
        viewing.communicate(timeout=30)
    bad = runner.invoke(app, ["view", str(tmp_path / "m")])
    assert bad.exit_code == 2 and "holds neither an evaluation" in " ".join(bad.output.split())
