"""The calculator agent written with LangGraph (``pip install langgraph langchain-openai``), as its docs build
a tool-calling agent with the Graph API: a ``MessagesState`` graph whose model node calls a chat model
with the tools bound, a ``ToolNode`` that runs the calls, and ``tools_condition`` looping between them
until the model answers. The model is ``ChatOpenAI``; only its ``base_url``/``api_key`` and the model
name are the ones the harness is given, nothing else knows about agentgym::

    cd examples/harness   # the harness is found in the working folder
    agentgym train harness_calculator_grpo_smollm2 --set env.harness=langgraph_agent:run \\
        --set env.tasks=tasks.jsonl

Tasks have ``question`` and ``answer`` (``agentgym.harness.examples.write_arithmetic_tasks`` writes some);
the reward is 1.0 when the final answer states the task's answer.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentgym.harness.examples import MAX_CALLS, SYSTEM, answered, calculate


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+, -, *, /, parentheses) and return its value."""
    return calculate(expression)


def build_agent(base_url: str, api_key: str, model: str) -> Any:
    """The compiled graph: ``agent`` (the model) and ``tools``, looping until the model answers."""
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key).bind_tools([calculator])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def run(task: dict[str, Any], base_url: str, api_key: str, model: str) -> float:
    """Run the agent once on ``task``; 1.0 for a right final answer (0.0 also when it never answers within
    ``MAX_CALLS`` model calls)."""
    agent = build_agent(base_url, api_key, model)
    try:
        # Each model call and each tool run is one graph step: MAX_CALLS calls take 2 * MAX_CALLS - 1 steps.
        state = agent.invoke({"messages": [("user", task["question"])]},
                             {"recursion_limit": 2 * MAX_CALLS - 1})
    except GraphRecursionError:
        return 0.0
    return 1.0 if answered(state["messages"][-1].text, task["answer"]) else 0.0
