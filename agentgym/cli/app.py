"""The ``agentgym`` Typer app, its consoles and the one-line error exit shared by every command."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="agentgym: text and tool environments and turn-level RL trainers for LLM agents.",
)
console = Console()
err_console = Console(stderr=True)


def fail(exc: Exception) -> NoReturn:
    """Print ``error: Kind: message`` on stderr and exit with status 2."""
    err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
    raise typer.Exit(code=2)

