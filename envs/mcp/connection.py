"""``MCPConnection``: a synchronous session with one MCP server, run on an event-loop thread of its own.

Envs are synchronous (Gymnasium-style) while the official ``mcp`` client is async, and its transports
are context managers that must be entered and left by one task. So each connection owns a private
event loop on a daemon thread, and one long-lived task on it opens the transport and the
``ClientSession``, lists the tools and then waits to be told to close; tool calls are submitted to that
loop from the env's thread and awaited with a deadline.

A server is a stdio command (``MCPServer(command=("python", "server.py"))``, spawned as a subprocess
and ended on ``close``) or a streamable-HTTP URL (``MCPServer(url="http://127.0.0.1:8000/mcp")``).

Both majors of the ``mcp`` client work: 1.x (deadlines as ``timedelta``, errors as ``McpError``, an HTTP
transport that also yields a session-id getter) and 2.x (deadlines in seconds, ``MCPError``, two streams).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

from agentgym.errors import ConfigError, RemoteEnvError, RemoteTimeout

#: Seconds ``close`` waits for the session (and a stdio server's process) to shut down.
CLOSE_TIMEOUT_S = 10.0
#: Extra seconds the env's thread waits beyond a call's own timeout before it gives the loop up as stuck.
_GRACE_S = 5.0


@dataclass(frozen=True)
class MCPServer:
    """Where an MCP server is: exactly one of a stdio command or a streamable-HTTP URL.

    Example:
        >>> MCPServer.of(server_command="python my_server.py --flag").command
        ('python', 'my_server.py', '--flag')
        >>> MCPServer.of(server_url="http://127.0.0.1:8000/mcp").name
        'http://127.0.0.1:8000/mcp'
    """

    command: tuple[str, ...] | None = None
    """The program and its arguments, run as a subprocess that speaks MCP on stdin/stdout."""
    url: str | None = None
    """The server's streamable-HTTP endpoint (usually ending in ``/mcp``)."""

    @property
    def name(self) -> str:
        """How errors name the server: the command line or the URL."""
        return shlex.join(self.command) if self.command else str(self.url)

    @classmethod
    def of(cls, server_command: str | Sequence[str] | None = None,
           server_url: str | None = None) -> MCPServer:
        """The server from the env's keyword arguments.

        Raises:
            ConfigError: neither or both given, an empty command, or a URL that is not http(s).
        """
        if (server_command is None) == (server_url is None):
            raise ConfigError("give exactly one of server_command (a stdio command line, e.g. "
                              "'python my_server.py') or server_url (e.g. 'http://127.0.0.1:8000/mcp')")
        if server_url is not None:
            if not isinstance(server_url, str) or not server_url.startswith(("http://", "https://")):
                raise ConfigError(f"server_url must be an http(s) URL such as 'http://127.0.0.1:8000/mcp', "
                                  f"got {server_url!r}")
            return cls(url=server_url)
        if isinstance(server_command, str):
            command = shlex.split(server_command)
        else:
            command = list(server_command or ())
        if not command or not all(isinstance(part, str) and part for part in command):
            raise ConfigError(f"server_command must be a command line such as 'python my_server.py', "
                              f"got {server_command!r}")
        return cls(command=tuple(command))


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call gave: its text, and whether the server (or the deadline) said it failed."""

    text: str
    """The result's content as text (text blocks joined by newlines; other blocks described)."""
    is_error: bool
    """The tool reported an error, the server refused the call, or it did not answer in time."""


@cache
def _mcp_error() -> type[Exception]:
    """The exception the installed ``mcp`` raises for an error the server (or the deadline) answered."""
    from mcp.shared import exceptions

    return getattr(exceptions, "MCPError", None) or exceptions.McpError  # 2.x name, else 1.x's


def mcp_field(record: Any, name: str, default: Any = None) -> Any:
    """A field of an ``mcp.types`` record by its snake_case name (2.x), or its camelCase one (1.x).

    Example:
        >>> from types import SimpleNamespace
        >>> mcp_field(SimpleNamespace(inputSchema={"type": "object"}), "input_schema")
        {'type': 'object'}
        >>> mcp_field(SimpleNamespace(is_error=True), "is_error")
        True
    """
    head, *rest = name.split("_")
    for attribute in (name, head + "".join(part.title() for part in rest)):
        if hasattr(record, attribute):
            return getattr(record, attribute)
    return default


def _deadline(seconds: float) -> Any:
    """A deadline as the installed ``mcp`` takes it: seconds on 2.x, a ``timedelta`` on 1.x."""
    return float(seconds) if _mcp_error().__name__ == "MCPError" else timedelta(seconds=seconds)


def _first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio task groups wrap the error that matters)."""
    while isinstance(getattr(exc, "exceptions", None), (list, tuple)) and exc.exceptions:  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc


def _one_line(exc: BaseException) -> str:
    leaf = _first_error(exc)
    text = " ".join(str(leaf).split()) or type(leaf).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def content_text(result: Any) -> str:
    """The content blocks of an MCP ``CallToolResult`` as one text (what the policy is shown).

    Text blocks give their text; an embedded text resource its text; images, audio and other
    resources a one-line description. With no content, the structured content as JSON.
    """
    parts = []
    for block in getattr(result, "content", None) or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            mime = mcp_field(block, "mime_type")
            parts.append(f"[{kind or 'unknown'} content{', ' + mime if mime else ''}]")
    structured = mcp_field(result, "structured_content")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, sort_keys=True))
    return "\n".join(parts)


class MCPConnection:
    """One client session with one MCP server, usable from synchronous code.

    ``open`` starts the loop thread, connects (spawning a stdio server), initialises the session and
    lists the tools, all within ``connect_timeout_s``. ``call_tool`` runs one call within
    ``call_timeout_s``. ``close`` ends the session (and a stdio server's process) and the thread; it
    is idempotent, and ``open`` may be called again afterwards.

    Args:
        server: the server to talk to.
        connect_timeout_s: deadline for connecting, initialising and listing the tools (> 0).
        call_timeout_s: deadline for each tool call (> 0).

    Raises:
        ConfigError: a timeout that is not positive.
    """

    def __init__(self, server: MCPServer, *, connect_timeout_s: float = 30.0,
                 call_timeout_s: float = 30.0) -> None:
        for name, value in (("connect_timeout_s", connect_timeout_s), ("call_timeout_s", call_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
        self.server = server
        self.connect_timeout_s, self.call_timeout_s = float(connect_timeout_s), float(call_timeout_s)
        self.tools: list[Any] = []
        """The server's tools (``mcp.types.Tool``), listed when the connection opened."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None

    @property
    def is_open(self) -> bool:
        """The session is up (opened and not closed; the server may still have died since)."""
        return self._session is not None

    def open(self) -> list[Any]:
        """Connect, initialise and list the tools; returns ``self.tools``.

        Raises:
            RemoteTimeout: the server did not get through initialisation in ``connect_timeout_s``.
            RemoteEnvError: the connection failed (no such command, nothing listening, a server that
                exited or is not MCP).
        """
        if self.is_open:
            return self.tools
        self.close()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"mcp-client {self.server.name}",
                                        daemon=True)
        self._thread.start()
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), loop)
        try:
            self.tools = ready.result(timeout=self.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RemoteTimeout(f"MCP server {self.server.name} did not finish connecting within "
                                f"{self.connect_timeout_s:g} s (connect_timeout_s)") from None
        except Exception as exc:  # noqa: BLE001 - any failure to connect is reported as one line
            self.close()
            raise RemoteEnvError(f"cannot connect to MCP server {self.server.name}: "
                                 f"{_one_line(exc)}") from None
        return self.tools

    async def _serve(self, ready: concurrent.futures.Future[list[Any]]) -> None:
        """Hold the transport and session open until ``close`` (the task that enters them must leave them)."""
        from mcp import ClientSession
        from mcp.types import PaginatedRequestParams

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.server.command is not None:
                    from mcp import StdioServerParameters
                    from mcp.client.stdio import stdio_client

                    program, *args = self.server.command
                    params = StdioServerParameters(command=program, args=args)
                    read, write = await stack.enter_async_context(stdio_client(params))
                else:
                    from mcp.client.streamable_http import streamable_http_client

                    transport = streamable_http_client(str(self.server.url))
                    # 1.x yields (read, write, session-id getter), 2.x (read, write)
                    read, write, *_ = await stack.enter_async_context(transport)
                client = ClientSession(read, write, read_timeout_seconds=_deadline(self.connect_timeout_s))
                session = await stack.enter_async_context(client)
                await session.initialize()
                tools, cursor = [], None
                while True:  # servers may page their tool list
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
                    tools.extend(page.tools)
                    cursor = mcp_field(page, "next_cursor")
                    if not cursor:
                        break
                self._session = session
                ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            raise
        finally:
            self._session = None

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        """Call one tool; a tool that fails, a refused call or a timeout come back as ``is_error``.

        Raises:
            RemoteEnvError: the connection is not open, or the server went away (exited, closed the
                stream, stopped listening); the message names the server.
        """
        session, loop = self._session, self._loop
        if session is None or loop is None or (self._main is not None and self._main.done()):
            raise RemoteEnvError(f"MCP server {self.server.name} is not connected (it exited or closed the "
                                 "connection); reset the env to reconnect")
        call = session.call_tool(name, arguments, read_timeout_seconds=_deadline(self.call_timeout_s))
        future = asyncio.run_coroutine_threadsafe(call, loop)
        try:
            result = future.result(timeout=self.call_timeout_s + _GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RemoteTimeout(f"MCP server {self.server.name}: the client loop did not answer a call to "
                                f"{name!r} within {self.call_timeout_s + _GRACE_S:g} s") from None
        except Exception as exc:  # noqa: BLE001 - sorted below into "tool failed" and "server gone"
            return self._failed_call(name, exc)
        return ToolOutcome(content_text(result), bool(mcp_field(result, "is_error", False)))

    def _failed_call(self, name: str, exc: Exception) -> ToolOutcome:
        from mcp.types import CONNECTION_CLOSED

        leaf = _first_error(exc)
        code = getattr(getattr(leaf, "error", None), "code", None)
        if isinstance(leaf, _mcp_error()) and code != CONNECTION_CLOSED:
            if "timed out" in str(leaf).lower():
                return ToolOutcome(f"the tool did not answer within {self.call_timeout_s:g} s", True)
            return ToolOutcome(str(leaf), True)  # the server refused this call (unknown tool, bad params)
        raise RemoteEnvError(f"MCP server {self.server.name} went away during a call to {name!r}: "
                             f"{_one_line(leaf)}") from None

    def close(self) -> None:
        """End the session, the server process (stdio) and the loop thread; safe to call twice."""
        loop, thread, main = self._loop, self._thread, self._main
        self._loop = self._thread = self._main = None
        self._session = None
        if loop is None:
            return
        if main is not None and not main.done():
            stop = self._stop
            if stop is not None:
                loop.call_soon_threadsafe(stop.set)
            try:
                main.result(timeout=CLOSE_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                main.cancel()
            except Exception:  # noqa: BLE001, S110 - a server that died already needs no goodbye
                pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=CLOSE_TIMEOUT_S)
        if thread is None or not thread.is_alive():
            loop.close()
