"""The ``agentgym`` command line: env, training, evaluation and service commands (``agentgym --help``)."""

from __future__ import annotations

import sys

from agentgym.cli import caching, envs, evaluation, policy_serving, services, training, viewing  # noqa: F401  (each module registers its commands)
from agentgym.cli.app import app, err_console
from agentgym.errors import AgentGymError
from agentgym.plugins import use_working_folder

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    use_working_folder()  # a user's module:attr names (--harness my_agent:run) resolve from their folder
    try:
        app()
    except AgentGymError as exc:  # pragma: no cover - commands catch their own
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
