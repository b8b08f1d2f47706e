"""Defining ``expert_action`` declares an expert: ``check`` runs the expert gates on it, ``eval --policy
expert`` and SFT demos use it; an env without one has those gates reported as skipped, not passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from typer.testing import CliRunner

import agentgym
from agentgym.cli import app
from agentgym.core import Env
from agentgym.gates import GATES, grade_env

WORDS = ("apple", "pear", "plum")
EXPERT_GATES = ["gate_expert_reaches_max_reward", "gate_baseline_below_expert"]


class Pick(Env):
    """Say the seed's secret word (one of three, named in the intro only by its position in a shuffled
    list, so no policy but the expert knows it); one guess. Written as a user would: an expert_action
    and no ``has_expert`` line."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "reward_range": (0.0, 1.0)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.secret = WORDS[int(self.np_random.integers(len(WORDS)))]
        return "Say the secret word.", {"state_key": "start", "admissible_actions": list(WORDS)}

    def step(self, action: str):
        right = action.strip() == self.secret
        info = {"state_key": "end", "success": right, "invalid_action": action.strip() not in WORDS}
        return ("Right." if right else "Wrong."), float(right), True, False, info

    def expert_action(self) -> str | None:
        return self.secret


class NoExpertPick(Pick):
    """The same task, its expert explicitly switched off (as an env whose expert depends on its arguments)."""

    has_expert = False


class PickAgain(Pick):
    """A subclass that writes nothing about the expert inherits it."""


def test_defining_expert_action_declares_an_expert() -> None:
    assert Pick.has_expert and PickAgain.has_expert
    assert not Env.has_expert and not NoExpertPick.has_expert  # a has_expert in the class body wins
    agentgym.register("test/pick-v0", Pick, max_turns=1, override=True)
    with agentgym.make("test/pick-v0") as env:  # the guard (a wrapper) reports the env's expert
        assert env.has_expert
        env.reset(seed=0)
        assert env.step(env.expert_action())[4]["success"]


def test_an_env_with_only_expert_action_passes_the_expert_gates() -> None:
    grade = grade_env(Pick, num_episodes=4)
    verdicts = {result.gate: (result.passed, result.skipped) for result in grade.results}
    assert all(verdicts[gate] == (True, False) for gate in EXPERT_GATES), verdicts
    assert grade.passed and grade.mean_returns["expert"] == 1.0


def test_eval_policy_expert_and_sft_demos_use_an_expert_declared_by_its_method(tmp_path: Path) -> None:
    agentgym.register("test/pick-v0", Pick, max_turns=1, override=True)
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "--policy", "expert", "--envs", "test/pick-v0",
                                      "--episodes", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(row["policy"], row["success_rate"]) for row in rows] == [("expert", 1.0)]

    from agentgym.backends.tiny import TinyModelConfig, build_tiny_model
    from agentgym.rollout.demos import collect_demos
    from agentgym.rollout.prompt import PromptRenderer

    _, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1))
    turns, stats = collect_demos(lambda: agentgym.make("test/pick-v0"), PromptRenderer(tokenizer), [0, 1, 2])
    assert stats["expert_success_rate"] == 1.0 and len(turns) == 3


def test_check_names_the_gates_it_skipped_and_counts_them_apart() -> None:
    grade = grade_env(NoExpertPick)
    assert [result.gate for result in grade.skipped] == [*EXPERT_GATES, "gate_answer_not_leaked"]
    assert sum(result.passed for result in grade.results) == len(GATES) - 3 and grade.passed

    agentgym.register("test/pick-noexpert-v0", NoExpertPick, max_turns=1, override=True)
    result = CliRunner().invoke(app, ["check", "test/pick-noexpert-v0"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert f"gates: {len(GATES) - 3} passed, 0 failed, 3 skipped (of {len(GATES)})" in result.output
    assert ("skipped gate_expert_reaches_max_reward, gate_baseline_below_expert: the env has no expert "
            "(define expert_action() to enable the expert gates)") in result.output
    assert "mean return over seeds 0..2: random" in result.output  # no expert among the policies
