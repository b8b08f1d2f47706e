"""The ``agentgym`` command's exit statuses, as a shell sees them: 2 for a usage error, 1 for a runtime
failure, 130 for Ctrl-C; one rule, ``agentgym.errors.exit_status``, decided by the error's class."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym import errors
from agentgym.service_kit.launcher import free_port, stop_service, wait_healthy

pytestmark = pytest.mark.timeout(120)

AGENTGYM = str(Path(sys.executable).parent / "agentgym")  # the console script, as a user runs it


def agentgym(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTGYM, *args], capture_output=True, text=True, timeout=90, cwd=cwd,
                          env={**os.environ, "COLUMNS": "300"})


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("cls", sorted(set(errors.ERRORS_BY_NAME.values()), key=lambda c: c.__name__),
                         ids=lambda cls: cls.__name__)
def test_each_error_class_says_usage_or_runtime(cls: type[errors.AgentGymError]) -> None:
    # Usage: the command as typed cannot run (a value, a config, a name). Everything else happened while
    # the command ran: an env, a service, a judge failed.
    usage = issubclass(cls, (errors.ConfigError, errors.RegistryError))
    assert errors.exit_status(cls("message")) == (2 if usage else 1)


def test_exit_status_of_what_is_not_an_agentgym_error() -> None:
    assert errors.exit_status(KeyboardInterrupt()) == 130
    assert errors.exit_status(ImportError("no module named fastapi")) == 1  # a missing extra: the install


@pytest.mark.parametrize("args, said", [
    (["check", "maze-v9"], "maze-v0"),                                        # an unknown id
    (["serve", "maze-v0", "--port", "70000"], "--port must be in [1, 65535]"),  # a value out of range
    (["train", "no-such-preset.yaml"], "no-such-preset.yaml"),                # a file the user named
    (["train", "--set", "rollout.group_size=many"], "rollout.group_size"),    # a --set value
    (["eval", "--policy", "random", "--envs", "maze-v0", "--seeds", "5-1"], "5-1"),
    (["serve", "--host", "0.0.0.0"], "set AGENTGYM_TOKEN to the bearer token clients must send"),
    (["serve-mcp", "tools-v0", "--http", "--host", "0.0.0.0"], "has no token to ask for"),
])
def test_usage_errors_exit_2_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    result = agentgym(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines


def test_a_bad_option_exits_2(tmp_path: Path) -> None:
    result = agentgym("serve", "--no-such-option", cwd=tmp_path)  # click's own usage error
    assert result.returncode == 2 and "No such option" in result.stderr


def test_a_runtime_failure_exits_1_in_one_line(tmp_path: Path) -> None:
    # The command is right; the service it names is not there (nothing listens on the port).
    url = f"http://127.0.0.1:{free_port()}"
    result = agentgym("play", "maze-v0", "--url", url, "--expert", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: RemoteEnvError") and url in lines[0], lines


def test_ctrl_c_exits_130_and_sigterm_ends_by_the_signal(tmp_path: Path) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        port = free_port()
        process = subprocess.Popen([AGENTGYM, "serve", "maze-v0", "--port", str(port)], cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", process, timeout_s=60.0)
            process.send_signal(sig)
            output, _ = process.communicate(timeout=30)
        finally:
            stop_service(process)
        assert "Traceback" not in output, output
        # A shell reports 128 + the signal's number for both: 130 for Ctrl-C, 143 for SIGTERM.
        assert process.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), output
