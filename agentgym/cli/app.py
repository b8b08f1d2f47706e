"""The ``agentgym`` Typer app, its consoles, ``--version`` and the one-line error exit shared by every
command."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from agentgym.errors import exit_status

# Help text is plain text: brackets are optional syntax (`RUN[/checkpoint.pt]`), not markup, and rich
# markup mode (the default when rich is installed) fails on them; Markdown mode would eat `*` and `_`.
# Subcommand groups (sandbox, retrieval) inherit this mode from the root app.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="agentgym: text and tool environments and turn-level RL trainers for LLM agents.",
    epilog="Exit status: 0 done; 1 a runtime failure (the command was right, something it ran failed: "
           "an env, a service, a full disk); 2 a usage error (a bad option or --set value, an invalid "
           "config, an unknown id, a missing file); 130 Ctrl-C; 143 SIGTERM. `agentgym doctor` prints what "
           "a bug report needs.",
)
#: Columns of a console that writes to a pipe or a file: wide enough that no table is cut.
UNCUT_WIDTH = 4096


class StreamConsole(Console):
    """A rich ``Console`` that, writing to a pipe or a file, lays lines out ``UNCUT_WIDTH`` wide.

    rich assumes 80 columns (or the width of a terminal on another stream) when its stream is not a
    terminal, and squeezes tables into that (``poli…``, ``succ…``): output kept in a log or piped to
    ``grep`` would lose cells. An explicit ``COLUMNS`` still wins.
    """

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or self._width is not None or "COLUMNS" in self._environ:
            return size
        return ConsoleDimensions(max(size.width, UNCUT_WIDTH), size.height)


console = StreamConsole()
err_console = StreamConsole(stderr=True)


def fail(exc: Exception) -> NoReturn:
    """Print ``error: Kind: message`` on stderr, on one line however narrow the terminal, and exit with
    the status ``agentgym.errors.exit_status`` gives ``exc``: 2 for a usage error, 1 for a runtime failure."""
    err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True,
                      highlight=False)
    raise typer.Exit(code=exit_status(exc))


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
