"""The ``agentgym`` Typer app, its consoles, ``--version`` and the one-line error exit shared by every command."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# Help text is plain text: brackets are optional syntax (`RUN[/checkpoint.pt]`), not markup, and rich
# markup mode (the default when rich is installed) fails on them; Markdown mode would eat `*` and `_`.
# Subcommand groups (sandbox, retrieval) inherit this mode from the root app.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="agentgym: text and tool environments and turn-level RL trainers for LLM agents.",
)
console = Console()
err_console = Console(stderr=True)


def fail(exc: Exception) -> NoReturn:
    """Print ``error: Kind: message`` on stderr, on one line however narrow the terminal, and exit with status 2."""
    err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True,
                      highlight=False)
    raise typer.Exit(code=2)


def _print_version(value: bool) -> None:
    if value:
        import agentgym

        console.print(agentgym.__version__, highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the agentgym version and exit."),
) -> None:
    """agentgym: text and tool environments and turn-level RL trainers for LLM agents."""
