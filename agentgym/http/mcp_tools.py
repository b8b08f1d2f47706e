"""A tool env's tools served over MCP (``agentgym serve-mcp``): ``EnvToolSessions`` and ``build_mcp_server``.

MCP-speaking agents (any ``mcp`` client, the OpenAI Agents SDK's MCP support) call
an agentgym tool env's tools as MCP tools: each MCP session plays its own episode of the env, and a tool
call is one step. ``fastmcp`` is imported only when a server is built (``pip install 'agentgym-rl[mcp]'``).
"""

from __future__ import annotations

import collections
import json
import re
import threading
from typing import Any

import agentgym
from agentgym.errors import ConfigError

#: Name of the extra tool that starts a task (the env's own tools act on the current task).
NEW_TASK_TOOL = "new_task"
#: Most envs (one per MCP session) a served env keeps; the least recently used is closed beyond it.
MAX_MCP_SESSIONS = 64


class EnvToolSessions:
    """The env episodes behind ``serve-mcp``: one env per MCP session, stepped with the session's tool calls.

    A call of one of the env's tools is sent to the env as ``<tool_call>{"name": ..., "arguments": ...}
    </tool_call>``; the answer is the env's observation (the inside of its ``<tool_response>`` block when
    the observation is exactly one). The first call of a session starts the task of ``seed``;
    ``new_task`` starts another. When the episode ends (the env's ``answer``, or its turn budget) the
    answer says so, with the reward, and the next calls are refused until ``new_task``.

    Args:
        env_id: a registered env that offers tools (``info["tools"]`` on reset), e.g. ``tools-v0``.
        seed: the seed of a session's first task.
        env_kwargs: constructor arguments of the env.

    Raises:
        ConfigError: the env offers no tools, or one of them is named ``new_task``.
    """

    def __init__(self, env_id: str, *, seed: int = 0, env_kwargs: dict[str, Any] | None = None) -> None:
        self.env_id, self.seed, self.env_kwargs = env_id, int(seed), dict(env_kwargs or {})
        probe = agentgym.make(env_id, **self.env_kwargs)
        try:
            _, info = probe.reset(seed=self.seed)
        finally:
            probe.close()
        self.tools: list[dict[str, Any]] = [dict(t.get("function", t)) for t in info.get("tools") or ()]
        self.instructions = str(info.get("instructions") or "")
        if not self.tools:
            raise ConfigError(f"{env_id} offers no tools (its reset info has no 'tools'); serve-mcp serves "
                              "tool envs such as tools-v0")
        if any(tool.get("name") == NEW_TASK_TOOL for tool in self.tools):
            raise ConfigError(f"{env_id} has a tool named {NEW_TASK_TOOL!r}, which serve-mcp keeps for "
                              "starting a task")
        self._envs: collections.OrderedDict[str, list[Any]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _episode(self, session: str) -> list[Any]:
        """``[env, lock, over]`` of a session, made (and its first task started) on first use."""
        with self._lock:
            if session in self._envs:
                self._envs.move_to_end(session)
                return self._envs[session]
            entry = [agentgym.make(self.env_id, **self.env_kwargs), threading.Lock(), False]
            entry[0].reset(seed=self.seed)
            self._envs[session] = entry
            while len(self._envs) > MAX_MCP_SESSIONS:
                self._envs.popitem(last=False)[1][0].close()
            return entry

    def new_task(self, session: str, seed: int | None = None, task_id: str | None = None) -> str:
        """Start a task (by seed, or by the env's task id) in the session; returns its first observation."""
        entry = self._episode(session)
        with entry[1]:
            options = {"task_id": task_id} if task_id is not None else None
            observation, _ = entry[0].reset(seed=self.seed if seed is None else int(seed), options=options)
            entry[2] = False
            return str(observation)

    def call(self, session: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Step the session's env with one call of tool ``name``; returns ``(text, is_error)``."""
        entry = self._episode(session)
        with entry[1]:
            if entry[2]:
                return f"the task has ended; call {NEW_TASK_TOOL} to start another", True
            action = "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
            observation, reward, terminated, truncated, info = entry[0].step(action)
            entry[2] = bool(terminated or truncated)
            text, is_error = str(observation), bool(info.get("invalid_action"))
            block = re.fullmatch(r"\s*<tool_response>\s*(.*?)\s*</tool_response>\s*", text, re.DOTALL)
            if block is not None and "<tool_response>" not in block.group(1):
                text = block.group(1)
                try:
                    reply = json.loads(text)
                except ValueError:
                    reply = None
                if isinstance(reply, dict) and ("error" in reply or "result" in reply):
                    # {"name": ..., "result" or "error": ...}: the caller knows the name; MCP flags errors
                    is_error = is_error or "error" in reply
                    outcome = reply.get("error", reply.get("result"))
                    text = outcome if isinstance(outcome, str) else json.dumps(outcome)
            if entry[2]:
                text += (f"\n[episode over: reward {float(reward):g}, success {bool(info.get('success'))}; "
                         f"call {NEW_TASK_TOOL} to start another task]")
            return text, is_error

    def close(self) -> None:
        """Close every session's env."""
        with self._lock:
            while self._envs:
                self._envs.popitem()[1][0].close()


def build_mcp_server(env_id: str, *, seed: int = 0, env_kwargs: dict[str, Any] | None = None) -> Any:
    """A FastMCP server offering the tools of a registered tool env, plus ``new_task``.

    Each tool keeps its name, description and JSON input schema; calls run as steps of the calling
    session's env (``EnvToolSessions``). The server's instructions are the env's, followed by how
    ``new_task`` works.

    Args:
        env_id: a registered env with tools (``tools-v0``, ``search-qa-v0``, ``code-math-v0``, ...).
        seed: the seed of each session's first task.
        env_kwargs: constructor arguments of the env.

    Returns:
        a ``fastmcp.FastMCP`` server; ``server.run()`` serves stdio, ``server.run(transport="http")`` HTTP.

    Raises:
        ConfigError: an unknown env, or one without tools.
    """
    import anyio
    from fastmcp import FastMCP
    from fastmcp.exceptions import ToolError
    from fastmcp.server.dependencies import get_context
    from fastmcp.tools import Tool, ToolResult
    from mcp.types import TextContent
    from pydantic import Field

    sessions = EnvToolSessions(env_id, seed=seed, env_kwargs=env_kwargs)

    class EnvTool(Tool):
        """One tool of the env: a call is a step of the session's env."""

        sessions: Any = Field(default=None, exclude=True)

        async def run(self, arguments: dict[str, Any]) -> Any:
            session = get_context().session_id
            if self.name == NEW_TASK_TOOL:
                prompt = await anyio.to_thread.run_sync(
                    lambda: self.sessions.new_task(session, arguments.get("seed"), arguments.get("task_id")))
                return ToolResult(content=[TextContent(type="text", text=prompt)])
            text, is_error = await anyio.to_thread.run_sync(
                lambda: self.sessions.call(session, self.name, dict(arguments)))
            if is_error:
                raise ToolError(text)
            return ToolResult(content=[TextContent(type="text", text=text)])

    guide = (f"\n\nCall {NEW_TASK_TOOL} (optional seed or task_id) to start a task and read it; without it, "
             f"the first tool call starts the task of seed {sessions.seed}.")
    server = FastMCP(f"agentgym {env_id}", instructions=sessions.instructions + guide)
    new_task_schema = {"type": "object", "properties": {
        "seed": {"type": "integer", "description": "Seed choosing the task."},
        "task_id": {"type": "string", "description": "The env's id of the task (overrides the seed)."}}}
    server.add_tool(EnvTool(name=NEW_TASK_TOOL, description="Start a new task; returns its text.",
                            parameters=new_task_schema, sessions=sessions))
    for tool in sessions.tools:
        server.add_tool(EnvTool(name=tool["name"], description=tool.get("description", ""),
                                parameters=tool.get("parameters") or {"type": "object", "properties": {}},
                                sessions=sessions))
    return server
