"""The ``agentgym`` command line: env, training, evaluation and service commands (``agentgym --help``)."""

from __future__ import annotations

import sys

from rich.markup import escape

from agentgym.cli import caching, doctor, envs, evaluation, policy_serving, services, training, viewing  # noqa: F401  (each module registers its commands)
from agentgym.cli.app import app, err_console
from agentgym.errors import INTERRUPTED_EXIT_STATUS, AgentGymError, exit_status
from agentgym.plugins import use_working_folder

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point. Exit status: 0 done, 1 a runtime failure, 2 a usage error, 130 Ctrl-C
    (``agentgym.errors.exit_status``: the class of the error decides)."""
    use_working_folder()  # a user's module:attr names (--harness my_agent:run) resolve from their folder
    try:
        app()
    except AgentGymError as exc:  # pragma: no cover - commands catch their own
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True,
                          highlight=False)
        sys.exit(exit_status(exc))
    except KeyboardInterrupt:  # before click runs the command (it answers Ctrl-C inside with 130 itself)
        sys.exit(INTERRUPTED_EXIT_STATUS)
