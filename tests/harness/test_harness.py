"""The harness: a user's own agent, its model calls served through the rollout proxy by the policy, played by
the collector like any env. Real proxy on 127.0.0.1, the real ``openai`` client, a tiny real model."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import agentgym
from agentgym.backends.tiny import build_tiny_model
from agentgym.backends.transformers_backend import TransformersPolicy
from agentgym.errors import ConfigError
from agentgym.harness import HarnessEnv, HarnessError, RolloutProxy
from agentgym.rollout.chat_messages import hermes_messages, render_messages, reply_message
from agentgym.rollout.collector import Collector
from agentgym.rollout.policy import SamplingParams
from agentgym.rollout.prompt import PromptSettings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    }
]


class RecordingPolicy:
    """The real policy, with every generation it made kept (what the model sampled, to compare with the
    records)."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.generated: list[tuple[list[int], list[int], list[float]]] = []

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        out = self.policy.generate(prompts, params)
        self.generated += [
            (list(p), list(g.token_ids), list(g.logprobs)) for p, g in zip(prompts, out, strict=True)
        ]
        return out



def _collector(
    tiny: Any, harness: Any, tasks: Any, proxy: RolloutProxy, **env_kwargs: Any
) -> tuple[Collector, Any]:
    model, tokenizer = tiny
    policy = RecordingPolicy(TransformersPolicy(model, tokenizer))
    renderer = PromptSettings(max_new_tokens=12).renderer(tokenizer, "raw")
    factory = lambda: agentgym.make("harness-v0", harness=harness, tasks=tasks, proxy=proxy, **env_kwargs)  # noqa: E731
    return Collector(factory, policy, renderer, action_format="raw"), policy


class ToolAgent:
    """A plain ``openai``-client function-calling loop: asks, runs the tools the model calls, asks again (at
    most three calls), and keeps everything it sent and got."""

    def __init__(self) -> None:
        self.sent: dict[str, list[list[dict[str, Any]]]] = {}
        self.got: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def __call__(self, task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": task["question"]},
        ]
        sent, got = [], []
        for _ in range(3):
            sent.append(json.loads(json.dumps(messages)))
            answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            message = answer.choices[0].message
            got.append(message.model_dump(exclude_none=True))
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "a fruit"})
        with self.lock:
            self.sent[base_url] = sent
            self.got[base_url] = got
        return 1.0 if "a" in (message.content or "") else 0.0


def test_recorded_turns_are_what_the_agent_sent_and_what_the_policy_sampled(
    tiny: Any, proxy: RolloutProxy
) -> None:
    agent = ToolAgent()
    collector, policy = _collector(
        tiny, agent, [{"question": "What is an apple?"}, {"question": "Define pear."}], proxy
    )
    groups = collector.collect([0, 1], 3, SamplingParams(max_new_tokens=12, seed=7))
    collector.close()
    tokenizer = tiny[1]
    turns = [turn for group in groups for trajectory in group.trajectories for turn in trajectory.turns]
    assert len(groups) == 2 and all(len(g.trajectories) == 3 for g in groups)
    assert len(turns) == len(policy.generated) == sum(len(v) for v in agent.sent.values())
    # every turn is exactly one generation: its prompt and the sampled ids and log-probs, never re-tokenized
    sampled = {tuple(prompt) + (-1,) + tuple(ids): logprobs for prompt, ids, logprobs in policy.generated}
    for turn in turns:
        key = tuple(turn.prompt_ids) + (-1,) + tuple(turn.response_ids)
        assert key in sampled
        assert turn.response_logprobs == sampled[key]
        assert turn.extras["finish_reason"] in ("stop", "length")
    # each turn's prompt is the chat that call sent, rendered with the template (tools in the Hermes form)
    sent_prompts = sorted(
        tuple(render_messages(tokenizer, chat, TOOLS)) for chats in agent.sent.values() for chat in chats
    )
    assert sorted(tuple(t.prompt_ids) for t in turns) == sent_prompts
    # and what the agent got back is the decoded reply, tool calls parsed out of it
    replies = sorted(
        json.dumps(
            {
                k: v
                for k, v in reply_message(tokenizer.decode(t.response_ids, skip_special_tokens=True).strip())[
                    0
                ].items()
                if k != "tool_calls"
            },
            sort_keys=True,
        )
        for t in turns
    )
    got = sorted(
        json.dumps(
            {
                k: v
                for k, v in m.items()
                if k not in ("tool_calls", "refusal", "annotations", "audio", "function_call")
            },
            sort_keys=True,
        )
        for ms in agent.got.values()
        for m in ms
    )
    assert replies == got
    # the last turn carries the reward the agent returned; group members with the same chat share a state
    for group in groups:
        for trajectory in group.trajectories:
            assert all(t.reward == 0.0 for t in trajectory.turns[:-1])
            assert trajectory.turns[-1].reward in (0.0, 1.0)
        first_states = {t.turns[0].state_key for t in group.trajectories}
        assert len(first_states) == 1 and next(iter(first_states)).startswith("chat:")


def _scripted(replies: list[str]) -> Any:
    """A policy stand-in that answers the given texts in order (for the proxy's parsing and errors; the token
    path is covered above with the real model)."""

    class Scripted:
        def __init__(self, tokenizer: Any) -> None:
            self.tokenizer = tokenizer
            self.left = list(replies)

        def generate(self, prompts: Any, params: SamplingParams) -> Any:
            from agentgym.rollout.policy import Generation

            out = []
            for _ in prompts:
                ids = list(self.tokenizer.encode(self.left.pop(0), add_special_tokens=False))
                out.append(Generation(ids, [0.0] * len(ids), "stop"))
            return out

    return Scripted


def test_parallel_tool_calls_come_back_as_tool_calls_and_streaming_matches(
    tiny: Any, proxy: RolloutProxy
) -> None:
    seen: dict[str, Any] = {}

    def agent(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up two words."}]
        first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0]
        seen["finish"], seen["calls"] = first.finish_reason, first.message.tool_calls
        messages.append(first.message.model_dump(exclude_none=True))
        for call in first.message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"meaning of {call.id}"})
        stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True)
        seen["streamed"] = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        seen["messages"] = messages
        return 1.0

    tokenizer = tiny[1]
    two_calls = (
        'Sure.<tool_call>{"name": "lookup", "arguments": {"word": "apple"}}</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": {"word": "pear"}}</tool_call>'
    )
    policy = _scripted([two_calls, "Both are fruit."])(tokenizer)
    renderer = PromptSettings(max_new_tokens=12).renderer(tokenizer, "raw")
    collector = Collector(
        lambda: HarnessEnv(agent, [{"id": "t"}], proxy=proxy), policy, renderer, action_format="raw"
    )
    [group] = collector.collect([0], 1, SamplingParams(max_new_tokens=12))
    collector.close()
    assert seen["finish"] == "tool_calls"
    assert [json.loads(c.function.arguments)["word"] for c in seen["calls"]] == ["apple", "pear"]
    assert seen["streamed"] == "Both are fruit."
    [trajectory] = group.trajectories
    assert len(trajectory.turns) == 2 and trajectory.turns[-1].reward == 1.0
    # the two tool results are one user turn of the second prompt (the template knows no tools)
    chat = hermes_messages(seen["messages"], TOOLS)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[-1]["content"].count("<tool_response>") == 2
    assert trajectory.turns[1].prompt_ids == render_messages(tokenizer, seen["messages"], TOOLS)
    assert trajectory.turns[0].tool_calls == 2


def test_a_crashing_or_slow_agent_is_a_failed_rollout_and_the_collection_goes_on(
    tiny: Any, proxy: RolloutProxy
) -> None:
    def agent(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": task["kind"]}])
        if task["kind"] == "crash":
            raise RuntimeError("the tool server is down")
        if task["kind"] == "slow":
            threading.Event().wait(5)
        return 1.0

    tasks = [{"kind": "ok"}, {"kind": "crash"}, {"kind": "slow"}]
    tokenizer = tiny[1]
    for on_failure in ("zero", "exclude"):
        policy = _scripted(["fine"] * 3)(tokenizer)
        renderer = PromptSettings().renderer(tokenizer, "raw")
        collector = Collector(
            lambda on_failure=on_failure: HarnessEnv(
                agent, tasks, proxy=proxy, timeout_s=1.5, on_failure=on_failure
            ),
            policy,
            renderer,
            action_format="raw",
        )
        groups = collector.collect([0, 1, 2], 1, SamplingParams())
        collector.close()
        if on_failure == "zero":
            ok, crash, slow = (g.trajectories[0] for g in groups)
            assert ok.turns[-1].reward == 1.0 and ok.success
            assert crash.turns[-1].reward == 0.0 and not crash.truncated
            assert "RuntimeError: the tool server is down" in crash.turns[-1].info["harness_error"]
            assert slow.truncated and "timeout_s=1.5" in slow.turns[-1].info["harness_error"]
        else:
            assert [g.task_id for g in groups] == ["task-0"] and collector.last_stats.discarded == 2


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("'yes'", "returned a str ('yes'); return a number"),
        ("float('nan')", "returned a float (nan)"),
        ("{'score': 1}", "returned a dict without 'reward'"),
    ],
)
def test_a_harness_that_returns_a_non_number_stops_with_one_line(
    tiny: Any, proxy: RolloutProxy, returned: str, message: str
) -> None:
    def agent(task: dict[str, Any], base_url: str, api_key: str, model: str) -> Any:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        return eval(returned)

    collector = Collector(
        lambda: HarnessEnv(agent, [{"id": "t"}], proxy=proxy),
        _scripted(["x"])(tiny[1]),
        PromptSettings().renderer(tiny[1], "raw"),
        action_format="raw",
    )
    with pytest.raises(HarnessError, match=message.replace("(", r"\(").replace(")", r"\)")):
        collector.collect([0], 1, SamplingParams())
    collector.close()


def test_contract_faults_before_the_first_call_name_the_harness(proxy: RolloutProxy) -> None:
    with pytest.raises(HarnessError, match="module 'no_such_agent_module' cannot be imported"):
        HarnessEnv("no_such_agent_module:run", [{"id": "t"}], proxy=proxy)
    with pytest.raises(HarnessError, match="module 'json' has no attribute 'no_such_function'"):
        HarnessEnv("json:no_such_function", [{"id": "t"}], proxy=proxy)
    env = HarnessEnv(lambda task, base_url: 1.0, [{"id": "t"}], proxy=proxy)
    with pytest.raises(HarnessError, match="finished task 't' without calling its endpoint"):
        env.reset(seed=0)

    def broken(task: dict[str, Any]) -> float:
        raise KeyError("question")

    with pytest.raises(HarnessError, match="failed on task 't' before its first call: KeyError"):
        HarnessEnv(broken, [{"id": "t"}], proxy=proxy).reset(seed=0)
    with pytest.raises(HarnessError, match="made no call to its endpoint within timeout_s=0.3"):
        HarnessEnv(lambda task: threading.Event().wait(3), [{"id": "t"}], proxy=proxy, timeout_s=0.3).reset(
            seed=0
        )
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        HarnessEnv("json:dumps", _write(Path(proxy_tmp()), '{"q": 1}\n{oops\n'), proxy=proxy)


def proxy_tmp() -> str:
    import tempfile

    return tempfile.mkdtemp()


def _write(folder: Path, text: str) -> Path:
    path = folder / "tasks.jsonl"
    path.write_text(text)
    return path


def test_the_proxy_answers_bad_requests_in_openai_error_shape(proxy: RolloutProxy) -> None:
    rollout = proxy.open("t")
    headers = {"Authorization": f"Bearer {rollout.api_key}"}
    url = f"{rollout.base_url}/chat/completions"
    ok = {"model": proxy.model_name, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (
            httpx.post(f"{proxy.url}/rollouts/nope/v1/chat/completions", json=ok, headers=headers),
            404,
            "unknown rollout id 'nope'",
        ),
        (
            httpx.post(url, json=ok, headers={"Authorization": "Bearer wrong"}),
            401,
            "wrong or missing API key",
        ),
        (
            httpx.post(url, json={**ok, "model": "gpt-4o"}, headers=headers),
            404,
            "serves model 'agentgym-policy'",
        ),
        (httpx.post(url, json={**ok, "n": 2}, headers=headers), 400, "n must be 1"),
        (httpx.post(url, json={**ok, "logprobs": True}, headers=headers), 400, "logprobs are not returned"),
        (httpx.post(url, content=b"{not json", headers=headers), 400, "not JSON"),
        (httpx.post(url, json={"model": proxy.model_name}, headers=headers), 400, "messages"),
        (httpx.post(url, json={**ok, "tool_choice": "required"}, headers=headers), 400, "tool_choice"),
    ]
    for response, status, text in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert text in error["message"] and set(error) == {"message", "type", "param", "code"}
    rollout.close("finished")
    late = httpx.post(url, json=ok, headers=headers)
    assert late.status_code == 410 and "is over (finished)" in late.json()["error"]["message"]
    assert not rollout.events.qsize()  # nothing refused ever reached the env


def test_a_waiting_request_gets_410_when_its_rollout_ends(proxy: RolloutProxy) -> None:
    rollout = proxy.open("t")
    client = openai.OpenAI(base_url=rollout.base_url, api_key=rollout.api_key, max_retries=0)
    errors: list[Exception] = []

    def ask() -> None:
        try:
            client.chat.completions.create(
                model=proxy.model_name, messages=[{"role": "user", "content": "hi"}]
            )
        except openai.APIStatusError as exc:
            errors.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    call = rollout.events.get(timeout=10)
    assert call.messages == [{"role": "user", "content": "hi"}]
    rollout.close("timed out")
    thread.join(10)
    assert errors and errors[0].status_code == 410


def test_a_reset_naming_no_task_still_ends_the_run_in_progress(proxy: RolloutProxy) -> None:
    """An unknown task id raises, and the agent waiting on its call is answered 410 there and then, not left
    waiting until the next reset; the episode it was playing takes no more steps."""
    answers: list[int] = []
    refused = threading.Event()

    def agent(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": task["q"]}])
        except openai.APIStatusError as exc:
            answers.append(exc.status_code)
            refused.set()
        return 0.0

    env = HarnessEnv(agent, [{"id": "a", "q": "first?"}, {"id": "b", "q": "second?"}], proxy=proxy)
    assert env.reset(seed=1)[1]["task_id"] == "b"
    with pytest.raises(ConfigError, match="no task has id 'c'; ids look like 'a'"):
        env.reset(options={"task_id": "c"})
    with pytest.raises(ConfigError, match="episode that is over"):
        env.step("an answer")
    refused.wait(10)  # the agent's own thread records the answer its waiting call got
    assert answers == [410]
    obs, info = env.reset(options={"task_id": "a"})
    assert (obs, info["task_id"]) == ("first?", "a")
    env.close()


def test_a_command_line_harness_runs_in_a_subprocess(tiny: Any, proxy: RolloutProxy, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys
        import openai
        task = json.loads(sys.stdin.read())
        client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the env
        reply = client.completions.create(model=os.environ["AGENTGYM_MODEL"], prompt=task["prompt"])
        print("the agent's own log line")
        print(json.dumps({"reward": 1.0 if reply.choices[0].text == "42" else 0.0, "success": True}))
    """)
    )
    collector = Collector(
        lambda: HarnessEnv([sys.executable, str(script)], [{"prompt": "6*7="}], proxy=proxy),
        _scripted(["42"])(tiny[1]),
        PromptSettings().renderer(tiny[1], "raw"),
        action_format="raw",
    )
    [group] = collector.collect([0], 1, SamplingParams())
    collector.close()
    [trajectory] = group.trajectories
    assert trajectory.success and trajectory.turns[-1].reward == 1.0
    assert trajectory.turns[0].prompt_ids == list(tiny[1].encode("6*7="))


def test_algorithms_that_fork_are_refused_on_a_harness(tmp_path: Path) -> None:
    from agentgym.training import load_config
    from agentgym.training.run.loop import train

    tasks = _write(tmp_path, '{"question": "hi"}\n')
    cfg = load_config(
        None,
        [
            f"env.harness={__name__}:_echo_agent",
            f"env.tasks={tasks}",
            "algorithm.name=arpo",
            "iterations=1",
            "sft.enabled=false",
        ],
    )
    assert cfg.env.id == "harness-v0"
    with pytest.raises(
        ConfigError, match="'arpo' branches episodes, and 'harness-v0' episodes cannot be forked"
    ):
        train(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="env.harness and env.tasks go together"):
        load_config(None, ["env.harness=x:y"])


def _echo_agent(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": task["question"]}]
    )
    length = len(reply.choices[0].message.content or "")
    if length % 2:
        raise RuntimeError("the agent's tool failed")  # a failed rollout: the iteration goes on
    return float(length % 4 == 0)


def test_grpo_trains_a_harness_through_the_ordinary_loop(tmp_path: Path) -> None:
    from agentgym.run_folder import RunFolder
    from agentgym.training import load_config
    from agentgym.training.run.loop import train

    tasks = _write(
        tmp_path, "".join(json.dumps({"question": q}) + "\n" for q in ("hi", "hello", "hey", "yo"))
    )
    cfg = load_config(
        None,
        [
            f"env.harness={__name__}:_echo_agent",
            f"env.tasks={tasks}",
            "algorithm.name=grpo",
            "iterations=2",
            "sft.enabled=false",
            "rollout.num_tasks=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "eval.num_episodes=2",
        ],
    )
    train(cfg, tmp_path / "run")
    folder = RunFolder(tmp_path / "run")
    history = [json.loads(line) for line in folder.metrics.read_text().splitlines()]
    assert [row["iteration"] for row in history if "iteration" in row][-1] == 2
    assert sum(row.get("rollout/harness_failures", 0) for row in history) > 0
    # the run folder evaluates on its own harness and tasks
    from agentgym.cli.evaluation import env_entries
    from agentgym.eval.policies import parse_policy

    [entry] = env_entries(None, [], [], None, None, [parse_policy(str(tmp_path / "run"))])
    assert (entry.id, entry.kwargs["harness"], entry.kwargs["tasks"]) == (
        "harness-v0", f"{__name__}:_echo_agent", str(tasks))


def test_an_expert_gives_sft_demonstrations_through_the_same_engine(
    tiny: Any, proxy: RolloutProxy, tmp_path: Path
) -> None:
    from agentgym.harness.examples import arithmetic_tasks, calculator_expert, tool_agent
    from agentgym.rollout.actors import ExpertActor

    tokenizer = tiny[1]
    tasks = arithmetic_tasks(3, seed=5, words=True)
    collector = Collector(
        lambda: HarnessEnv(tool_agent, tasks, proxy=proxy, expert=calculator_expert),
        ExpertActor(tokenizer, "raw"),
        PromptSettings().renderer(tokenizer, "raw"),
    )
    groups = collector.collect([0, 1, 2], 1, SamplingParams())
    collector.close()
    for group, task in zip(groups, tasks, strict=True):
        [demo] = group.trajectories
        assert demo.success and [t.reward for t in demo.turns] == [0.0, 1.0]
        # the calculator really ran on the expert's call: its result is in the second prompt
        assert f"<tool_response>\n{task['answer']}\n</tool_response>" in tokenizer.decode(
            demo.turns[1].prompt_ids
        )
        assert (
            tokenizer.decode(demo.turns[1].response_ids, skip_special_tokens=True)
            == f"The answer is {task['answer']}."
        )

    from agentgym.training import load_config
    from agentgym.training.run.loop import train

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in tasks))
    cfg = load_config(
        None,
        [
            "env.harness=agentgym.harness.examples:tool_agent",
            f"env.tasks={path}",
            "env.kwargs.expert=agentgym.harness.examples:calculator_expert",
            "algorithm.name=grpo",
            "iterations=1",
            "rollout.num_tasks=1",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "eval.num_episodes=2",
            "sft.num_episodes=4",
            "sft.num_epochs=1",
            "rollout.require_tool_calls=false",
        ],
    )
    assert cfg.sft.enabled
    train(cfg, tmp_path / "run")
    [sft] = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "sft/demo_success" in line
    ] or [None]
    assert sft is None or sft["sft/demo_success"] == 1.0


def test_a_served_model_plays_the_harness_as_the_local_model_does(tmp_path: Path) -> None:
    from conftest import LiveServer

    from agentgym.backends.openai_server import create_policy_app
    from agentgym.backends.tiny import TinyModelConfig, save_tiny
    from agentgym.eval.harness import Evaluation
    from agentgym.eval.plan import EnvEntry, EvalPlan
    from agentgym.eval.policies import parse_policy
    from agentgym.eval.store import EvalStore
    from agentgym.harness.examples import arithmetic_tasks

    model, tokenizer = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, intermediate_size=128))
    model_dir = save_tiny(model, tokenizer, tmp_path / "tiny")
    live = LiveServer(
        create_policy_app(TransformersPolicy.from_pretrained(model_dir), "tiny", max_new_tokens=8)
    )
    try:
        env = EnvEntry(
            "harness-v0",
            {
                "harness": "agentgym.harness.examples:tool_agent",
                "tasks": arithmetic_tasks(3, seed=1, words=True),
            },
        )
        policies = (
            parse_policy(f"{model_dir},name=local,max_new_tokens=8"),
            parse_policy(f"{live.url}/v1,name=chat,max_new_tokens=8"),
        )
        Evaluation(EvalPlan(policies, (env,), (0, 1, 2), concurrency=3), tmp_path / "eval").run()
    finally:
        live.stop()
    store = EvalStore(tmp_path / "eval")
    local, chat = (store.records("harness-v0", name) for name in ("local", "chat"))
    # the endpoint rendered the agent's chat (tools in the Hermes form) as the local model did: same replies
    assert [[t["response"] for t in r["turns"]] for r in chat] == [
        [t["response"] for t in r["turns"]] for r in local
    ]
    assert "<tools>" in local[0]["turns"][0]["prompt"] and "calculator" in chat[0]["turns"][0]["prompt"]


def test_the_message_codec_carries_tool_calls_and_tools_to_a_chat_endpoint() -> None:
    from agentgym.eval.messages import MessageCodec

    chat = [
        {"role": "user", "content": "17*23?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "391"},
    ]
    codec = MessageCodec()
    renderer = PromptSettings().renderer(codec, "raw")
    conv = renderer.start("391", {"messages": chat, "tools": TOOLS})
    assert codec.messages(renderer.prompt_ids(conv)) == (chat, TOOLS)
