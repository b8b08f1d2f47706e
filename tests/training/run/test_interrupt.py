"""Ctrl-C and SIGTERM during training: the work done is saved, the user is told how to resume, and the
resumed run is the run that would have happened without the interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.rollout import RolloutHooks
from agentgym.training import load_config, register_hook_option
from agentgym.training.run.loop import train

#: A small run (seconds per iteration on CPU).
TINY = ["checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2", "eval.num_episodes=2",
        "sft.num_episodes=2", "sft.num_epochs=1", "env.max_turns=3"]


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def agentgym_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentgym", *args]


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended (status {process.returncode}) before the condition held:\n"
                                 f"{process.stdout.read() if process.stdout else ''}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def logged_iterations(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["iteration"] for line in path.read_text().splitlines()] if path.is_file() else []


# --- a real process, a real Ctrl-C --------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_ctrl_c_saves_a_checkpoint_says_how_to_resume_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    process = subprocess.Popen(agentgym_cmd("train", *sets(*TINY, "iterations=12"), "--out", str(out)),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    wait_for(lambda: len(logged_iterations(out)) >= 1, process)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 130, output
    saved = torch.load(out / "checkpoint.pt", weights_only=False)["iteration"]
    assert 1 <= saved < 12
    assert logged_iterations(out) == list(range(1, saved + 1))
    assert f"iteration {saved}" in output and f"agentgym train --resume {out}" in output
    assert "Traceback" not in output

    resumed = subprocess.run(agentgym_cmd("train", "--resume", str(out)), capture_output=True, text=True,
                             timeout=400, env={**os.environ, "COLUMNS": "200"})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["iterations"] == 12 and [h["iteration"] for h in report["history"]] == list(range(1, 13))
    assert f"RL {saved + 1}/12" in resumed.stdout  # not a terminal: a line per iteration (or few seconds)


@pytest.mark.timeout(600)
def test_ctrl_c_before_the_first_checkpoint_says_so_and_how_to_restart(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # A long SFT warm start, so the signal arrives before any RL iteration.
    process = subprocess.Popen(agentgym_cmd("train", *sets(*TINY, "iterations=2", "sft.num_epochs=400"),
                                            "--out", str(out)),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    wait_for(lambda: (out / "config.json").is_file(), process)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 130, output
    assert not (out / "checkpoint.pt").exists()
    restart = f"agentgym train {out / 'config.json'} --out {out} --overwrite"
    assert "no checkpoint" in output and restart in output, output
    assert "Traceback" not in output
    # The folder's config is the run's config: the suggested restart repeats the same run.
    assert load_config(out / "config.json") == load_config(None, [*TINY, "iterations=2",
                                                                  "sft.num_epochs=400"])

    result = CliRunner().invoke(app, ["train", "--resume", str(out)])
    assert result.exit_code == 2
    assert "no checkpoint" in result.output and restart in result.output.replace("\n", "")


# --- signals delivered at a chosen moment (from a rollout hook, inside collection) ---------------------


@dataclass(frozen=True)
class NoArgs:
    pass


#: The signals the hook sends, and the iteration whose first turn sends them (consumed once).
PLAN: dict[str, object] = {}


class SendSignals(RolloutHooks):
    """Sends ``PLAN["signals"]`` to this process after the first turn of iteration ``PLAN["iteration"]``."""

    def after_turn(self, episodes, context):
        if PLAN and context.iteration == PLAN["iteration"]:
            signals = PLAN.pop("signals")
            PLAN.clear()  # first: the last signal may stop the run inside os.kill
            for sig in signals:  # type: ignore[union-attr]
                os.kill(os.getpid(), sig)
        return ()


register_hook_option("test_send_signals", lambda args: SendSignals(), NoArgs, override=True)
WITH_HOOK = [*TINY, "iterations=3", "loss.kl_coef=0.05", "algorithm.hooks.test_send_signals={}"]


def without_perf(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    PLAN.clear()
    return train(load_config(None, WITH_HOOK), tmp_path_factory.mktemp("full") / "run")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signals, saved", [
    ([signal.SIGINT], 2),                  # finish iteration 2, then stop
    ([signal.SIGINT, signal.SIGINT], 1),   # a second Ctrl-C abandons iteration 2 at once
    ([signal.SIGTERM], 1),                 # SIGTERM (a scheduler's notice) abandons at once too
])
def test_a_stopped_run_resumes_into_the_uninterrupted_run(tmp_path: Path, uninterrupted: dict,
                                                          signals: list[int], saved: int) -> None:
    out = tmp_path / "run"
    PLAN.update(iteration=2, signals=signals)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a background shell
    stopped = train(load_config(None, WITH_HOOK), out)
    assert not PLAN, "the hook did not run"
    assert stopped["stopped_after"] == saved and stopped["signal"] == signal.Signals(signals[-1]).name
    assert torch.load(out / "checkpoint.pt", weights_only=False)["iteration"] == saved
    assert logged_iterations(out) == list(range(1, saved + 1))
    assert signal.getsignal(signal.SIGINT) is before  # handlers given back

    resumed = train(load_config(None, WITH_HOOK), out, resume=True)
    assert without_perf(resumed["history"]) == without_perf(uninterrupted["history"])
    assert resumed["eval"]["after"] == uninterrupted["eval"]["after"]


def test_sigterm_exits_143_with_the_resume_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    PLAN.update(iteration=2, signals=[signal.SIGTERM])
    result = CliRunner().invoke(app, ["train", *sets(*WITH_HOOK), "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 143, result.output
    assert f"agentgym train --resume {out}" in result.output and "iteration 1" in result.output
