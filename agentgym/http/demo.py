"""The foundation demo (``make serve-demo``): serve envs over HTTP on a free port and let their experts
play them.

It runs what a user would type: ``agentgym serve ENV...`` as one process, then, once the service is
healthy, ``agentgym play ENV --url URL --expert --seed N`` for each env.
"""

from __future__ import annotations

import subprocess
import sys

from rich.console import Console

from agentgym.service_kit.launcher import free_port, python_command, start_service, stop_service

console = Console()


def main(env_ids: tuple[str, ...] = ("maze-v0", "sokoban-v0"), seed: int = 0) -> int:
    """Serve ``env_ids``, play each with its expert through the service, stop the service.

    Returns:
        0 when every play command succeeded, else the first failing one's exit code.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    agentgym = python_command("-m", "agentgym")
    console.print(f"[bold]$ agentgym serve {' '.join(env_ids)} --port {port}[/]")
    service = start_service([*agentgym, "serve", *env_ids, "--port", str(port)], url)
    try:
        for env_id in env_ids:
            console.rule(f"[bold cyan]{env_id}[/] over HTTP at {url}, the expert playing, seed {seed}")
            console.print(f"[bold]$ agentgym play {env_id} --url {url} --expert --seed {seed}[/]")
            played = subprocess.run([*agentgym, "play", env_id, "--url", url, "--expert", "--seed",
                                     str(seed)], check=False)
            if played.returncode != 0:
                return played.returncode
        console.print(
            "\nTry it yourself: [bold]agentgym serve maze-v0[/] then\n"
            "  curl -s -X POST http://127.0.0.1:8000/sessions -H 'content-type: application/json' "
            "-d '{\"env_id\": \"maze-v0\"}'"
        )
    finally:
        stop_service(service)
    return 0


if __name__ == "__main__":
    sys.exit(main())
