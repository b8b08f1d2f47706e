"""``mcp-v0`` against a real fastmcp server (stdio subprocess and streamable HTTP), and ``serve-mcp``.

The server is ``tests/mcp_servers/facts_server.py`` (add, divide, capital, crash). Expected
observations and rewards are written out by hand from what its tools return.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVER_START_TIMEOUT_S, stop_process, wait_listening

import agentgym
import agentgym.envs  # noqa: F401  (registers the built-in envs)
from agentgym.errors import ConfigError, RemoteEnvError

SERVER = Path(__file__).resolve().parents[1] / "mcp_servers" / "facts_server.py"
#: The facts server's tools and mcp-v0's answer, in the order the env offers them.
FACTS_TOOLS = ["add", "divide", "capital", "sleep", "crash", "answer"]
ADD_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2.5, "b": 4}}</tool_call>'
TASKS = [
    {"id": "sum", "prompt": "What is 2.5 + 4?", "answer": 6.5,
     "expert_actions": [ADD_CALL, "<answer>6.5</answer>"]},
    {"id": "capital", "prompt": "What is the capital of Ostavia?", "answer": "Lumen",
     "expert_actions": ["<capital>Ostavia</capital>", "<answer>Lumen</answer>"]},
]
#: tools-v0's tools, in its order (the ``answer`` of mcp-v0 or of tools-v0 last).
TOOLS_V0 = ["calculate", "convert", "lookup", "update", "list_keys", "delete", "answer"]


def _response(name: str, key: str, text: str) -> str:
    return f'<tool_response>\n{{"name": "{name}", "{key}": "{text}"}}\n</tool_response>'


@pytest.fixture(scope="module")
def http_url(mcp_facts_url: str) -> str:
    """The facts server over streamable HTTP on 127.0.0.1 (conftest's ``mcp_facts_url``)."""
    return mcp_facts_url


def used_capital_tool(*, task: dict[str, Any], answer: str, transcript: list[dict[str, Any]]) -> float:
    """A checker (``module:function`` in the tests): half for the right answer, half for using ``capital``."""
    right = 0.5 if answer.strip().lower() == str(task["answer"]).lower() else 0.0
    asked = any(call["name"] == "capital" and "result" in call for call in transcript)
    return right + (0.5 if asked else 0.0)


# --- mcp-v0 ------------------------------------------------------------------------------------


def test_a_stdio_server_plays_an_episode_and_its_death_is_one_line_naming_it() -> None:
    env = agentgym.make("mcp-v0", tasks=TASKS, server_command=f"{sys.executable} {SERVER}")
    try:
        obs, info = env.reset(seed=0, options={"task_id": "sum"})
        assert obs == "What is 2.5 + 4?" and info["task_id"] == "sum" and info["answer"] == 6.5
        assert [tool["function"]["name"] for tool in info["tools"]] == FACTS_TOOLS
        assert info["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
        assert "- capital(country): The capital city of a country." in info["instructions"]
        assert "6.5" not in obs + info["instructions"]  # the privileged answer stays out of the prompt
        obs, reward, terminated, truncated, info = env.step(ADD_CALL)
        assert obs == _response("add", "result", "6.5")
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert (info["tool_calls"], info["invalid_action"]) == (1, False)
        obs, reward, terminated, truncated, info = env.step("<answer>6.50</answer>")
        assert (obs, reward, terminated, info["success"]) == ("Answer received.", 1.0, True, True)

        env.reset(seed=0, options={"task_id": "capital"})
        obs, reward, terminated, _, info = env.step("<capital>Brenmark</capital> <answer>Harrow</answer>")
        assert obs == _response("capital", "result", "Harrow") + "\nAnswer received."
        assert (reward, terminated, info["success"]) == (0.0, True, False)  # Harrow is Brenmark's capital

        env.reset(seed=0, options={"task_id": "capital"})
        with pytest.raises(RemoteEnvError) as raised:
            env.step('<tool_call>{"name": "crash", "arguments": {}}</tool_call>')
        message = str(raised.value)
        assert "\n" not in message and "facts_server.py" in message and "went away" in message
        with pytest.raises(RemoteEnvError, match="facts_server.py is not connected"):
            env.reset(seed=0)  # reset reconnects: a fresh server answers again
            env.unwrapped.connection.close()
            env.step(ADD_CALL)
    finally:
        env.close()
        env.close()


def test_tool_errors_are_observations_and_bad_calls_are_invalid(http_url: str) -> None:
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url)
    try:
        env.reset(seed=0, options={"task_id": "sum"})
        obs, reward, terminated, _, info = env.step(
            '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>'
            '<tool_call>{"name": "divide", "arguments": {"a": 9, "b": 4}}</tool_call>')
        assert obs == (_response("divide", "error", "cannot divide by zero") + "\n"
                       + _response("divide", "result", "2.25"))
        assert (reward, terminated, info["tool_errors"], info["tool_calls"], info["invalid_action"]) == (
            0.0, False, 1, 2, False)
        obs, _, _, _, info = env.step('<tool_call>{"name": "multiply", "arguments": {}}</tool_call>')
        assert info["invalid_action"] and obs.startswith("Invalid action: unknown tool 'multiply'; available "
                                                         "tools: add, divide, capital, sleep, crash, answer")
        obs, _, _, _, info = env.step('<tool_call>{"name": "add", "arguments": {"a": "2", "b": 4}}'
                                      '</tool_call>')
        assert info["invalid_action"] and "argument 'a' must be number, got string" in obs
        obs, _, terminated, _, info = env.step("<answer>6.5</answer>" + ADD_CALL)
        assert info["invalid_action"] and not terminated and "answer once, as the last call" in obs
    finally:
        env.close()


def test_a_call_past_its_deadline_is_an_error_observation(http_url: str) -> None:
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url, call_timeout_s=0.5)
    try:
        env.reset(seed=0, options={"task_id": "sum"})
        started = time.monotonic()
        sleep = '<tool_call>{"name": "sleep", "arguments": {"seconds": 3}}</tool_call>'
        obs, _, terminated, _, info = env.step(sleep)
        assert obs == _response("sleep", "error", "the tool did not answer within 0.5 s")
        assert (terminated, info["tool_errors"], info["invalid_action"]) == (False, 1, False)
        assert time.monotonic() - started < 2.5  # the env did not wait for the tool
        assert env.step(ADD_CALL)[0] == _response("add", "result", "6.5")  # the session still works
    finally:
        env.close()


def test_state_key_is_the_task_and_the_set_of_calls_and_results(http_url: str) -> None:
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url)
    try:
        keys = []
        capital = "<capital>Ostavia</capital>"
        for first, second in ((capital, ADD_CALL), (ADD_CALL, capital)):
            _, info = env.reset(seed=0, options={"task_id": "capital"})
            assert info["state_key"] == "capital|calls=none"
            env.step(first)
            keys.append(env.step(second)[4]["state_key"])
        assert keys[0] == keys[1] and keys[0].startswith("capital|calls=")  # orderings of the same work meet
        env.reset(seed=0, options={"task_id": "capital"})
        assert env.step("<capital>Quellon</capital>")[4]["state_key"] != keys[0]
    finally:
        env.close()


def test_a_checker_function_gives_the_reward(http_url: str) -> None:
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url, reward=f"{__name__}:used_capital_tool")
    try:
        env.reset(seed=0, options={"task_id": "capital"})
        assert env.step("<answer>Lumen</answer>")[1:4] == (0.5, True, False)
        env.reset(seed=0, options={"task_id": "capital"})
        env.step("<capital>ostavia</capital>")
        _, reward, _, _, info = env.step("<answer>lumen</answer>")
        assert (reward, info["success"]) == (1.0, True)
    finally:
        env.close()
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url, reward=lambda **_: math.nan)
    try:
        env.reset(seed=0, options={"task_id": "sum"})
        with pytest.raises(ConfigError, match="the reward function returned nan on task 'sum'"):
            env.step("<answer>1</answer>")
    finally:
        env.close()


def test_check_env_passes(http_url: str) -> None:
    agentgym.check_env(lambda: agentgym.make("mcp-v0", tasks=TASKS, server_url=http_url), num_episodes=2)


def test_tasks_come_from_a_jsonl_file(http_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(task) for task in TASKS) + "\n")
    env = agentgym.make("mcp-v0", tasks=str(path), server_url=http_url)
    try:
        assert {env.reset(seed=seed)[1]["task_id"] for seed in range(8)} == {"sum", "capital"}
    finally:
        env.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tasks": TASKS}, "give exactly one of server_command"),
    ({"tasks": TASKS, "server_command": "x", "server_url": "http://127.0.0.1:1/mcp"}, "give exactly one of"),
    ({"tasks": TASKS, "server_url": "127.0.0.1:8000"}, "server_url must be an http"),
    ({"server_command": "x"}, "mcp-v0 needs tasks="),
    ({"tasks": [{"prompt": "2+2?"}], "server_command": "x"}, "task 'task-0' has no \"answer\""),
    ({"tasks": [{"answer": 4}], "server_command": "x"}, "task 'task-0' has no \"prompt\""),
    ({"tasks": [{"id": "a", "prompt": "p", "answer": 1}] * 2, "server_command": "x"},
     "two tasks have the id 'a'"),
    ({"tasks": TASKS, "server_command": "x", "reward": "math.fsum"}, "'module:function'"),
    ({"tasks": TASKS, "server_command": "x", "reward": "math:no_such"},
     "module 'math' has no attribute 'no_such'"),
    ({"tasks": TASKS, "server_command": "x", "call_timeout_s": 0}, "call_timeout_s must be a number of"),
])
def test_bad_arguments_are_one_line_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        agentgym.make("mcp-v0", **kwargs)
    assert "\n" not in str(raised.value)


def test_an_unreachable_server_is_a_one_line_error_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}/mcp"
    env = agentgym.make("mcp-v0", tasks=TASKS, server_url=url, connect_timeout_s=10)
    with pytest.raises(RemoteEnvError, match=f"cannot connect to MCP server {url}: ") as raised:
        env.reset(seed=0)
    assert "\n" not in str(raised.value)
    env.close()


# --- serve-mcp ----------------------------------------------------------------------------------


async def _call_served_tools(read: Any, write: Any) -> list[tuple[str, bool]]:
    from mcp import ClientSession

    from agentgym.envs.mcp.connection import mcp_field

    async with ClientSession(read, write) as session:
        await session.initialize()
        names = [tool.name for tool in (await session.list_tools()).tools]
        assert names == ["new_task", *TOOLS_V0]
        results = []
        for name, arguments in (("calculate", {"expression": "2 ^ 10 - -1"}),
                                ("calculate", {"expression": "1 / 0"}),
                                ("new_task", {"task_id": "tools/transfer/7"}),
                                ("lookup", {"key": "accounts/ivan/balance"})):
            result = await session.call_tool(name, arguments)
            results.append((result.content[0].text, mcp_field(result, "is_error")))  # mcp 2.x or 1.x
        return results


#: What the four calls above answer (tools-v0's own doctest shows the task and ivan's balance).
SERVED = [('{"result": 1025}', False), ("division by zero", True),
          ("Transfer 598.59 from ivan's account to mallory's account. Then answer with ivan's new balance.",
           False),
          ('{"key": "accounts/ivan/balance", "value": 3647.6}', False)]


def test_serve_mcp_over_stdio_answers_the_official_client() -> None:
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def run() -> list[tuple[str, bool]]:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "agentgym", "serve-mcp", "tools-v0"])
        async with stdio_client(params) as (read, write):
            return await _call_served_tools(read, write)

    assert asyncio.run(asyncio.wait_for(run(), SERVER_START_TIMEOUT_S)) == SERVED


def test_serve_mcp_over_http_is_an_mcp_v0_server() -> None:
    """The two halves meet: mcp-v0 plays tools-v0's calculator, served by ``serve-mcp --http``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "agentgym", "serve-mcp", "tools-v0", "--http", "--port",
                                str(port)], stdout=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        tasks = [{"prompt": "What is 12.5 * (100 - 15) / 100?", "answer": "10.625"}]
        env = agentgym.make("mcp-v0", tasks=tasks, server_url=f"http://127.0.0.1:{port}/mcp")
        try:
            _, info = env.reset(seed=0)
            # tools-v0's own answer tool is left out: the answer is mcp-v0's to reward
            assert [tool["function"]["name"] for tool in info["tools"]] == ["new_task", *TOOLS_V0]
            assert info["tools"][-1]["function"]["description"].startswith("Give the final answer; this ends")
            obs, *_ = env.step("<calculate>12.5 * (100 - 15) / 100</calculate>")
            assert obs == ('<tool_response>\n{"name": "calculate", "result": "{\\"result\\": 10.625}"}\n'
                           '</tool_response>')
            assert env.step("<answer>10.625</answer>")[1] == 1.0
        finally:
            env.close()
    finally:
        stop_process(process)


def test_serve_mcp_refuses_an_env_without_tools() -> None:
    result = subprocess.run([sys.executable, "-m", "agentgym", "serve-mcp", "maze-v0"], capture_output=True,
                            text=True, timeout=SERVER_START_TIMEOUT_S, check=False)
    assert result.returncode == 2
    assert "ConfigError: maze-v0 offers no tools" in result.stderr and result.stderr.count("\n") == 1
