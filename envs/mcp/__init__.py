"""The ``mcp-v0`` env family: tasks solved with the tools of any MCP server.

``connection`` talks to the server (the official ``mcp`` client on a private event-loop thread),
``reward`` scores the final answer (answer match or a checker function), ``env`` is ``MCPEnv``.
"""
