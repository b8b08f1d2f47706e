"""The foundation demo: serve an env over HTTP on a free port and let its expert play it remotely."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx

from agentgym.cli.app import console
from agentgym.cli.envs import _play
from agentgym.http.client import RemoteEnv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Poll ``/health`` until the service answers; raise if it exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited with code {process.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the service at {url} did not become healthy within {timeout_s:g} s")


def main(env_ids: tuple[str, ...] = ("maze-v0", "sokoban-v0"), seed: int = 0) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agentgym", "serve", *env_ids, "--port", str(port)]
    console.print(f"[bold]$ agentgym serve {' '.join(env_ids)} --port {port}[/]")
    process = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(url, process)
        for env_id in env_ids:
            console.rule(f"[bold cyan]{env_id}[/] over HTTP at {url}, the expert playing, seed {seed}")
            _play(RemoteEnv(env_id, base_url=url), seed, expert=True)
        console.print(
            f"\nTry it yourself: [bold]agentgym serve maze-v0[/] then\n"
            f"  curl -s -X POST {url.rsplit(':', 1)[0]}:8000/sessions -H 'content-type: application/json' "
            "-d '{\"env_id\": \"maze-v0\"}'"
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


if __name__ == "__main__":
    main()
