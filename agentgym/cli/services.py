"""Service commands: ``sandbox serve``, ``retrieval index|synthetic|serve``, ``serve-mcp``."""

from __future__ import annotations

import collections
import json
import re
import threading
from typing import Any

import typer

import agentgym
from agentgym.cli.app import app, console, err_console, fail
from agentgym.cli.serving import MAX_PORT, MIN_PORT, bind, check_exposure, check_range, run_uvicorn
from agentgym.errors import AgentGymError, ConfigError

sandbox_app = typer.Typer(help="The code sandbox service (runs untrusted Python).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("serve")
def sandbox_serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8100, help="TCP port, 1-65535."),
    backend: str = typer.Option("auto", help="auto | bwrap | docker | subprocess "
                                             "(subprocess is NOT a security boundary)."),
    pool_size: int = typer.Option(2, help="Pre-spawned sandboxed workers, each used once (>= 0)."),
    max_concurrency: int = typer.Option(4, help="Runs at once (>= 1); more get 503."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_SANDBOX_TOKEN",
                                     help="Require this bearer token."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token: anyone who can "
                                             "reach it can run code on this machine."),
) -> None:
    """Serve the code sandbox over HTTP: POST /run {code, stdin?, limits?}."""
    from agentgym.sandbox.backends import default_backend
    from agentgym.sandbox.service import create_sandbox_app

    try:
        check_range("--port", port, MIN_PORT, MAX_PORT)
        check_range("--pool-size", pool_size, 0)
        check_range("--max-concurrency", max_concurrency, 1)
        check_exposure(host, token, allow_no_token, "run arbitrary code on this machine")
        service = create_sandbox_app(default_backend(backend), pool_size=pool_size,  # type: ignore[arg-type]
                                     max_concurrency=max_concurrency, token=token)
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    console.print(f"sandbox ({backend}) serving on http://{host}:{port} (docs: /docs)")
    run_uvicorn(service, sock, log_level="info")


retrieval_app = typer.Typer(help="BM25 retrieval: build an index, serve it, write a synthetic corpus.",
                            no_args_is_help=True)
app.add_typer(retrieval_app, name="retrieval")


@retrieval_app.command("index")
def retrieval_index(
    corpus: str = typer.Argument(..., help="JSONL corpus, one {id, title, text} per line."),
    out: str = typer.Option(..., "--out", help="Index folder to write."),
    k1: float = typer.Option(1.5, help="BM25 k1."),
    b: float = typer.Option(0.75, help="BM25 b."),
) -> None:
    """Build a BM25 index over a JSONL corpus."""
    from agentgym.retrieval import build_index

    try:
        build_index(corpus, out, k1=k1, b=b)
    except AgentGymError as exc:
        fail(exc)
    except UnicodeDecodeError as exc:
        fail(ConfigError(f"{corpus}: not UTF-8 text (byte {exc.start}); the corpus must be a JSONL file"))
    except OSError as exc:  # the corpus cannot be read, or --out cannot be created (a file on its path...)
        fail(ConfigError(f"{exc.filename or out}: {exc.strerror or exc}"))
    console.print(f"[green]ok[/] index written to {out}")


@retrieval_app.command("synthetic")
def retrieval_synthetic(
    out: str = typer.Argument(..., help="Folder to write corpus.jsonl and questions.jsonl into."),
    entities: int = typer.Option(500, help="Entities (documents) in the corpus."),
    seed: int = typer.Option(0, help="Generator seed; the same seed gives the same files."),
) -> None:
    """Write the synthetic multi-hop corpus and its questions (search-qa-v0's default data) as JSONL."""
    from agentgym.retrieval.synthetic import generate_corpus, write_jsonl

    try:
        docs, questions = generate_corpus(entities, seed)
    except AgentGymError as exc:
        fail(exc)
    corpus, qa = write_jsonl(docs, questions, out)
    console.print(f"[green]ok[/] {len(docs)} documents in {corpus}, {len(questions)} questions in {qa}")


@retrieval_app.command("serve")
def retrieval_serve(
    index: str = typer.Argument(..., help="Index folder from `agentgym retrieval index`."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; any other than loopback needs --token."),
    port: int = typer.Option(8001, help="TCP port, 1-65535."),
    token: str | None = typer.Option(None, envvar="AGENTGYM_RETRIEVAL_TOKEN",
                                     help="Require this bearer token."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host without a token."),
    max_k: int = typer.Option(50, help="Largest k a request may ask for (>= 1)."),
) -> None:
    """Serve an index over HTTP: POST /retrieve {queries, k}."""
    from agentgym.retrieval.service import create_retrieval_app

    try:
        check_range("--port", port, MIN_PORT, MAX_PORT)
        check_range("--max-k", max_k, 1)
        check_exposure(host, token, allow_no_token, "query this index")
        service = create_retrieval_app(index, token=token, max_k=max_k)
        sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    console.print(f"retrieval serving {index} on http://{host}:{port}")
    run_uvicorn(service, sock)


# --- serve-mcp: an env's tools for MCP-speaking agents ----------------------------------------------

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


@app.command("serve-mcp")
def serve_mcp(
    env_id: str = typer.Argument(..., help="A registered tool env, e.g. tools-v0."),
    http: bool = typer.Option(False, "--http/--stdio",
                              help="Serve streamable HTTP (at /mcp) instead of stdio (the default, for "
                                   "agents that spawn the server)."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind with --http; any other than loopback needs "
                                               "--allow-no-token (the MCP endpoint has no token)."),
    port: int = typer.Option(8200, help="TCP port with --http, 1-65535."),
    seed: int = typer.Option(0, help="Seed of each session's first task (new_task picks others)."),
    allow_no_token: bool = typer.Option(False, "--allow-no-token", envvar="AGENTGYM_ALLOW_NO_TOKEN",
                                        help="Serve on a non-loopback --host: anyone who can reach it can "
                                             "use the env's tools."),
) -> None:
    """Serve a tool env's tools over MCP (stdio, or streamable HTTP with --http) for MCP-speaking agents."""
    try:
        server = build_mcp_server(env_id, seed=seed)
        sock = None
        if http:
            check_exposure(host, None, allow_no_token, "use this env's tools")
            sock = bind(host, port)
    except AgentGymError as exc:
        fail(exc)
    if sock is None:
        server.run(show_banner=False, log_level="warning")  # stdout is the MCP stream: print nothing else
        return
    err_console.print(f"{env_id} tools served over MCP at http://{host}:{port}/mcp")
    server.run(transport="http", show_banner=False, host=host, port=port, path="/mcp", log_level="warning",
               sockets=[sock])
