"""Every ``agentgym`` command and subcommand prints its ``--help`` (exit 0, no traceback), brackets
verbatim."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentgym.cli import app


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the CLI tree: (), ("train",), ("sandbox",), ("sandbox", "serve"), ..."""
    paths = [path]
    # Typer's groups are not click.Group subclasses in every release: go by the `commands` they hold.
    if isinstance(getattr(command, "commands", None), dict):
        for name, sub in sorted(command.commands.items()):
            paths.extend(_command_paths(sub, (*path, name)))
    return paths


COMMAND_PATHS = _command_paths(typer.main.get_command(app))


def test_the_tree_holds_every_command_group() -> None:
    # Guards the walk itself: a tree without subgroups would make the parametrised test vacuous.
    assert {("eval",), ("train",), ("serve",), ("sandbox", "serve"),
            ("retrieval", "index")} <= set(COMMAND_PATHS)


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda path: " ".join(path) or "agentgym")
def test_help_exits_zero_without_traceback(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "Usage:" in result.output


def test_eval_help_shows_bracketed_syntax_verbatim() -> None:
    result = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # Square brackets are optional parts of the syntax, not markup: both must reach the reader.
    assert "RUN[/checkpoint.pt]" in result.output
    assert "[,model=NAME]" in result.output


def test_installed_command_prints_eval_help() -> None:
    # The console script as a user runs it (a terminal-like width, rich installed), not a test runner.
    script = os.path.join(os.path.dirname(sys.executable), "agentgym")
    done = subprocess.run([script, "eval", "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "--policy" in done.stdout
