"""A stop (a second Ctrl-C, or SIGTERM) is honoured inside every long phase of a run: the update, the SFT warm
start and the evaluation between iterations; the run exits, keeps what finished and says so in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from learning import small

from agentgym.training import load_config
from agentgym.training.api.terms import LossTerm, register_loss_term
from agentgym.training.run.interrupt import StopNow, StopSignals
from agentgym.training.run.loop import Trainer, train

#: A small run (seconds per iteration on CPU).
TINY = ["checkpoint_every=0", "rollout.num_tasks=2", "rollout.group_size=2", "eval.num_episodes=2",
        "sft.num_episodes=2", "sft.num_epochs=1", "env.max_turns=3"]
#: How long a stopped run may take to exit; the phases it is stopped in would run for hours.
EXIT_DEADLINE_S = 300


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


class RunningCommand:
    """``agentgym train ...`` in a subprocess, its output collected line by line as it comes."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "agentgym", "train", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "COLUMNS": "200"})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"the run ended (status {self.process.returncode}) "
                                     "before the condition held:\n" + "\n".join(self.lines))
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError("timed out waiting for the run:\n" + "\n".join(self.lines))
            time.sleep(0.05)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def exit_status(self) -> int:
        """Waits for the exit; a run still going at the deadline did not honour the stop."""
        try:
            status = self.process.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("the run went on after the stop:\n" + "\n".join(self.lines[-20:])) from None
        self._reader.join(timeout=30)
        return status


def saved_iteration(out: Path) -> int:
    return int(torch.load(out / "checkpoint.pt", weights_only=False)["iteration"])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("signals, status", [([signal.SIGINT, signal.SIGINT], 130), ([signal.SIGTERM], 143)],
                         ids=["ctrl-c-twice", "sigterm"])
def test_a_stop_inside_a_long_update_ends_the_run_and_keeps_the_warm_start(tmp_path: Path, signals: list[int],
                                                                           status: int) -> None:
    out = tmp_path / "run"
    # An update of 100000 epochs: it would run for hours.
    run = RunningCommand(*sets(*TINY, "iterations=3", "optim.num_epochs=100000"), "--out", str(out))
    # Written just before the update.
    run.wait_for(lambda: (out / "trajectories" / "iter_00001.jsonl").is_file())
    for number, sig in enumerate(signals):
        run.process.send_signal(sig)
        if number == 0 and len(signals) > 1:  # the handler has seen the first before the second is sent
            run.wait_for(lambda: run.said("SIGINT: stopping after this iteration"))
    assert run.exit_status() == status, "\n".join(run.lines)
    name = signal.Signals(signals[-1]).name
    stops = [line for line in run.lines if line.startswith(f"Stopped ({name})")]
    assert len(stops) == 1, run.lines
    assert "the warm start is saved" in stops[0] and f"agentgym train --resume {out}" in stops[0]
    assert not any("Traceback" in line for line in run.lines), "\n".join(run.lines)
    assert saved_iteration(out) == 0  # SFT and the evaluations before RL are kept
    assert (out / "metrics.jsonl").read_text() == ""


@pytest.mark.timeout(900)
def test_sigterm_inside_a_long_sft_ends_the_run_at_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = RunningCommand(*sets(*TINY, "iterations=2", "sft.num_epochs=100000"), "--out", str(out))
    run.wait_for(lambda: run.said("] SFT"))
    run.process.send_signal(signal.SIGTERM)
    assert run.exit_status() == 143, "\n".join(run.lines)
    stops = [line for line in run.lines if line.startswith("Stopped (SIGTERM)")]
    assert len(stops) == 1 and "no checkpoint" in stops[0], run.lines
    assert not any("Traceback" in line for line in run.lines), "\n".join(run.lines)
    assert not (out / "checkpoint.pt").exists()


def test_a_signal_inside_a_finalizer_stops_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler raises where the signal lands; in a finalizer the garbage collector ran, Python would print
    # the StopNow as "Exception ignored in ..." with a traceback. The stop must still happen, silently.
    reported: list = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    class SignalledWhileCollected:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the signal cuts the sleep short and the handler runs here, inside the finalizer

    class FailsWhenCollected:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own error")

    with StopSignals() as stop, pytest.raises(StopNow):
        with stop.region("immediate"):
            SignalledWhileCollected()
            assert stop.now and stop.signal == "SIGTERM"
            FailsWhenCollected()
            stop.poll()
    assert [type(item.exc_value) for item in reported] == [ValueError]  # other errors are still reported
    assert sys.unraisablehook == reported.append  # the hook is given back


# --- signals sent from inside the update, at a chosen step ------------------------------------------------


@dataclass(frozen=True)
class NoArgs:
    pass


#: The signals the term sends, the iteration and the update step (1-based) that send them (consumed once).
PLAN: dict[str, object] = {}


class SendSignals(LossTerm):
    """A loss term of weight 0 that sends ``PLAN["signals"]`` to this process at a chosen update step."""

    def __init__(self, args: NoArgs) -> None:
        self.iteration = 1
        self.calls = 0

    def __call__(self, batch, outputs, cfg):
        self.calls += 1
        self.send_at(self.calls)
        return outputs.logprobs.new_zeros(()), {}

    def end_iteration(self) -> dict[str, float]:
        self.send_at("end")  # the update is over; an evaluation between iterations comes next
        self.iteration += 1
        self.calls = 0
        return {}

    def send_at(self, step: int | str) -> None:
        if PLAN and self.iteration == PLAN["iteration"] and step == PLAN["step"]:
            signals = PLAN.pop("signals")
            PLAN.clear()  # first: the last signal may stop the run inside os.kill
            for sig in signals:  # type: ignore[union-attr]
                os.kill(os.getpid(), sig)


register_loss_term("test_stop_signals", SendSignals, NoArgs, override=True)
WITH_TERM = [*TINY, "iterations=3", "loss.kl_coef=0.05", "loss.terms.test_stop_signals={}"]


def without_perf(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in history]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    PLAN.clear()
    return train(load_config(None, WITH_TERM), tmp_path_factory.mktemp("full") / "run")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("signals, step, saved, abandoned", [
    ([signal.SIGTERM], 1, 1, None),              # before the first optimiser step: iteration 1 is saved
    ([signal.SIGINT, signal.SIGINT], 2, 0, 2),   # after it: back to the last checkpoint (the warm start)
], ids=["before-the-first-step", "after-a-step"])
def test_a_stopped_update_resumes_into_the_uninterrupted_run(tmp_path: Path, uninterrupted: dict,
                                                             signals: list[int], step: int, saved: int,
                                                             abandoned: int | None) -> None:
    out = tmp_path / "run"
    PLAN.update(iteration=2, step=step, signals=signals)
    stopped = train(load_config(None, WITH_TERM), out)
    assert not PLAN, "the term did not run"
    assert (stopped["stopped_after"], stopped.get("abandoned")) == (saved, abandoned)
    assert saved_iteration(out) == saved

    resumed = train(load_config(None, WITH_TERM), out, resume=True)
    assert without_perf(resumed["history"]) == without_perf(uninterrupted["history"])
    assert resumed["eval"]["after"] == uninterrupted["eval"]["after"]


@pytest.mark.timeout(900)
def test_a_stop_after_the_update_skips_the_evaluation_and_saves_the_iteration(tmp_path: Path) -> None:
    out = tmp_path / "run"
    PLAN.update(iteration=1, step="end", signals=[signal.SIGINT, signal.SIGINT])
    stopped = train(load_config(None, [*WITH_TERM, "eval.every=1"]), out)
    assert not PLAN, "the term did not run"
    assert stopped["stopped_after"] == 1 and stopped["signal"] == "SIGINT"
    assert saved_iteration(out) == 1
    [metrics] = stopped["history"]
    assert metrics["iteration"] == 1 and "eval/success_rate" not in metrics  # the evaluation was not played


def test_a_stop_during_the_evaluation_before_rl_keeps_the_warm_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint 0 is written when SFT ends; a stop in the evaluation after it loses neither, and the resumed
    run evaluates then and goes on as the uninterrupted run does."""
    cfg = load_config(None, small("iterations=2", "model.device=cpu"))
    evaluate = Trainer.evaluate

    def stopping_evaluate(self: Trainer, tag: str) -> dict:
        if tag == "before-rl":
            monkeypatch.setattr(Trainer, "evaluate", evaluate)  # once
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(self, tag)

    monkeypatch.setattr(Trainer, "evaluate", stopping_evaluate)
    stopped = train(cfg, tmp_path / "split")
    assert stopped["stopped_after"] == 0 and stopped["checkpoint"], stopped
    saved = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=False)
    assert saved["iteration"] == 0 and "sft" in saved["extra"] and "eval_before" not in saved["extra"]

    resumed = train(cfg, tmp_path / "split", resume=True)
    full = train(cfg, tmp_path / "full")
    assert resumed["eval"]["before"] == full["eval"]["before"]
    assert without_perf(resumed["history"]) == without_perf(full["history"])
