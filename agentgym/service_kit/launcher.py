"""Starting local processes and knowing when they answer: ``python_command``, ``free_port``, ``wait_healthy``,
``start_service``, ``stop_service``.

Every agentgym service (env, sandbox, retrieval) answers ``GET /health`` with 200 and a JSON body
once it is ready. ``make serve-demo``, the tests that start real servers and the benchmarks use
these helpers to start one on 127.0.0.1 and wait for it, bounded in time. Every Python child the
project starts is built with ``python_command``, so it imports the installed package whatever its
working directory holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from agentgym.errors import RemoteEnvError

# Python 3.10 has no -P: the child drops the unsafe sys.path[0] itself, then runs what -m or -c would.
_SAFE_PATH_BOOTSTRAP = (
    "import runpy, sys; del sys.path[0]; mode, target = sys.argv[1:3]; del sys.argv[1:3]\n"
    "if mode == '-m':\n    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    "else:\n    sys.argv[0] = '-c'; exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})"
)


def python_command(mode: str, target: str, *args: str, safe_path_flag: bool | None = None) -> list[str]:
    """The argv of a child ``python -m MODULE`` or ``python -c CODE`` that imports the installed packages.

    Plain ``python -m``/``-c`` put the working directory first on ``sys.path``, so a child started
    from a folder holding an ``agentgym/`` directory (the repository root, or the env image's
    ``WORKDIR /src``) would import that source tree instead of what is installed (and fail: the
    tree has no ``agentgym.envs``). The child gets ``-P`` (Python 3.11+) or, on 3.10, a bootstrap
    that removes that entry; ``PYTHONPATH``, user site-packages and the environment stay as they are.

    Args:
        mode: ``"-m"`` or ``"-c"``.
        target: the module name or the code.
        args: the child's arguments (its ``sys.argv[1:]``).
        safe_path_flag: use ``-P`` (default: when this Python has it).

    Raises:
        ValueError: ``mode`` is neither ``-m`` nor ``-c``.

    Example:
        >>> python_command("-m", "agentgym", "version", safe_path_flag=True)[1:]
        ['-P', '-m', 'agentgym', 'version']
    """
    if mode not in ("-m", "-c"):
        raise ValueError(f"mode must be '-m' or '-c', got {mode!r}")
    if safe_path_flag is None:
        safe_path_flag = sys.version_info >= (3, 11)
    if safe_path_flag:
        return [sys.executable, "-P", mode, target, *args]
    return [sys.executable, "-c", _SAFE_PATH_BOOTSTRAP, mode, target, *args]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    Another process could take it before the service binds it. A server started in this process
    avoids that race by binding a socket itself and handing it over (``uvicorn.Server.run(sockets=...)``).

    Example:
        >>> 1024 <= free_port() < 65536
        True
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _ended(runner: subprocess.Popen[Any] | threading.Thread | None) -> str | None:
    """How the process or thread running the service ended, or ``None`` while it runs."""
    if isinstance(runner, threading.Thread):
        return None if runner.is_alive() else "its thread ended"
    if runner is not None and runner.poll() is not None:
        return f"it exited with code {runner.returncode}"
    return None


def wait_healthy(url: str, runner: subprocess.Popen[Any] | threading.Thread | None = None, *,
                 timeout_s: float = 30.0, poll_s: float = 0.1) -> dict[str, Any]:
    """Poll ``GET {url}/health`` until it answers 200 with JSON; return that JSON.

    Args:
        url: the service root, e.g. ``"http://127.0.0.1:8000"``.
        runner: the process or thread running the service; when it ends first, waiting stops at once.
        timeout_s: how long to wait in all.
        poll_s: pause between polls.

    Returns:
        The body of the first healthy answer.

    Raises:
        RemoteEnvError: the runner ended first, or no healthy answer came within ``timeout_s``
            (the message names the last answer or error seen).
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        ended = _ended(runner)
        if ended is not None:
            raise RemoteEnvError(f"the service at {url} stopped before it was healthy: {ended}")
        try:
            response = httpx.get(f"{url}/health", timeout=min(1.0, timeout_s))
            if response.status_code == 200:
                return response.json()
            last = f"answered {response.status_code}"
        except ValueError:
            last = "answered 200 with a body that is not JSON"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise RemoteEnvError(f"the service at {url} was not healthy within {timeout_s:g} s "
                                 f"(last: {last})")
        time.sleep(poll_s)


def stop_service(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> int:
    """Stop a service process: SIGTERM, then SIGKILL if it is still running after ``timeout_s``.

    Returns:
        The process's exit code.
    """
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def start_service(command: Sequence[str], url: str, *, timeout_s: float = 30.0, **popen_kwargs: Any
                  ) -> subprocess.Popen[Any]:
    """Start ``command`` (a service serving ``url``) and return its process once it is healthy.

    The process gets ``PYTHONUNBUFFERED=1`` on top of this process's environment (``env=`` in
    ``popen_kwargs`` replaces the environment). Stop it with ``stop_service``.

    Raises:
        RemoteEnvError: it exited or was not healthy within ``timeout_s``; it is stopped first.
    """
    popen_kwargs.setdefault("env", {**os.environ, "PYTHONUNBUFFERED": "1"})
    process = subprocess.Popen(list(command), **popen_kwargs)
    try:
        wait_healthy(url, process, timeout_s=timeout_s)
    except BaseException:
        stop_service(process)
        raise
    return process
