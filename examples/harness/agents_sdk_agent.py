"""The calculator agent written with the OpenAI Agents SDK (``pip install openai-agents``), as its docs write
an agent on a non-OpenAI, Chat Completions provider: an ``Agent`` with a ``@function_tool``, its model an
``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` client, run by ``Runner.run``. Only the client's
``base_url``/``api_key`` and the model name are the ones the harness is given; nothing else knows about
agentgym::

    cd examples/harness   # the harness is found in the working folder
    agentgym train harness_calculator_grpo_smollm2 --set env.harness=agents_sdk_agent:run \\
        --set env.tasks=tasks.jsonl

Tasks have ``question`` and ``answer`` (``agentgym.harness.examples.write_arithmetic_tasks`` writes some);
the reward is 1.0 when the final answer states the task's answer.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from agentgym.harness.examples import MAX_CALLS, SYSTEM, answered, calculate

# Traces are exported to OpenAI's servers by default; the rollout proxy is the only endpoint here.
set_tracing_disabled(True)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+, -, *, /, parentheses) and return its value.

    Args:
        expression: The expression to evaluate, e.g. "(17 + 4) * 3".
    """
    return calculate(expression)


async def run(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
    """Run the agent once on ``task``; 1.0 for a right final answer (0.0 also when it never answers within
    ``MAX_CALLS`` model calls)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    agent = Agent(name="Calculator", instructions=SYSTEM, tools=[calculator],
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client))
    try:
        result = await Runner.run(agent, task["question"], max_turns=MAX_CALLS)
    except MaxTurnsExceeded:
        return 0.0
    finally:
        await client.close()
    return 1.0 if answered(str(result.final_output), task["answer"]) else 0.0
