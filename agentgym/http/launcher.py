"""Starting a local service and knowing when it answers: ``free_port``, ``wait_healthy``, ``start_service``, ``stop_service``.

Every agentgym service (env, sandbox, retrieval) answers ``GET /health`` with 200 and a JSON body
once it is ready. ``make serve-demo``, the tests that start real servers and the benchmarks use
these helpers to start one on 127.0.0.1 and wait for it, bounded in time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from agentgym.errors import RemoteEnvError


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
            raise RemoteEnvError(f"the service at {url} was not healthy within {timeout_s:g} s (last: {last})")
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
