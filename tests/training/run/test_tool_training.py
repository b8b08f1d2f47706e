"""Training on tool envs: a tiny model learns search-qa from a preset, whole tool calls reach the env under
``raw``, and a run whose policy never calls a tool stops with a ConfigError instead of training on nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import one_torch_thread
from typer.testing import CliRunner

import agentgym
from agentgym.backends.builder import make_policy
from agentgym.backends.config import ModelConfig, TinyModelConfig
from agentgym.cli import app
from agentgym.envs.registration import register_tool_envs
from agentgym.errors import ConfigError
from agentgym.rollout.actions import parse_action
from agentgym.rollout.collector import Collector
from agentgym.rollout.demos import collect_demos
from agentgym.rollout.episode_log import EpisodeLog
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptRenderer
from agentgym.training.config.loading import load_config
from agentgym.training.config.schema import SFTConfig
from agentgym.training.engine.update import sft_update
from agentgym.training.run.loop import train

ROOT = Path(__file__).resolve().parents[3]
PRESET = ROOT / "configs" / "search_qa_grpo_tiny.yaml"
CODE_MATH = ROOT / "configs" / "code_math_grpo_tiny.yaml"
#: A run small enough to reach the end of iteration 1 in seconds.
TINY_RUN = ["iterations=1", "rollout.num_tasks=2", "rollout.group_size=2", "eval.num_episodes=2"]


@pytest.fixture(autouse=True)
def registered() -> None:
    register_tool_envs()


# --- the preset learns -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_regression_pin_search_qa_preset_learns_to_use_the_search_tool_seed0(tmp_path: Path) -> None:
    """SFT leaves the tiny model clearly imperfect; GRPO then raises held-out success, searching every
    episode.

    One torch thread, as the preset's numbers were measured: RL's gain on this task differs by seed
    (31% -> 66%, 41% -> 42%, 42% -> 38% for seeds 0-2), so the run must be the one measured."""
    with one_torch_thread():
        report = train(load_config(PRESET), tmp_path)
    before_sft, before, after = (report["eval"][k] for k in ("before_sft", "before", "after"))
    assert before_sft["success_rate"] == 0.0  # nothing is known before the demonstrations
    assert 0.25 <= before["success_rate"] <= 0.65, f"post-SFT success {before['success_rate']:.0%}"
    gain = after["success_rate"] - before["success_rate"]
    assert gain >= 0.1, f"held-out success {before['success_rate']:.0%} -> {after['success_rate']:.0%}"
    # Every answer needs a retrieved document (the constraint copies it from the prompt), and it searched.
    assert after["tool_calls_per_episode"] >= 0.9 and before["tool_calls_per_episode"] >= 0.9
    assert all(m["rollout/tool_calls_per_episode"] > 0.5 for m in report["history"])


@pytest.mark.slow
def test_the_code_math_drill_preset_teaches_the_python_tool(tmp_path: Path) -> None:
    """code-math's arithmetic drill: SFT takes the tiny model from 0% to clearly above it, running the
    tool in every held-out episode (the value is nowhere in the question), and the RL update trains
    only on the tokens the constraint left a choice at: its loss counts exactly the sampled response
    tokens minus the forced ones the trajectories record."""
    with one_torch_thread():
        report = train(load_config(CODE_MATH, ["iterations=2"]), tmp_path)
    before_sft, before = report["eval"]["before_sft"], report["eval"]["before"]
    assert before_sft["success_rate"] == 0.0
    assert before["success_rate"] >= 0.25, f"post-SFT success {before['success_rate']:.0%}"
    assert before["tool_calls_per_episode"] >= 0.9
    for h in report["history"]:
        episodes = EpisodeLog(tmp_path / "trajectories" / f"iter_{h['iteration']:05d}.jsonl").read()
        turns = [turn for episode in episodes for turn in episode["turns"]]
        sampled = sum(len(turn["response_ids"]) for turn in turns)
        forced = sum(len(turn["extras"]["forced_positions"]) for turn in turns)
        assert 0 < forced < sampled and h["update/loss_tokens"] == sampled - forced


# --- a policy that never calls a tool fails loudly -----------------------------------------------


def test_a_policy_that_never_calls_a_tool_stops_the_run(tmp_path: Path) -> None:
    """Without the SFT warm start and the constraint, the tiny model writes no tag at all: iteration 1
    makes no tool call, and the run stops with a ConfigError that says what to check."""
    untrained = [*TINY_RUN, "sft.enabled=false", "rollout.constraint=null"]
    with pytest.raises(ConfigError, match="made no tool call") as caught:
        train(load_config(PRESET, untrained), tmp_path / "in-process")
    message = str(caught.value)
    assert "rollout.action_format" in message and "rollout.require_tool_calls=false" in message
    assert not (tmp_path / "in-process" / "report.json").exists()
    # The command line says the same and exits with status 2; so does a call that cannot fit.
    for i, overrides in enumerate((untrained, [*TINY_RUN, "sft.enabled=false", "rollout.max_new_tokens=8"])):
        args = [a for o in overrides for a in ("--set", o)]
        result = CliRunner().invoke(app, ["train", str(PRESET), "--out", str(tmp_path / f"cli{i}"), *args])
        assert result.exit_code == 2 and "made no tool call" in result.output, result.output
    # Opting out runs to the end and reports the zero.
    report = train(load_config(PRESET, [*untrained, "rollout.require_tool_calls=false"]),
                   tmp_path / "opt-out")
    assert report["history"][0]["rollout/tool_calls_per_episode"] == 0.0


# --- whole multi-line tool calls reach the env under raw -----------------------------------------


def test_a_multi_line_tool_call_reaches_the_env_whole_only_under_raw() -> None:
    env = agentgym.make("tools-v0")
    calls = [{"name": "lookup", "arguments": {"key": "accounts/ivan/balance"}},
             {"name": "lookup", "arguments": {"key": "accounts/mallory/balance"}}]
    reply = "I need both balances.\n" + "\n".join(
        f"<tool_call>\n{json.dumps(call, indent=2)}\n</tool_call>" for call in calls) + "<|im_end|>"
    raw, plain = parse_action(reply, "raw"), parse_action(reply, "plain")
    env.reset(options={"task_id": "tools/transfer/7"})
    obs, _, _, _, info = env.step(raw.action)
    assert raw.valid and not info["invalid_action"] and info["tool_calls"] == 2
    assert obs.count("<tool_response>") == 2 and "mallory" in obs
    env.reset(options={"task_id": "tools/transfer/7"})
    _, _, _, _, info = env.step(plain.action)  # only "I need both balances." gets there
    assert plain.action == "I need both balances." and info["invalid_action"] and info["tool_calls"] == 0


def test_a_fenced_code_block_from_a_real_policy_reaches_the_env_whole() -> None:
    """A tiny model taught the expert's ```python reply by SFT, run through the Collector: under ``raw``
    the env grades the whole block; under ``plain`` only the fence line arrives and nothing runs."""
    def make_env() -> agentgym.Env:
        return agentgym.make("code-tests-v0")

    seed = 11  # count_vowels: the shortest reference solutions are the quickest to teach
    policy = make_policy(ModelConfig(tiny=TinyModelConfig(hidden_size=64, intermediate_size=192,
                                                          max_position_embeddings=512)), seed=0)
    renderer = PromptRenderer(policy.tokenizer, mode="full", action_format="raw", include_instructions=False)
    demos, stats = collect_demos(make_env, renderer, [seed], action_format="raw")
    assert stats["expert_success_rate"] == 1.0 and len(demos) == 1 and demos[0].action.count("\n") >= 3
    torch.manual_seed(0)
    sft_update(policy.model, demos, SFTConfig(num_epochs=200, lr=1e-2, batch_size=1), max_length=1024,
               pad_token_id=policy.tokenizer.pad_token_id, grad_clip=1.0, seed=0)
    greedy = SamplingParams(max_new_tokens=160, temperature=0.0)
    results = {}
    for fmt in ("raw", "plain"):
        as_format = PromptRenderer(policy.tokenizer, mode="full", action_format=fmt,
                                   include_instructions=False)
        collector = Collector(make_env, policy, as_format, action_format=fmt)
        try:
            (group,) = collector.collect([seed], 1, greedy)
        finally:
            collector.close()
        results[fmt] = group.trajectories[0]
    first = results["raw"].turns[0]
    assert first.action == demos[0].action  # the model learnt the reply; all of it was sent
    assert results["raw"].success and first.tool_calls == 1 and not first.invalid
    assert results["plain"].turns[0].action == "```python"
    assert not results["plain"].success
    assert all(t.invalid and t.tool_calls == 0 for t in results["plain"].turns)
