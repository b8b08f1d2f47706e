"""Judged rewards: the judge client against real HTTP servers on 127.0.0.1 (the policy server of
`agentgym serve-policy` with a tiny model, and a small scripted chat server that counts requests), answer
parsing, the cache, retries, timeouts, batched judging, and the ``JudgedReward`` wrapper on real envs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import LiveServer
from scripted_judge import ScriptedJudgeServer

import agentgym
from agentgym.errors import ConfigError
from agentgym.judge import Judge, JudgedReward, JudgeError, Verdict, parse_score, render_transcript


@pytest.fixture
def scripted() -> Iterator[ScriptedJudgeServer]:
    server = ScriptedJudgeServer()
    yield server
    server.live.stop()


# --- answer parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize("answer, score", [
    ("SCORE: 0.7", 0.7),
    ("Good work overall.\nSCORE: 1", 1.0),
    ("score: 0", 0.0),
    ("**Score:** 7/10", 0.7),
    ("SCORE = 3 / 4.", 0.75),
    ("SCORE: 40%", 0.4),
    ("SCORE: .5", 0.5),
    ("first draft SCORE: 0.1 is not a line of its own\n  SCORE: 0.2  \nSCORE: 0.9\n", 0.9),
    ("SCORE: 0.3\nOn reflection, lower.\nSCORE: 0.25", 0.25),
])
def test_valid_answers_give_their_score(answer: str, score: float) -> None:
    assert parse_score(answer) == pytest.approx(score)


@pytest.mark.parametrize("answer, message", [
    ("The agent did well.", "no line 'SCORE: <s>'"),
    ("SCORE: high", "no line 'SCORE: <s>'"),
    ("My score would be 0.8 I think", "no line 'SCORE: <s>'"),
    ("SCORE: 7", "score 7 is outside [0, 1]"),
    ("SCORE: 1.5", "score 1.5 is outside [0, 1]"),
    ("SCORE: -0.2", "score -0.2 is outside [0, 1]"),
    ("SCORE: 11/10", "score 11/10 is outside [0, 1]"),
    ("SCORE: 120%", "score 120% is outside [0, 1]"),
    ("SCORE: 3/0", "scale that is not positive"),
])
def test_invalid_answers_say_what_was_wrong(answer: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_score(answer)


# --- the judge against the scripted server -------------------------------------------------------


def test_a_judged_transcript_keeps_the_raw_answer_and_the_request_follows_the_template(
        scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "Be brief.", api_key="k-1", max_tokens=64,
               extra_body={"seed": 3}) as judge:
        verdict = judge.score("[agent]\nwant=0.25")
    assert verdict == Verdict(0.25, "The agent did what was asked.\nSCORE: 0.25", "grader")
    [body] = scripted.bodies
    assert body["model"] == "grader" and body["max_tokens"] == 64 and body["seed"] == 3
    assert body["temperature"] == 0.0
    assert body["messages"][0]["role"] == "system" and "SCORE: <s>" in body["messages"][0]["content"]
    assert body["messages"][1] == {"role": "user", "content": "Rubric:\nBe brief.\n\nTranscript:\n[agent]\n"
                                   "want=0.25\n\nGrade the transcript against the rubric."}


def test_the_same_transcript_is_judged_once_in_memory_and_across_judges_through_the_file(
        scripted: ScriptedJudgeServer, tmp_path: Path) -> None:
    cache = tmp_path / "verdicts.jsonl"
    with Judge(scripted.url, "grader", "rubric A", cache_file=cache) as judge:
        first = judge.score("want=0.6")
        again = judge.score("want=0.6")
        other_transcript = judge.score("want=0.1")
    assert (first.score, first.cached, again.score, again.cached) == (0.6, False, 0.6, True)
    assert other_transcript.score == 0.1 and len(scripted.bodies) == 2 and judge.requests_sent == 2
    assert len(cache.read_text().splitlines()) == 2
    with Judge(scripted.url, "grader", "rubric A", cache_file=cache) as reopened:
        assert reopened.score("want=0.6") == Verdict(0.6, first.raw, "grader", cached=True)
        assert reopened.requests_sent == 0
    with Judge(scripted.url, "grader", "rubric B", cache_file=cache) as new_rubric:
        new_rubric.score("want=0.6")  # another rubric is another question: asked again
    with Judge(scripted.url, "other-model", "rubric A", cache_file=cache) as new_model:
        new_model.score("want=0.6")
    assert len(scripted.bodies) == 4


def test_500_and_429_are_retried_until_an_answer_comes(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(500, "overloaded", 0.0, {}), (429, "slow down", 0.0, {"Retry-After": "0"}),
                       (503, "warming up", 0.0, {})]
    with Judge(scripted.url, "grader", "r", retries=3, backoff_s=0.01) as judge:
        assert judge.score("want=0.9").score == 0.9
    assert len(scripted.bodies) == 4


def test_retries_run_out_with_a_one_line_error_naming_the_last_failure(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(500, "overloaded\nreally", 0.0, {})] * 3
    with Judge(scripted.url, "grader", "r", retries=2, backoff_s=0.01) as judge:
        with pytest.raises(JudgeError) as caught:
            judge.score("want=0.9")
    message = str(caught.value)
    assert "\n" not in message and "after 3 attempts" in message and "HTTP 500: overloaded really" in message
    assert len(scripted.bodies) == 3


def test_a_client_error_is_not_retried(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(404, "model 'grader' does not exist", 0.0, {})]
    with Judge(scripted.url, "grader", "r", retries=3, backoff_s=0.01) as judge:
        with pytest.raises(JudgeError, match=r"refused the request \(HTTP 404\): .*does not exist"):
            judge.score("x")
    assert len(scripted.bodies) == 1


def test_an_unparseable_answer_is_asked_again_with_a_reminder(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(200, "It was fine.", 0.0, {})]
    with Judge(scripted.url, "grader", "r", retries=1, backoff_s=0) as judge:
        assert judge.score("want=0.4").score == 0.4
    retry = scripted.bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[2]["content"] == "It was fine." and "SCORE: <s>" in retry[3]["content"]


def test_answers_that_never_parse_fail_with_the_last_answer(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(200, "Nice.", 0.0, {}), (200, "SCORE: 9", 0.0, {})]
    with Judge(scripted.url, "grader", "r", retries=1, backoff_s=0) as judge:
        with pytest.raises(JudgeError) as caught:
            judge.score("x")
    assert caught.value.raw == "SCORE: 9" and "score 9 is outside [0, 1]" in str(caught.value)


def test_a_slow_judge_times_out_with_a_one_line_error(scripted: ScriptedJudgeServer) -> None:
    scripted.script = [(200, "SCORE: 1", 1.0, {})] * 2
    with Judge(scripted.url, "grader", "r", timeout_s=0.2, retries=1, backoff_s=0) as judge:
        with pytest.raises(JudgeError) as caught:
            judge.score("x")
    message = str(caught.value)
    assert "\n" not in message and "after 2 attempts" in message and "within timeout_s=0.2 s" in message
    assert len(scripted.bodies) == 2


def test_a_judge_nobody_listens_to_fails_after_its_retries() -> None:
    with Judge("http://127.0.0.1:9/v1", "grader", "r", retries=1, backoff_s=0, timeout_s=2) as judge:
        with pytest.raises(JudgeError, match="ConnectError .* is the server running"):
            judge.score("x")
        assert judge.requests_sent == 2


def test_score_many_overlaps_requests_up_to_max_concurrency_and_judges_duplicates_once(
        scripted: ScriptedJudgeServer) -> None:
    scripted.hold_until_in_flight = 3  # the first requests wait until three are held at once
    transcripts = [f"want=0.{i}" for i in range(7)] + ["want=0.3"]
    scripted.script = [(200, "SCORE: 0.5", 0.05, {})] * 7
    with Judge(scripted.url, "grader", "r", max_concurrency=3) as judge:
        verdicts = judge.score_many(transcripts)
    assert scripted.max_in_flight == 3  # three overlapped, never a fourth
    assert len(scripted.bodies) == 7 and all(isinstance(v, Verdict) for v in verdicts)
    assert [v.score for v in verdicts if isinstance(v, Verdict)] == [0.5] * 8


def test_score_many_reports_failures_in_place(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "r", retries=0, max_concurrency=1) as judge:
        scripted.script = [(200, "SCORE: 0.2", 0.0, {}), (200, "no score", 0.0, {})]
        first, second = judge.score_many(["a", "b"])
    assert isinstance(first, Verdict) and first.score == 0.2
    assert isinstance(second, JudgeError) and second.raw == "no score"


@pytest.mark.parametrize("kwargs, message", [
    ({"base_url": "localhost:8000"}, "base_url must be an http"),
    ({"rubric": " "}, "rubric must be a non-empty string"),
    ({"template": "no placeholders"}, "placeholders {rubric} and {transcript}"),
    ({"template": "{rubric} {transcript} {other}"}, "stray brace or placeholder"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"retries": -1}, "retries must be an integer >= 0"),
    ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1"),
])
def test_bad_judge_arguments_name_the_argument(kwargs: dict[str, Any], message: str) -> None:
    args = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r", **kwargs}
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        Judge(**args)


def test_the_reward_function_judges_its_keyword_arguments(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "The answer is right.") as judge:
        reward = judge.reward_function()
        score = reward(task={"id": "t1", "prompt": "6*7?"}, answer="want=0.9",
                       transcript=[{"name": "calc", "arguments": {"x": "6*7"}, "result": "42"}])
    assert score == 0.9
    assert scripted.bodies[0]["messages"][1]["content"] == (
        'Rubric:\nThe answer is right.\n\nTranscript:\n[task]\n{"id": "t1", "prompt": "6*7?"}\n\n'
        '[answer]\nwant=0.9\n\n[transcript]\n[{"name": "calc", "arguments": {"x": "6*7"}, "result": "42"}]'
        "\n\nGrade the transcript against the rubric.")


# --- JudgedReward on real envs -----------------------------------------------------------------


def _play_expert(env: JudgedReward, seed: int) -> list[tuple[str, float, bool, bool, dict[str, Any]]]:
    env.reset(seed=seed)
    steps = []
    while not steps or not (steps[-1][2] or steps[-1][3]):
        steps.append(env.step(env.expert_action() or "up"))
    return steps


def test_judged_episode_replaces_the_reward_and_records_the_transcript(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "Reach the goal. want=0.8") as judge:
        env = JudgedReward(agentgym.make("maze-v0", size=2), judge, success_threshold=0.9)
        first_obs, first_info = env.reset(seed=1)
        steps = [env.step(env.expert_action()) for _ in range(4)]
        plain = agentgym.make("maze-v0", size=2)
        plain.reset(seed=1)
        plain_rewards = [plain.step(plain.expert_action())[1] for _ in range(4)]
    assert steps[-1][2] and [s[1] for s in steps] == [0.0, 0.0, 0.0, 0.8]
    info = steps[-1][4]
    assert info["judge"] == {"score": 0.8, "raw": "The agent did what was asked.\nSCORE: 0.8",
                             "model": "grader", "cached": False,
                             "env_return": pytest.approx(sum(plain_rewards))}
    assert info["success"] is False  # 0.8 is below the threshold 0.9, whatever the env said
    json.dumps(info)
    sent = scripted.bodies[0]["messages"][1]["content"]
    assert sent.startswith("Rubric:\nReach the goal. want=0.8\n\nTranscript:\n[instructions]\n"
                           f"{first_info['instructions']}\n\n[environment]\n{first_obs}\n\n[agent]\n")
    assert env.transcript in sent and env.transcript.count("[agent]") == 4


def test_add_mode_adds_the_score_to_the_env_reward(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "want=0.5") as judge:
        judged = _play_expert(JudgedReward(agentgym.make("maze-v0", size=2), judge, mode="add"), seed=1)
    plain = agentgym.make("maze-v0", size=2)
    plain.reset(seed=1)
    plain_rewards = [plain.step(plain.expert_action())[1] for _ in range(len(judged))]
    assert [s[1] for s in judged[:-1]] == plain_rewards[:-1]
    assert judged[-1][1] == pytest.approx(plain_rewards[-1] + 0.5)


def test_truncated_episodes_are_judged_too(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "want=0.1") as judge:
        env = JudgedReward(agentgym.make("maze-v0", size=2, max_turns=2), judge)
        env.reset(seed=1)
        first = env.step("jump")
        _, reward, terminated, truncated, info = env.step("jump")
    assert first[1] == 0.0 and "judge" not in first[4]
    assert (reward, terminated, truncated, info["judge"]["score"]) == (0.1, False, True, 0.1)


def test_judge_failures_raise_or_count_as_zero_with_the_error_in_info(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "r", retries=0) as judge:
        scripted.script = [(200, "no verdict", 0.0, {})]
        with pytest.raises(JudgeError, match="no valid score"):
            _play_expert(JudgedReward(agentgym.make("maze-v0", size=2), judge), seed=1)
        scripted.script = [(200, "still no verdict", 0.0, {})]
        steps = _play_expert(JudgedReward(agentgym.make("maze-v0", size=2), judge, on_error="zero",
                                          success_threshold=0.5), seed=2)
    info = steps[-1][4]
    assert steps[-1][1] == 0.0 and info["success"] is False
    assert info["judge"]["score"] is None and info["judge"]["raw"] == "still no verdict"
    assert "no valid score" in info["judge"]["error"] and "\n" not in info["judge"]["error"]
    json.dumps(info)


def test_a_fork_carries_the_transcript_and_goes_on_alone(scripted: ScriptedJudgeServer) -> None:
    with Judge(scripted.url, "grader", "want=0.3") as judge:
        env = JudgedReward(agentgym.make("maze-v0", size=2), judge)
        env.reset(seed=1)
        env.step(env.expert_action())
        child = env.fork()
        assert child.transcript == env.transcript
        child.step("jump")
        assert child.transcript != env.transcript and child.transcript.startswith(env.transcript)


def test_training_wraps_in_process_envs_when_env_judge_is_set(scripted: ScriptedJudgeServer) -> None:
    from agentgym.judge import JudgeSettings
    from agentgym.training.config.coercion import build
    from agentgym.training.config.schema import EnvConfig, TrainConfig
    from agentgym.training.run.setup import env_factory

    env_cfg = build(EnvConfig, {"id": "maze-v0", "kwargs": {"size": 2},
                                "judge": {"base_url": scripted.url, "model": "grader", "rubric": "want=0.7",
                                          "success_threshold": 0.5}}, "env")
    assert isinstance(env_cfg.judge, JudgeSettings)
    make_env = env_factory(TrainConfig(env=env_cfg))
    first, second = make_env(), make_env()
    assert isinstance(first, JudgedReward) and first.judge is second.judge  # one judge, one cache
    steps = _play_expert(first, seed=1)
    assert steps[-1][1] == 0.7 and steps[-1][4]["success"] is True
    assert _play_expert(second, seed=1)[-1][4]["judge"]["cached"] is True and len(scripted.bodies) == 1
    first.judge.close()


@pytest.mark.parametrize("judge, extra, message", [
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r", "timeout_s": -1}, {},
     "env.judge.timeout_s must be a positive number"),
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r", "success_threshold": 2}, {},
     r"env.judge.success_threshold must be in \[0, 1\]"),
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r", "mode": "mul"}, {},
     "env.judge.mode must be one of 'replace', 'add'"),
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m"}, {}, "rubric"),
    ({"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "r"}, {"url": "http://127.0.0.1:9"},
     "env.judge wraps envs made in the trainer's process"),
])
def test_bad_judge_configs_name_the_field(judge: dict[str, Any], extra: dict[str, Any], message: str) -> None:
    from agentgym.training.config.coercion import build
    from agentgym.training.config.schema import EnvConfig

    with pytest.raises(ConfigError, match=message):
        build(EnvConfig, {"judge": judge, **extra}, "env")


# --- the policy server of `agentgym serve-policy` as the judge -----------------------------------


@pytest.fixture(scope="module")
def policy_server() -> Iterator[LiveServer]:
    """`agentgym serve-policy`'s app over a tiny model whose weights spell one answer: attention and MLP
    outputs are zero, so each next token depends on the current one only, and the embedding / output
    rows chain ``\\n`` → ``SCORE: 0.8`` → end of turn (the chat template's generation prompt ends in
    ``\\n``)."""
    import torch

    from agentgym.backends.config import TinyModelConfig
    from agentgym.backends.openai_server import create_policy_app
    from agentgym.backends.transformers_backend import TransformersPolicy

    shape = TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128, tie_word_embeddings=False)
    policy = TransformersPolicy.from_pretrained(shape, seed=0)
    model = policy.model
    chain = [ord(c) for c in "\nSCORE: 0.8"] + [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "embed_tokens.weight", "lm_head.weight")):
                weight.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        for i, (token, following) in enumerate(zip(chain, chain[1:], strict=False)):
            embed[token, i] = 1.0
            head[following, i] = 10.0
    live = LiveServer(create_policy_app(policy, "tiny-judge", max_new_tokens=32))
    yield live
    live.stop()


def test_a_judged_episode_end_to_end_through_the_policy_server(policy_server: LiveServer) -> None:
    rubric = "The agent reaches the goal."
    with Judge(f"{policy_server.url}/v1", "tiny-judge", rubric, max_tokens=32) as judge:
        env = JudgedReward(agentgym.make("maze-v0", size=2), judge, success_threshold=0.75)
        steps = _play_expert(env, seed=3)
        direct = httpx.post(f"{policy_server.url}/v1/chat/completions", timeout=30, json={
            "model": "tiny-judge", "messages": judge.prompt(env.transcript), "max_tokens": 32,
            "temperature": 0})
    _, reward, terminated, _, info = steps[-1]
    assert terminated and reward == pytest.approx(0.8) and info["success"] is True
    assert info["judge"]["raw"] == "SCORE: 0.8" == direct.json()["choices"][0]["message"]["content"]
    assert render_transcript([("agent", "up")]) == "[agent]\nup"
