"""A small MCP server for the ``mcp-v0`` tests: arithmetic and a fact table, written with fastmcp.

Run it as ``python facts_server.py`` (stdio) or ``python facts_server.py --http`` (streamable HTTP on
127.0.0.1, a port the OS picks; the first line on stdout is ``PORT <n>`` once the socket listens).
Every tool is deterministic, as the env contract asks of the servers an env talks to.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

CAPITALS = {"ostavia": "Lumen", "brenmark": "Harrow", "quellon": "Isk"}

server = FastMCP("facts")


@server.tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b


@server.tool
def capital(country: str) -> str:
    """The capital city of a country."""
    found = CAPITALS.get(country.strip().lower())
    if found is None:
        raise ToolError(f"no country named {country!r}; known: {', '.join(sorted(CAPITALS))}")
    return found


@server.tool
async def sleep(seconds: float) -> str:
    """Wait, then say so (the tests use it to run past a call's deadline)."""
    await asyncio.sleep(seconds)
    return "awake"


@server.tool
def crash() -> str:
    """End the server process at once (the tests use it to kill the server mid-episode)."""
    os._exit(3)


def main() -> None:
    if "--http" in sys.argv[1:]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        print(f"PORT {sock.getsockname()[1]}", flush=True)
        server.run(transport="http", show_banner=False, host="127.0.0.1", port=sock.getsockname()[1],
                   path="/mcp", log_level="warning", sockets=[sock])
    else:
        server.run(show_banner=False, log_level="warning")


if __name__ == "__main__":
    main()
